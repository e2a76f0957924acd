"""LoRA adapters (peft) shared by the text and vision-language policies, and merge-and-export.

LoRA (Hu et al. 2021, eq. 3): W x + (α / r)·B A x with A, B trainable, B zero-initialised, so the
policy is unchanged when adapters are added, and "adapters disabled" is the base model: the KL
reference without a second copy in memory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FOLDER = "base"  # a LoRA policy folder keeps its base here when the base has no folder of its own


def add_lora(model: torch.nn.Module, rank: int, alpha: float, dropout: float, target_modules: Sequence[str],
             seed: int) -> torch.nn.Module:
    """Freeze ``model`` and wrap it with LoRA adapters on ``target_modules`` (A drawn from ``seed``)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                      task_type="CAUSAL_LM")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return get_peft_model(model, lora)


def load_lora_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load the adapter weights a peft ``save_pretrained`` wrote to ``path`` into ``model``."""
    from peft import set_peft_model_state_dict

    file = Path(path) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise FileNotFoundError(f"{path} holds no LoRA adapter ({ADAPTER_WEIGHTS}); was it saved by a LoRA policy?")
    set_peft_model_state_dict(model, load_file(file))


def merge_and_export(policy_dir: str | Path, out: str | Path) -> Path:
    """``mmrl export``: a plain Hugging Face checkpoint from a saved policy folder.

    A LoRA folder (``adapter_config.json``) is merged into its base (``policy_dir/base`` when the
    policy saved one, else the adapter's ``base_model_name_or_path``); a full folder is copied. The
    processor / tokenizer files travel along, so ``AutoProcessor`` and ``AutoModelFor...`` load
    ``out`` without mmrl or peft.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    src, out = Path(policy_dir), Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already holds files; choose a new folder")
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a folder (expected a saved policy, e.g. RUN/checkpoints/step_N/policy)")
    is_vlm = (src / "processor_config.json").is_file() or (src / "preprocessor_config.json").is_file()
    auto = AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM
    if (src / ADAPTER_CONFIG).is_file():
        from peft import PeftModel

        base = src / BASE_FOLDER
        if not (base / "config.json").is_file():
            base = Path(json.loads((src / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] or "")
            if not (base / "config.json").is_file():
                raise FileNotFoundError(f"{src}: the LoRA adapter's base model folder {str(base)!r} has no config.json")
        model = PeftModel.from_pretrained(auto.from_pretrained(base), src).merge_and_unload()
    elif (src / "config.json").is_file():
        model = auto.from_pretrained(src)
    else:
        raise FileNotFoundError(f"{src} holds neither a model (config.json) nor a LoRA adapter ({ADAPTER_CONFIG})")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for item in src.iterdir():  # processor, tokenizer, chat template
        if item.is_file() and (item.name.startswith(("tokenizer", "processor", "preprocessor", "video_preprocessor",
                                                     "special_tokens", "chat_template", "vocab", "merges"))):
            shutil.copy2(item, out / item.name)
    return out
