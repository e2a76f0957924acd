"""``mmrl plan RECIPE``: GPU memory per process of a recipe, from its model's config alone (docs/memory_plan.md).

The model is built on the meta device (:mod:`mmrl.experiments.meta_model`): parameter counts are exact.
Memory is split into what lives through the whole run and what one phase of a step adds:

- **persistent**: weights (``policy.args.dtype``), the frozen reference copy (``trainer.ref_model: copy``: a
  deep copy of the policy that accelerate never wraps, so never sharded), AdamW's two moments per trainable
  parameter. mmrl keeps no separate fp32 master copy: accelerate's ``mixed_precision`` is autocast over the
  parameters as loaded, and torch's AdamW keeps its moments in the parameters' dtype. DeepSpeed is the
  exception: it casts the model to bf16 / fp16 and keeps fp32 masters and moments (ZeRO's 2 + 2 + 12 bytes
  per parameter, Rajbhandari et al. 2020, §3.1).
- **update** (one micro-batch of ``trainer.micro_batch_size`` rows, completions of ``rollout.max_new_tokens``
  tokens): gradients (allocated at the first backward, freed at each optimizer step), the activations saved
  for backward (:func:`decoder_query_bytes`, :func:`attention_key_bytes`, :func:`vision_block_bytes`, the
  log-softmax over the vocabulary), and transient buffers (the raw logits, the group-expanded KV cache, one
  recomputed layer under gradient checkpointing, layers gathered by FSDP / ZeRO-3). The VLM policy scores
  with each prompt shared by its group (:mod:`mmrl.policies.shared_prefix`): a micro-batch's U distinct
  prompts run once (U rows × P tokens, the vision tower on their images) and its N rows run only their
  completions (N × T tokens, attending to their prompt's cache); with gradient checkpointing, a causal LM, or
  one row per prompt, every row runs prompt + completion (N × (P + T) tokens, :func:`update_passes`).
- **generation** (the HF sampler, ``generation_batch_rows`` rows at a time, all rows when 0): the KV cache of
  every row's prompt + completion, and one step's logits: the sampler's logits processor keeps one step's
  tempered logits, never every step's (:data:`GENERATION_LOGIT_COPIES`).

Sharding comes from the accelerate config: DDP shards nothing; FSDP FULL_SHARD (FSDP2
``reshard_after_forward: true``) shards weights, gradients and optimizer state, SHARD_GRAD_OP gradients and
optimizer state; ZeRO-1 / 2 / 3 shard the optimizer state / + gradients / + weights; each sharded term is
divided by the number of processes. The peak is persistent + the larger phase.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from mmrl.core.config import ConfigError, TrainConfig
from mmrl.experiments.meta_model import FULL, Architecture, PlannedModel, RowShape, TrainableParts, VisionArchitecture

GIB = 2 ** 30
LOGSOFTMAX_BYTES = 3 * 4 + 1
"""Saved per (row, completion token, vocabulary id) by :func:`mmrl.policies.tokens.token_logprobs` with entropy
(the trainer's update asks for it): the log-softmax, its exp and the masked log-probs in float32, and one bool."""
GENERATION_LOGIT_COPIES = 4
"""float32 [rows, V] tensors alive at once in one sampling step of ``generate`` (the HF sampler's
:class:`~mmrl.samplers.hf_generate.BehaviourLogprobs`): generate's float32 copy of the step's logits, the
previous step's tempered logits (kept to score the token sampled from them), the new tempered logits, and the
``exp(x − max)`` temporary of their log-normaliser (later generate's softmax probabilities, as many)."""
GENERATION_TOP_P_COPIES = 7
"""The same with ``top_p`` < 1, inside the top-p warper: generate's copy, the tempered logits, the warper's
clone, the sorted values, the sort indices (int64: two float32's worth), the softmax and its cumulative sum."""


@dataclass(frozen=True)
class Parallelism:
    """How the accelerate config places the model (the terms each backend shards)."""

    name: str
    processes: int
    mixed_precision: Literal["no", "bf16", "fp16"]
    shard_weights: bool
    shard_gradients: bool
    shard_optimizer: bool
    deepspeed: bool


SINGLE = Parallelism("single process", 1, "no", False, False, False, False)


def read_accelerate_config(path: str | Path | None, num_processes: int | None = None) -> Parallelism:
    """The :class:`Parallelism` of an accelerate config YAML (None: one process); ``num_processes`` overrides
    the file's count."""
    if path is None:
        return dataclasses.replace(SINGLE, processes=num_processes or 1)
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"accelerate config {path} not found")
    data = yaml.safe_load(file.read_text()) or {}
    kind = str(data.get("distributed_type", "NO"))
    processes = num_processes or int(data.get("num_processes", 1))
    precision = str(data.get("mixed_precision", "no"))
    if precision not in ("no", "bf16", "fp16"):
        raise ConfigError(f"{file}: mixed_precision must be no, bf16 or fp16, got {precision!r}")
    if kind in ("NO", "MULTI_GPU", "MULTI_CPU"):
        name = "single process" if processes == 1 else "DDP"
        return Parallelism(name, processes, precision, False, False, False, False)
    if kind == "FSDP":
        fsdp = data.get("fsdp_config") or {}
        if int(fsdp.get("fsdp_version", 1)) >= 2:
            strategy = "FULL_SHARD" if fsdp.get("fsdp_reshard_after_forward", True) else "SHARD_GRAD_OP"
        else:
            strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).upper().removeprefix("1").strip()
        if strategy not in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"):
            raise ConfigError(f"{file}: fsdp_config.fsdp_sharding_strategy {strategy!r} is not one the planner knows "
                              f"(FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD)")
        states = strategy != "NO_SHARD"
        return Parallelism(f"FSDP {strategy}", processes, precision, strategy in ("FULL_SHARD", "HYBRID_SHARD"),
                           states, states, False)
    if kind == "DEEPSPEED":
        stage = int((data.get("deepspeed_config") or {}).get("zero_stage", 0))
        if stage not in (0, 1, 2, 3):
            raise ConfigError(f"{file}: deepspeed_config.zero_stage must be 0..3, got {stage}")
        return Parallelism(f"DeepSpeed ZeRO-{stage}", processes, precision, stage >= 3, stage >= 2, stage >= 1, True)
    raise ConfigError(f"{file}: distributed_type {kind!r} is not one the planner knows (NO, MULTI_GPU, FSDP, DEEPSPEED)")


