"""The embedded tiny vision-language models: a Qwen2.5-VL (or Qwen3-VL) built offline from a spec.

A spec (``assets/vlm/qwen2_5_vl_tiny.json``) has three sections:

- ``tokenizer``: a byte-level BPE trained here with ``tokenizers`` on a small corpus from
  ``assets/`` (``vocab_size`` ids, Qwen's special and vision tokens, the Qwen2-VL chat template);
- ``image_processor``: ``Qwen2VLImageProcessor`` settings with small pixel budgets
  (``min_pixels`` / ``max_pixels``, patch and merge sizes);
- ``model``: a transformers config (``model_type`` ``qwen2_5_vl`` / ``qwen3_vl`` / ``qwen2_vl``
  with ``text_config`` and ``vision_config``); vocabulary and special-token ids are filled in
  from the tokenizer.

Everything is assembled into the model type's real processor class (``Qwen2_5_VLProcessor``, ...)
and saved with ``save_pretrained``, so the folder reloads offline with ``AutoProcessor`` and
``AutoModelForImageTextToText``. Weights are deterministic in the seed; they come from our own
SFT, never a download.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForImageTextToText, PreTrainedTokenizerFast, Qwen2VLImageProcessor

from mmrl.core.config import ConfigError
from mmrl.core.paths import resolve_asset

# model_type → (processor class, video processor class), both in transformers.
PROCESSORS = {
    "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
}
SPEC_SECTIONS = ("tokenizer", "image_processor", "model")


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read and check a tiny-VLM spec (see the module docstring)."""
    file = resolve_asset(str(path))
    try:
        spec = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{file} is not valid JSON: {err}") from None
    missing = [s for s in SPEC_SECTIONS if s not in spec]
    if missing:
        raise ConfigError(f"{file} is not a tiny-VLM spec: missing section(s) {missing} (needs {SPEC_SECTIONS})")
    model_type = spec["model"].get("model_type")
    if model_type not in PROCESSORS:
        raise ConfigError(f"{file}: model.model_type must be one of {sorted(PROCESSORS)}, got {model_type!r}")
    return spec


def train_tokenizer(spec: dict[str, Any]) -> PreTrainedTokenizerFast:
    """A byte-level BPE over the spec's corpus; special tokens get the first ids, in order."""
    tok_spec = spec["tokenizer"]
    corpus = resolve_asset(tok_spec["corpus"]).read_text().splitlines()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=tok_spec["vocab_size"], special_tokens=list(tok_spec["special_tokens"]),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer)  # deterministic: no randomness in BPE training
    special = list(tok_spec["special_tokens"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=tok_spec["pad_token"], eos_token=tok_spec["eos_token"],
        additional_special_tokens=[t for t in special if t not in (tok_spec["pad_token"], tok_spec["eos_token"])],
        padding_side="left", clean_up_tokenization_spaces=False)
    fast.chat_template = resolve_asset(tok_spec["chat_template"]).read_text()
    return fast


def build_processor(spec: dict[str, Any]):
    """The model type's processor: trained tokenizer + ``Qwen2VLImageProcessor`` with the spec's
    pixel budgets + the matching video processor (required by the processor class; same budgets)."""
    import transformers

    ip = spec["image_processor"]
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": ip["min_pixels"], "longest_edge": ip["max_pixels"]},
        patch_size=ip["patch_size"], merge_size=ip["merge_size"], temporal_patch_size=ip["temporal_patch_size"])
    processor_name, video_name = PROCESSORS[spec["model"]["model_type"]]
    # Video frames get the images' pixel budget (the checkpoint default, ~100 k pixels a frame, is far
    # beyond a tiny model's context).
    video_processor = getattr(transformers, video_name)(
        size={"shortest_edge": ip["min_pixels"], "longest_edge": ip["max_pixels"]},
        patch_size=ip["patch_size"], merge_size=ip["merge_size"], temporal_patch_size=ip["temporal_patch_size"])
    tokenizer = train_tokenizer(spec)
    return getattr(transformers, processor_name)(image_processor=image_processor, tokenizer=tokenizer,
                                                 video_processor=video_processor,
                                                 chat_template=tokenizer.chat_template)


def model_config(spec: dict[str, Any], tokenizer: PreTrainedTokenizerFast):
    """The transformers config of the spec, with vocabulary and special ids from ``tokenizer``."""
    data = json.loads(json.dumps(spec["model"]))  # a deep copy
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    text = data.setdefault("text_config", {})
    text.update(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.pad_token_id)
    data.update(ids)
    model_type = data.pop("model_type")
    return AutoConfig.for_model(model_type, **data)


def build_tiny_vlm(spec_path: str | Path, seed: int, dtype: torch.dtype = torch.float32):
    """``(model, processor)`` from a spec, the weights drawn from ``seed`` (global RNG untouched)."""
    spec = load_spec(spec_path)
    processor = build_processor(spec)
    config = model_config(spec, processor.tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    return model, processor


def init_model(spec_path: str | Path, out: str | Path, seed: int) -> Path:
    """``mmrl init-model``: build the spec's model with ``seed`` and ``save_pretrained`` it with its
    processor into ``out`` (a new or empty folder)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already holds files; choose a new folder")
    model, processor = build_tiny_vlm(spec_path, seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
