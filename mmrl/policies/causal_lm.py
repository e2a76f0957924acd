"""A policy over any Hugging Face causal LM: sampling with ``generate``, re-scoring with gradients.

Loads a local checkpoint folder (``pretrained``) or builds a model from a transformers config JSON
and a character tokenizer (the embedded defaults). Examples must have a ``prompt: str``; outputs
are the decoded completion strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig,
                          LogitsProcessorList, PreTrainedTokenizerFast)

from mmrl.core.contracts import Policy, PolicyOutput, answer_prefix_of, turns_of
from mmrl.core.paths import resolve_asset
from mmrl.policies.lora import add_lora, load_lora_weights
from mmrl.policies.tokens import (BehaviourLogprobs, TokenPayload, completion_mask_from_eos, positions_from_mask,
                                  tempered_log_softmax, token_logprobs)
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.samplers.tokens import LogitsGuide, VisionPrompts

PAD, EOS = "<pad>", "<eos>"

VALUE_HEAD_FILE = "value_head.safetensors"


@dataclass(frozen=True)
class CausalLMConfig:
    pretrained: str | None = None
    """A local HF model folder (config, weights, tokenizer). Excludes model_config/tokenizer_chars."""
    model_config: str | None = None
    """A transformers config JSON (path, relative to the repo root or absolute) for a fresh model."""
    tokenizer_chars: str | None = None
    """With model_config: a character-level tokenizer over these characters (+ <pad>, <eos>)."""
    init_seed: int = 0
    """Seed of a fresh model's initial weights."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    value_head: bool = False
    """Add a linear critic on the last hidden state (PPO with GAE); saved as value_head.safetensors."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (large models); the same gradients, with or without LoRA."""
    lora_rank: int = 0
    """> 0: train LoRA adapters (peft) of this rank instead of all weights (Hu et al. 2021); the
    base with adapters disabled can then serve as the reference (trainer.ref_model: adapter_disabled)."""
    lora_alpha: float = 16.0
    """LoRA scaling α (the update is scaled by α / rank)."""
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Module names that get adapters (Qwen / Llama attention projections by default)."""


def prompt_text(example: Any) -> str:
    """The text the model continues: the prompt, any earlier turns (:class:`FollowUp`) in order, and any text
    already written at the start of the answer (:class:`Prefixed`)."""
    return example.prompt + "".join(text for _, text in turns_of(example)) + answer_prefix_of(example)


def char_tokenizer(chars: str) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one id per character, ``<pad>`` = 0, ``<eos>`` = 1."""
    if len(set(chars)) != len(chars):
        raise ValueError(f"tokenizer_chars has repeated characters: {chars!r}")
    vocab = {PAD: 0, EOS: 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    # [\s\S], not ".": "." skips newlines, so a run of them ("\n\n", e.g. an answer ending in a newline before a
    # turn that starts with one) would be one unknown piece and fail to encode.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left")


def load_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """The tokenizer a folder declares. ``AutoTokenizer`` swaps a declared generic fast tokenizer
    for the model type's own class (Qwen2Tokenizer adds ``<|endoftext|>``, growing a character
    vocabulary past the embedding), so a generic declaration is loaded as such."""
    config_file = path / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


class CausalLMPolicy(Policy):
    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, value_head: bool = False):
        super().__init__()
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token")
        rows = model.get_input_embeddings().num_embeddings
        if len(tokenizer) > rows:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model embeds only {rows}")
        self.model = model
        self.tokenizer = tokenizer
        tokenizer.padding_side = "left"
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = sorted({tokenizer.eos_token_id})
        # Never sample special tokens other than EOS (a sampled pad / image token corrupts
        # re-scoring); the same ids are removed from the distribution when scoring.
        special = set(tokenizer.all_special_ids) - set(self.eos_ids)
        self.register_buffer("suppressed", torch.tensor(sorted(special), dtype=torch.long), persistent=False)
        # An explicit neutral generation config: a checkpoint's generation_config.json (top_k,
        # repetition penalty, ...) would otherwise change the sampling distribution silently.
        self.model.generation_config = GenerationConfig(
            pad_token_id=self.pad_id, eos_token_id=self.eos_ids, bos_token_id=tokenizer.bos_token_id)
        self.lora = False
        self.logits_guides: tuple[LogitsGuide, ...] = ()
        """Processors applied to the raw logits of every ``rollout``, in order, before the sampling distribution
        is formed (empty: the model's own logits)."""
        self.value_head = None
        if value_head:
            # V(s_t) from the hidden state that predicts token t; zero-initialised so the critic
            # starts neutral instead of with random values.
            self.value_head = torch.nn.Linear(model.config.get_text_config().hidden_size, 1)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: CausalLMConfig) -> CausalLMPolicy:
        dtype = getattr(torch, cfg.dtype)
        if cfg.pretrained is not None:
            if cfg.model_config or cfg.tokenizer_chars:
                raise ValueError("policy.args: give either pretrained or model_config + tokenizer_chars")
            policy = cls.from_pretrained(cfg.pretrained, dtype=dtype, value_head=cfg.value_head)
        elif not (cfg.model_config and cfg.tokenizer_chars):
            raise ValueError("policy.args needs pretrained, or both model_config and tokenizer_chars")
        else:
            config, tokenizer = spec_config(cfg.model_config, cfg.tokenizer_chars)
            with torch.random.fork_rng():
                torch.manual_seed(cfg.init_seed)
                policy = cls(AutoModelForCausalLM.from_config(config, dtype=dtype), tokenizer,
                             value_head=cfg.value_head)
        if cfg.gradient_checkpointing:  # before LoRA, as in the VLM policy: peft then makes the frozen
            policy.model.gradient_checkpointing_enable()  # embeddings' output require grad for the adapters
        if cfg.lora_rank > 0:
            policy.add_lora(cfg)
        return policy

    def add_lora(self, cfg: CausalLMConfig) -> None:
        """Freeze the base weights and train LoRA adapters (zero-initialised B: the policy is unchanged)."""
        self.model = add_lora(self.model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules,
                              cfg.init_seed)
        self.lora = True

    def adapter_disabled(self):
        if not self.lora:
            return super().adapter_disabled()
        return self.model.disable_adapter()

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32,
                        value_head: bool = False) -> CausalLMPolicy:
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
        policy = cls(AutoModelForCausalLM.from_pretrained(path, dtype=dtype), load_tokenizer(path),
                     value_head=value_head)
        if value_head and (path / VALUE_HEAD_FILE).is_file():
            policy.value_head.load_state_dict(load_file(path / VALUE_HEAD_FILE))
        return policy

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.value_head is not None:
            save_file(self.value_head.state_dict(), Path(path) / VALUE_HEAD_FILE)

    def load_weights(self, path: str) -> None:
        if self.lora:  # the folder holds a peft adapter
            load_lora_weights(self.model, path)
        else:
            loaded = type(self.model).from_pretrained(path, dtype=next(self.model.parameters()).dtype)
            self.model.load_state_dict(loaded.state_dict())
        if self.value_head is not None and (Path(path) / VALUE_HEAD_FILE).is_file():
            self.value_head.load_state_dict(load_file(Path(path) / VALUE_HEAD_FILE))

    # -- sampling --------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(list(prompts), padding=True, return_tensors="pt", add_special_tokens=False)
        device = self.suppressed.device
        return enc["input_ids"].to(device), enc["attention_mask"].to(device)

    @torch.no_grad()
    def rollout(self, examples: Sequence[Any], group_size: int, sampling: SamplingParams, seed: int) -> Rollout:
        prompts = [prompt_text(ex) for ex in examples for _ in range(group_size)]
        prompt_ids, prompt_mask = self._encode_prompts(prompts)
        greedy = sampling.temperature == 0
        was_training = self.model.training
        self.model.eval()
        device = self.suppressed.device
        # generate draws from the global RNG (CUDA's on a GPU): fork it, seed it, restore it.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            # The one processor applies temperature, suppressed ids and top-p, and records each sampled token's
            # log-prob step by step (the HF sampler's: no [N, T, V] stack of every step's logits).
            behaviour = BehaviourLogprobs(sampling.temperature, sampling.top_p, self.suppressed)
            # Guides read each distinct prompt once (rows r·G … r·G + G − 1 repeat prompt r, padded alike).
            distinct = VisionPrompts.text_only(prompt_ids[::group_size], prompt_mask[::group_size], self.pad_id)
            guides = [guide(distinct, group_size) for guide in self.logits_guides]
            out = self.model.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=not greedy,
                **({} if greedy else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}),
                max_new_tokens=sampling.max_new_tokens, logits_processor=LogitsProcessorList([*guides, behaviour]),
                return_dict_in_generate=True)
        self.model.train(was_training)
        completion_ids = out.sequences[:, prompt_ids.shape[1]:]
        completion_mask = completion_mask_from_eos(completion_ids, self.eos_ids)
        logp = behaviour.finish(completion_ids[:, -1])
        logp = torch.where(completion_mask > 0, logp, torch.zeros_like(logp))
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.pad_id)
        temperature = torch.full((len(prompts),), sampling.temperature, dtype=torch.float32)  # [N]
        mask = completion_mask.float()
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        example_index = torch.arange(len(examples)).repeat_interleave(group_size)
        payload = TokenPayload(prompt_ids.cpu(), prompt_mask.cpu(), completion_ids.cpu(), completion_mask.cpu(),
                               temperature, self.pad_id)
        values = self.score(payload).values if self.value_head is not None else None
        return Rollout(logp=(logp * mask).cpu(), mask=mask.cpu(), group_id=example_index.clone(),
                       example_index=example_index, outputs=texts, payload=payload,
                       policy_version=self.version, values=None if values is None else values.cpu())

    # -- scoring ---------------------------------------------------------------------------------
    def run_model(self, payload: TokenPayload, hidden_states: bool = False) -> tuple[Any, slice]:
        """The model over every row's prompt + completion, and the positions that predict the completion
        (position i predicts token i + 1: the completion is predicted from positions P−1 .. P+T−2)."""
        device = self.suppressed.device
        input_ids = torch.cat([payload.prompt_ids, payload.completion_ids], 1).to(device)
        attention = torch.cat([payload.prompt_mask, payload.completion_mask], 1).to(device)
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions_from_mask(attention),
                         output_hidden_states=hidden_states)
        return out, slice(payload.prompt_ids.shape[1] - 1, input_ids.shape[1] - 1)

    def score(self, payload: TokenPayload, with_entropy: bool = False) -> PolicyOutput:
        device = self.suppressed.device
        out, predicting = self.run_model(payload, hidden_states=self.value_head is not None)
        mask = payload.completion_mask.to(device).float()
        logp, entropy = token_logprobs(out.logits[:, predicting], payload.completion_ids.to(device),
                                       payload.temperature, self.suppressed, mask, with_entropy)
        values = None
        if self.value_head is not None:
            values = self.value_head(out.hidden_states[-1][:, predicting].float()).squeeze(-1) * mask
        return PolicyOutput(logp=logp * mask, entropy=None if entropy is None else entropy * mask, values=values)

    def forward(self, rollout: Rollout, with_entropy: bool = False) -> PolicyOutput:
        return self.score(rollout.payload, with_entropy)

    @torch.no_grad()
    def rollout_from_outputs(self, examples: Sequence[Any], outputs: Sequence[str],
                             sampling: SamplingParams) -> Rollout:
        """Rows for given completions (each followed by EOS, as sampled ones end), scored as ``forward`` scores."""
        payload = self.given_payload(examples, outputs, sampling.temperature)
        was_training = self.model.training
        self.model.eval()
        out = self.score(payload)
        self.model.train(was_training)
        mask = payload.completion_mask.float()
        index = torch.arange(len(examples))
        return Rollout(logp=out.logp.cpu() * mask, mask=mask, group_id=index.clone(), example_index=index,
                       outputs=list(outputs), payload=payload, policy_version=self.version,
                       values=None if out.values is None else out.values.cpu())

    def given_payload(self, examples: Sequence[Any], outputs: Sequence[str], temperature: float) -> TokenPayload:
        """``outputs[i]`` + EOS as the completion of ``examples[i]``'s prompt, scored at ``temperature``."""
        if len(examples) != len(outputs):
            raise ValueError(f"{len(examples)} examples for {len(outputs)} outputs")
        prompt_ids, prompt_mask = self._encode_prompts([prompt_text(ex) for ex in examples])
        enc = self.tokenizer([o + self.tokenizer.eos_token for o in outputs], padding=True, padding_side="right",
                             return_tensors="pt", add_special_tokens=False)
        return TokenPayload(prompt_ids.cpu(), prompt_mask.cpu(), enc["input_ids"], enc["attention_mask"],
                            torch.full((len(examples),), temperature, dtype=torch.float32), self.pad_id)

    def completion_log_distributions(self, examples: Sequence[Any], outputs: Sequence[str],
                                     temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        payload = self.given_payload(examples, outputs, temperature)
        out, predicting = self.run_model(payload)
        mask = payload.completion_mask.to(self.suppressed.device).float()
        return tempered_log_softmax(out.logits[:, predicting], temperature, self.suppressed), mask

    @torch.no_grad()
    def completion_features(self, examples: Sequence[Any], outputs: Sequence[str]) -> torch.Tensor:
        payload = self.given_payload(examples, outputs, 1.0)
        out, _ = self.run_model(payload, hidden_states=True)
        states = out.hidden_states[-1][:, payload.prompt_ids.shape[1]:].float()  # [n, T, D]: after each output token
        mask = payload.completion_mask.to(states.device).float()[..., None]
        return (states * mask).sum(1) / mask.sum(1).clamp(min=1)

    def sft_loss(self, examples: Sequence[Any], targets: Sequence[str]) -> torch.Tensor:
        payload = self.given_payload(examples, targets, 1.0)
        out = self.score(payload)
        mask = payload.completion_mask.float().to(out.logp.device)
        return -(out.logp * mask).sum() / mask.sum()


def spec_config(model_config: str, tokenizer_chars: str) -> tuple[Any, Any]:
    """The transformers config of a spec-built model (an assets/ JSON) and its character tokenizer, the
    config's vocabulary and special ids set from the tokenizer."""
    tokenizer = char_tokenizer(tokenizer_chars)
    data = json.loads(resolve_asset(model_config).read_text())
    data.update(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.eos_token_id)
    return AutoConfig.for_model(**data), tokenizer