# ------------------------------------------------------------------------------------------------
# Activations saved for backward, per computed token and per key position read (derived from the transformers
# modules; measured in tests/test_memory_plan.py against torch.autograd.graph.saved_tensors_hooks).


@dataclass(frozen=True)
class Precision:
    """Bytes per element of the tensors an update step saves."""

    compute: int
    """Matmul, attention and MLP outputs: 2 under bf16 / fp16 (autocast or a bf16 model), else 4."""
    stored: int
    """The residual stream and the model's own float tensors: the parameters' dtype."""

    @property
    def norm(self) -> int:
        """One RMSNorm (Qwen2RMSNorm upcasts): its input in float32, the normalised value in the stored dtype
        (the multiply by the weight saves it), its output as the next matmul reads it."""
        return 4 + self.stored + self.compute


def precision_of(param_dtype: str, mixed_precision: str) -> Precision:
    stored = 4 if param_dtype == "float32" else 2
    return Precision(compute=2 if mixed_precision != "no" or stored == 2 else 4, stored=stored)


def norm_bytes(p: Precision, weight_trains: bool, output_read: bool) -> int:
    """Bytes per element one RMSNorm saves (Qwen2RMSNorm upcasts): its input in float32 (for the square), the
    normalised value in the stored dtype only when its weight trains, its output only when a trainable matmul
    reads it (a frozen matmul needs its weight, not its input, for the input's gradient)."""
    return 4 + (p.stored if weight_trains else 0) + (p.compute if output_read else 0)


def attention_key_bytes(arch: Architecture, p: Precision, attention: str) -> int:
    """Bytes one decoder layer saves per key position a row attends to: the keys and values as the attention
    kernel reads them. sdpa and eager repeat the grouped key / value heads to all query heads when a mask is
    passed (mmrl's padded rows always pass one: the planned worst case); flash-attention reads the grouped heads.
    A completion scored after its shared prompt attends to the prompt's cached positions too."""
    repeat = attention in ("sdpa", "eager") and arch.kv_heads != arch.heads
    return p.compute * 2 * (arch.heads if repeat else arch.kv_heads) * arch.head_dim


def decoder_query_bytes(arch: Architecture, p: Precision, attention: str, keys: int,
                        parts: TrainableParts = FULL) -> int:
    """Bytes one decoder layer saves per token it computes (a query), apart from the keys and values the kernel
    reads (:func:`attention_key_bytes`): two RMSNorms (:func:`norm_bytes`) and their 1/rms; the queries, the
    kernel's output and its log-sum-exp per head; eager attention also keeps the probabilities (heads × ``keys``)
    and, for a trainable output projection, a contiguous copy of the output; the SwiGLU MLP's gate, up,
    SiLU(gate), and the product when the down projection trains; LoRA's rank-r intermediates; Qwen3's query / key
    norms (float32 input and normalised value)."""
    h, a, kv, d = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim
    trains = set(parts.linears)
    compute = 2 * a * d + (3 + ("down_proj" in trains)) * arch.intermediate + parts.adapter_rank * len(trains)
    if attention == "eager":
        compute += a * keys + (a * d if "o_proj" in trains else 0)
    extra = (4 + p.stored) * (a + kv) * d if arch.qk_norm else 0
    norms = (norm_bytes(p, parts.norms, bool(trains & {"q_proj", "k_proj", "v_proj"}))
             + norm_bytes(p, parts.norms, bool(trains & {"gate_proj", "up_proj"}))) * h
    return norms + 4 * (2 + a) + p.compute * compute + extra


def decoder_layer_bytes(arch: Architecture, p: Precision, attention: str, seq: int,
                        parts: TrainableParts = FULL) -> int:
    """Bytes one decoder layer saves per token of a forward over whole rows of ``seq`` tokens (each token is a
    query and a key position): :func:`decoder_query_bytes` + :func:`attention_key_bytes`."""
    return decoder_query_bytes(arch, p, attention, seq, parts) + attention_key_bytes(arch, p, attention)


def vision_block_bytes(v: VisionArchitecture, p: Precision) -> int:
    """Bytes one vision block saves per patch: two norms (RMSNorm as in :func:`decoder_layer_bytes` for
    Qwen2.5-VL; LayerNorm keeps its input and output), the fused qkv output (rotated q and k, v), the attention
    output and the projection's input, the log-sum-exp per head, and the MLP (gated: gate, up, SiLU, product;
    plain: fc1 output and its activation)."""
    norms = 2 * (p.norm * v.hidden + 4) if v.gated_rms else 2 * ((p.stored + p.compute) * v.hidden + 8)
    mlp = (4 if v.gated_rms else 2) * v.intermediate
    return norms + p.compute * (5 * v.hidden + mlp) + 4 * v.heads


def vision_once_bytes(v: VisionArchitecture, p: Precision) -> int:
    """Bytes per patch saved outside the blocks: the pixel patch (the patch embedding's input), the rotary
    tables, the merger's norm and its MLP (two activations of 4 × hidden per 4 patches)."""
    norm = p.norm * v.hidden if v.gated_rms else (p.stored + p.compute) * v.hidden
    return p.stored * v.patch_inputs + 2 * 4 * (v.hidden // v.heads) + norm + p.compute * 2 * v.hidden


@dataclass(frozen=True)
class Term:
    """One line of the plan: bytes per GPU, the phase it belongs to, and how it was computed."""

    name: str
    phase: Literal["persistent", "update", "generation"]
    bytes: int
    how: str


@dataclass(frozen=True)
class Workload:
    """The sizes the per-step terms read."""

    update_rows: int
    """Rows of one update micro-batch on one process (N)."""
    update_prompts: int
    """Distinct prompts in one update micro-batch (U): the rows of a group share one. Only a shared prefix runs
    each once; otherwise every row runs its own copy."""
    shared_prefix: bool
    """Re-scoring runs each distinct prompt once and only the completions row by row
    (:mod:`mmrl.policies.shared_prefix`): the VLM policy with groups."""
    generation_rows: int
    """Rows one ``generate`` call samples at once on one process."""
    prompt_tokens: int
    completion_tokens: int
    patches_per_row: int
    """Image patches of one prompt."""
    gradient_checkpointing: bool
    attention: str
    top_p: float
    rows_source: str


@dataclass(frozen=True)
class MemoryPlan:
    recipe: str
    parallelism: Parallelism
    model: PlannedModel
    workload: Workload
    terms: tuple[Term, ...]
    gpu_gib: float

    def phase(self, name: str) -> int:
        return sum(t.bytes for t in self.terms if t.phase == name)

    @property
    def peak(self) -> int:
        """Persistent memory plus the larger of the two phases."""
        return self.phase("persistent") + max(self.phase("update"), self.phase("generation"))

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_gib * GIB

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data |= {"peak_bytes": self.peak, "fits": self.fits, "headroom_gib": self.gpu_gib - self.peak / GIB,
                 "phases": {name: self.phase(name) for name in ("persistent", "update", "generation")}}
        return data


def prompts_per_micro_batch(minibatch_rows: int, micro_rows: int, group_size: int) -> int:
    """The most distinct prompts one micro-batch holds. The trainer's minibatch is whole groups, each group's rows
    adjacent, cut into micro-batches of ``micro_rows`` rows: ⌈micro_rows / group_size⌉ prompts when a micro-batch
    holds whole groups, one more where it starts inside a group."""
    return max((min(start + micro_rows, minibatch_rows) - 1) // group_size - start // group_size + 1
               for start in range(0, minibatch_rows, micro_rows))


def workload_of(cfg: TrainConfig, parallel: Parallelism, rows: RowShape) -> Workload:
    """Update and generation rows on one process, from the recipe's batch settings."""
    r, t, args = cfg.rollout, cfg.trainer, cfg.policy.args
    process_rows = max(r.prompts_per_step // parallel.processes, 1) * r.group_size
    minibatch_rows = max(process_rows // t.minibatches, 1)
    micro_rows = min(t.micro_batch_size, minibatch_rows)
    generation = getattr(args, "generation_batch_rows", 0) or process_rows
    checkpointing = bool(getattr(args, "gradient_checkpointing", False))
    # VLMPolicy.score shares each prompt across its rows (mmrl.policies.shared_prefix.can_share) unless every row
    # has its own prompt, or checkpointing is on without share_prompts_under_checkpointing (then the prompt pass
    # runs plain and the completion pass checkpointed).
    shared = cfg.policy.name == "vlm" and r.group_size > 1 and (
        not checkpointing or bool(getattr(args, "share_prompts_under_checkpointing", False)))
    prompts = prompts_per_micro_batch(minibatch_rows, micro_rows, r.group_size)
    return Workload(update_rows=micro_rows, update_prompts=prompts, shared_prefix=shared,
                    generation_rows=min(generation, process_rows), prompt_tokens=rows.prompt_tokens,
                    completion_tokens=r.max_new_tokens, patches_per_row=rows.patches,
                    gradient_checkpointing=checkpointing, attention=getattr(args, "attn_implementation", "sdpa"),
                    top_p=r.top_p if r.temperature > 0 else 1.0, rows_source=rows.source)


def state_terms(model: PlannedModel, parallel: Parallelism, ref_model: str) -> list[Term]:
    """Weights, reference copy, gradients and AdamW moments per GPU."""
    c, n = model.counts, parallel.processes
    share = lambda sharded: n if sharded else 1  # noqa: E731
    if parallel.deepspeed and parallel.mixed_precision != "no":
        weights = Term("weights", "persistent", c.total * 2 // share(parallel.shard_weights),
                       f"{c.total:,} params in {parallel.mixed_precision} (DeepSpeed casts the model)"
                       + (f" / {n}" if parallel.shard_weights else ""))
        grads = Term("gradients", "update", c.trainable * 2 // share(parallel.shard_gradients),
                     f"{c.trainable:,} trainable × 2 bytes" + (f" / {n}" if parallel.shard_gradients else ""))
        optim = Term("optimizer (AdamW)", "persistent", c.trainable * 12 // share(parallel.shard_optimizer),
                     f"{c.trainable:,} trainable × (fp32 master + 2 fp32 moments)"
                     + (f" / {n}" if parallel.shard_optimizer else ""))
    else:
        weights = Term("weights", "persistent", c.total_bytes // share(parallel.shard_weights),
                       f"{c.total:,} params in {model.param_dtype}" + (f" / {n}" if parallel.shard_weights else ""))
        grads = Term("gradients", "update", c.trainable_bytes // share(parallel.shard_gradients),
                     f"{c.trainable:,} trainable in {model.param_dtype}"
                     + (f" / {n}" if parallel.shard_gradients else ""))
        optim = Term("optimizer (AdamW)", "persistent", 2 * c.trainable_bytes // share(parallel.shard_optimizer),
                     f"2 moments × {c.trainable:,} trainable in {model.param_dtype} (no separate master copy)"
                     + (f" / {n}" if parallel.shard_optimizer else ""))
    terms = [weights, optim, grads]
    if ref_model == "copy":
        terms.insert(1, Term("reference copy", "persistent", c.total_bytes,
                             f"trainer.ref_model: copy, {c.total:,} params in {model.param_dtype}, never sharded"))
    return terms


@dataclass(frozen=True)
class DecoderPass:
    """One forward through the decoder in an update: ``rows`` rows of ``queries`` computed tokens each, every one
    attending to ``keys`` positions (its row's own tokens and any cached prompt)."""

    rows: int
    queries: int
    keys: int

    @property
    def tokens(self) -> int:
        return self.rows * self.queries


def update_passes(w: Workload) -> list[DecoderPass]:
    """The decoder forwards of one update micro-batch. Shared prefix (:func:`mmrl.policies.shared_prefix.score_logits`):
    the U distinct prompts (P tokens), then the N completions' first T − 1 tokens over their prompt's cache (the
    last prompt position predicts the first completion token). Otherwise every row's prompt + completion."""
    p, t = w.prompt_tokens, w.completion_tokens
    if w.shared_prefix:
        return [DecoderPass(w.update_prompts, p, p), DecoderPass(w.update_rows, t - 1, p + t - 1)]
    return [DecoderPass(w.update_rows, p + t, p + t)]


def activation_terms(arch: Architecture, w: Workload, p: Precision, parallel: Parallelism, largest_layer: int,
                     param_bytes: int, parts: TrainableParts = FULL) -> list[Term]:
    """The update micro-batch's saved activations and transient buffers."""
    passes = update_passes(w)
    tokens = sum(f.tokens for f in passes)
    final_norm = norm_bytes(p, parts.norms, parts.lm_head) * arch.hidden + 4
    keys = attention_key_bytes(arch, p, w.attention)
    if w.gradient_checkpointing and w.shared_prefix:
        prompt, completion = passes
        q = decoder_query_bytes(arch, p, w.attention, prompt.keys, parts)
        plain = arch.layers * (prompt.tokens * q + prompt.rows * prompt.keys * keys)
        cache = w.update_rows * w.prompt_tokens * arch.layers * 2 * arch.kv_heads * arch.head_dim * p.stored
        inputs = arch.layers * p.stored * arch.hidden * completion.tokens
        saved = plain + cache + inputs
        how = (f"prompt pass plain: {arch.layers} layers × ({prompt.rows} × {prompt.queries} tokens × {q:,} B + "
               f"{prompt.rows} × {prompt.keys} keys / values × {keys:,} B); completion pass checkpointed: "
               f"{arch.layers} layer inputs × {completion.tokens:,} tokens, + the {w.update_rows}-row prompt cache "
               f"its recompute reads")
    elif w.gradient_checkpointing:
        saved = arch.layers * p.stored * arch.hidden * tokens
        how = f"checkpointed: {arch.layers} layer inputs × {arch.hidden} × {p.stored} B × {tokens:,} tokens"
    else:
        queries = [decoder_query_bytes(arch, p, w.attention, f.keys, parts) for f in passes]
        saved = arch.layers * sum(f.tokens * q + f.rows * f.keys * keys for f, q in zip(passes, queries))
        how = f"{arch.layers} layers × (" + " + ".join(
            f"{f.rows} × {f.queries} tokens × {q:,} B + {f.rows} × {f.keys} keys / values × {keys:,} B"
            for f, q in zip(passes, queries)) + ")"
    terms = [Term("activations: decoder", "update", saved, how)]
    if w.gradient_checkpointing:  # the rotary tables and the mask reach the layers as arguments: not saved
        terms.append(Term("activations: final norm", "update", final_norm * tokens, "final RMSNorm"))
    else:
        tables = (final_norm + 2 * arch.head_dim * p.stored) * tokens
        masks = 0 if w.attention == "flash_attention_2" else \
            sum(2 * f.rows * f.queries * f.keys * p.stored for f in passes)
        terms.append(Term("activations: final norm, rotary tables, mask", "update", tables + masks,
                          "final RMSNorm, cos / sin" + (", 2 float masks of " + " + ".join(
                              f"{f.rows} × {f.queries} × {f.keys}" for f in passes) if masks else "")))
    logits = w.update_rows * w.completion_tokens * arch.vocab
    terms.append(Term("activations: log-softmax", "update", LOGSOFTMAX_BYTES * logits,
                      f"{LOGSOFTMAX_BYTES} B × {w.update_rows} rows × {w.completion_tokens} tokens × "
                      f"{arch.vocab:,} vocab"))
    recompute = 0
    if arch.vision is not None and w.patches_per_row and parts.vision:  # a frozen tower saves nothing
        prompt_rows = w.update_prompts if w.shared_prefix else w.update_rows  # the vision tower's images
        v, patches = arch.vision, prompt_rows * w.patches_per_row
        block = vision_block_bytes(v, p)
        per_block = p.stored * v.hidden if w.gradient_checkpointing else block
        once = vision_once_bytes(v, p) - (2 * 4 * (v.hidden // v.heads) if w.gradient_checkpointing else 0)
        terms.append(Term("activations: vision encoder", "update", (v.depth * per_block + once) * patches,
                          f"{v.depth} blocks × {per_block:,} B/patch × {patches:,} patches"
                          + (f" ({w.update_prompts} prompts, each once)" if w.shared_prefix else
                             f" ({prompt_rows} rows' prompts)")
                          + (" (checkpointed)" if w.gradient_checkpointing else "")))
        if w.gradient_checkpointing:
            recompute = block * patches
    if w.gradient_checkpointing:  # one layer of the checkpointed pass (the completions' when the prompt is shared)
        last = passes[-1]
        recompute = max(recompute, decoder_layer_bytes(arch, p, w.attention, last.keys, parts) * last.tokens)
    terms.append(transient_term(arch, w, p, parallel, largest_layer, param_bytes, recompute))
    return terms


def transient_term(arch: Architecture, w: Workload, p: Precision, parallel: Parallelism, largest_layer: int,
                   param_bytes: int, recompute: int) -> Term:
    """Buffers alive for part of the forward / backward, not saved, at their largest moment: the raw logits and two
    float32 copies / gradients of the log-softmax input (around the log-softmax); with a shared prefix, earlier,
    the prompt cache expanded to the rows lives through the completion pass and ends with the completion logits
    and their concatenation to the first token's, before the log-softmax is saved; a layer recomputed under
    gradient checkpointing (later in the backward, when the logits are gone); FSDP FULL_SHARD / ZeRO-3's
    gathered layers."""
    n, t = w.update_rows, w.completion_tokens
    logits = n * t * arch.vocab
    if w.shared_prefix:
        raw = logits * p.compute
        cache = n * (w.prompt_tokens + t - 1) * arch.layers * 2 * arch.kv_heads * arch.head_dim * p.compute
        around_cache = cache + 2 * raw - LOGSOFTMAX_BYTES * logits  # the log-softmax is not saved yet
    else:
        raw = n * (w.prompt_tokens + t if arch.vision is None else t + 1) * arch.vocab * p.compute
        around_cache = 0
    transient = max(raw + 2 * 4 * logits, around_cache, recompute)
    how = "raw logits + 2 float32 copies / gradients of the log-softmax input"
    if around_cache > raw + 2 * 4 * logits:
        how = (f"the expanded KV cache of {n} rows × {w.prompt_tokens + t - 1} positions + 2 copies of the raw "
               f"logits, before the log-softmax")
    elif w.shared_prefix:
        how += f" (larger than the expanded KV cache of {n} rows × {w.prompt_tokens + t - 1} positions)"
    if recompute:
        how = f"the larger of ({how}) and one recomputed layer"
    if parallel.shard_weights:
        transient += 2 * largest_layer * (2 if parallel.mixed_precision != "no" else param_bytes)
        how += " + 2 gathered layers"
    return Term("transient (forward / backward)", "update", transient, how)


def generation_terms(arch: Architecture, w: Workload, param_bytes: int) -> list[Term]:
    """The HF sampler's KV cache and one step's logits (generation runs outside autocast: the parameters' dtype).
    The cache holds every row's prompt (prefilled once per prompt, then expanded to its group) and completion."""
    rows, seq = w.generation_rows, w.prompt_tokens + w.completion_tokens
    kv = rows * seq * arch.layers * 2 * arch.kv_heads * arch.head_dim * param_bytes
    copies = GENERATION_TOP_P_COPIES if w.top_p < 1.0 else GENERATION_LOGIT_COPIES
    logits = (copies * 4 + param_bytes) * rows * arch.vocab
    return [Term("KV cache", "generation", kv, f"{rows} rows × {seq} tokens × {arch.layers} layers × 2 × "
                                               f"{arch.kv_heads} kv heads × {arch.head_dim} × {param_bytes} B"),
            Term("generation logits", "generation", logits,
                 f"one step: the model's {param_bytes}-byte logits + {copies} float32 copies × {rows} rows × "
                 f"{arch.vocab:,} vocab" + (f" (top-p {w.top_p})" if w.top_p < 1.0 else ""))]


def plan_memory(cfg: TrainConfig, recipe: str, model: PlannedModel, parallel: Parallelism, gpu_gib: float,
                rows: RowShape | None) -> MemoryPlan:
    """Every term per GPU for the recipe's model under ``parallel`` (see the module docstring)."""
    mixed = cfg.trainer.mixed_precision or parallel.mixed_precision
    parallel = dataclasses.replace(parallel, mixed_precision=mixed)
    terms = state_terms(model, parallel, cfg.trainer.ref_model)
    arch, rows = model.architecture, rows or model.rows
    if arch is not None and (rows is None or rows.prompt_tokens < 1):
        raise ConfigError("the prompt length is unknown (no tokenizer with the model config): pass --prompt-tokens")
    workload = workload_of(cfg, parallel, rows or RowShape(0, 0, "not planned for this policy"))
    if arch is not None:
        param_bytes = 4 if model.param_dtype == "float32" else 2
        precision = precision_of(model.param_dtype, mixed)
        terms += activation_terms(arch, workload, precision, parallel, model.counts.largest_layer, param_bytes,
                                  model.trainable)
        if getattr(cfg.policy.args, "sampler", "hf") == "vllm":
            vllm = cfg.policy.args.vllm
            terms.append(Term("vLLM engine", "persistent", int(vllm.gpu_memory_utilization * gpu_gib * GIB),
                              f"policy.args.vllm.gpu_memory_utilization {vllm.gpu_memory_utilization} × {gpu_gib} GiB"))
        else:
            terms += generation_terms(arch, workload, param_bytes)
    return MemoryPlan(recipe, parallel, model, workload, tuple(terms), gpu_gib)


MIB = 2 ** 20


def in_unit(value: int, unit: int) -> str:
    return f"{value / unit:,.2f}"


def format_plan(plan: MemoryPlan) -> str:
    """The plan as a table: one line per term, the phase totals, the peak and whether it fits."""
    m, w, par = plan.model, plan.workload, plan.parallelism
    placement = par.name if par.processes == 1 else f"{par.name} over {par.processes} processes"
    lines = [f"{plan.recipe}: policy {m.policy}, {m.counts.total:,} parameters ({m.counts.trainable:,} trainable), "
             f"{placement}, mixed precision {par.mixed_precision}"]
    if m.architecture is not None:
        scoring = (f"each of its {w.update_prompts} prompts run once" if w.shared_prefix
                   else "every row runs its prompt")
        lines.append(f"update micro-batch {w.update_rows} rows × ({w.prompt_tokens} prompt + {w.completion_tokens} "
                     f"completion) tokens ({scoring}), {w.patches_per_row} image patches/prompt, generation "
                     f"{w.generation_rows} rows, gradient checkpointing {'on' if w.gradient_checkpointing else 'off'} "
                     f"({w.rows_source})")
    else:
        lines.append(f"activations and generation are not planned for the {m.policy} policy (parameters only)")
    unit, label = (GIB, "GiB/GPU") if plan.peak >= GIB else (MIB, "MiB/GPU")
    peak_label = "peak (persistent + larger phase)"
    width = max(len(peak_label), *(len(t.name) for t in plan.terms))
    lines.append(f"{'term':<{width}}  {'phase':<10}  {label:>9}  how")
    lines += [f"{t.name:<{width}}  {t.phase:<10}  {in_unit(t.bytes, unit):>9}  {t.how}" for t in plan.terms]
    for phase in ("persistent", "update", "generation"):
        lines.append(f"{'total ' + phase:<{width}}  {'':<10}  {in_unit(plan.phase(phase), unit):>9}")
    headroom = plan.gpu_gib - plan.peak / GIB
    lines.append(f"{peak_label:<{width}}  {'':<10}  {in_unit(plan.peak, unit):>9}")
    lines.append(f"fits in {plan.gpu_gib:g} GiB: {'yes' if plan.fits else 'no'} "
                 f"({'headroom' if plan.fits else 'short by'} {abs(headroom):,.2f} GiB)")
    return "\n".join(lines)


def run_plan(recipe: str, overrides: list[str], accelerate_config: str | None, num_processes: int | None,
             gpu_gib: float, model_config: str | None, prompt_tokens: int | None, image_patches: int | None,
             as_json: bool, imports: list[str] = ()) -> str:
    """``mmrl plan``: load the recipe, build its model on the meta device, print the table (or JSON)."""
    from mmrl.core.config import load_config
    from mmrl.experiments.meta_model import build_meta_model

    if gpu_gib <= 0:
        raise ConfigError(f"--gpu-gib must be > 0, got {gpu_gib}")
    for flag, value in (("--num-processes", num_processes), ("--prompt-tokens", prompt_tokens),
                        ("--image-patches", image_patches)):
        if value is not None and value < (1 if flag != "--image-patches" else 0):
            raise ConfigError(f"{flag} must be a positive count, got {value}")
    cfg = load_config(recipe, overrides, imports)
    parallel = read_accelerate_config(accelerate_config, num_processes)
    model = build_meta_model(cfg, model_config)
    rows = model.rows
    if prompt_tokens is not None or image_patches is not None:
        base = rows or RowShape(0, 0, "")
        rows = RowShape(prompt_tokens if prompt_tokens is not None else base.prompt_tokens,
                        image_patches if image_patches is not None else base.patches, "given on the command line")
    plan = plan_memory(cfg, recipe, model, parallel, gpu_gib, rows)
    return json.dumps(plan.to_json(), indent=1) if as_json else format_plan(plan)
