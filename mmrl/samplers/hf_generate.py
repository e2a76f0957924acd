"""Hugging Face ``generate`` as a :class:`~mmrl.samplers.tokens.CompletionSampler` (CPU and GPU).

KV cache, batched (in chunks of at most ``max_batch_rows`` rows: bounded memory), temperature and
top-p, stop on EOS, ``max_new_tokens``. One logits processor (:class:`~mmrl.policies.tokens.BehaviourLogprobs`) turns the
model's raw logits into the sampling distribution (temperature, suppressed ids, top-p) and records
each sampled token's log-prob under the tempered distribution with the suppressed ids removed — what
:func:`mmrl.policies.tokens.token_logprobs` gives the re-scoring forward, so on-policy ratios are 1.
It keeps one step's logits at a time: keeping every step's (``output_logits``) costs rows × new
tokens × vocabulary floats, 74 GiB at 64 rows × 2048 tokens of a 152 k vocabulary.

With ``group_size`` > 1 each prompt is read once: its prefill runs on the distinct prompts and the
KV cache is expanded to the group (:func:`mmrl.policies.shared_prefix.prefill_for_generation`);
the random draws are the same as when every row is prefilled, so a seed gives the same samples.

Logits guides (:data:`~mmrl.samplers.tokens.LogitsGuide`, e.g. logits extrapolation) run before that processor,
one per ``generate`` call, built from the call's distinct prompts and the group size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationConfig, LogitsProcessorList

from mmrl.policies.shared_prefix import prefill_for_generation
from mmrl.policies.tokens import BehaviourLogprobs, completion_mask_from_eos
from mmrl.core.rollout import SamplingParams
from mmrl.samplers.tokens import Completions, LogitsGuide, TokenRules, VisionPrompts


class HFGenerateSampler:
    def __init__(self, max_batch_rows: int = 0):
        if max_batch_rows < 0:
            raise ValueError(f"max_batch_rows must be >= 0 (0: one batch), got {max_batch_rows}")
        self.max_batch_rows = max_batch_rows

    @torch.no_grad()
    def sample(self, model: nn.Module, prompts: VisionPrompts, sampling: SamplingParams, rules: TokenRules,
               seed: int, policy_version: int, group_size: int = 1,
               guides: Sequence[LogitsGuide] = ()) -> Completions:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        device = rules.suppressed.device
        count = prompts.num_rows
        # Chunks of whole groups, at most max_batch_rows rows each (at least one group).
        per_chunk = max(1, self.max_batch_rows // group_size) if self.max_batch_rows else count
        was_training = model.training
        model.eval()
        ids, logps = [], []
        # generate draws from the global RNG (CUDA's on a GPU): fork it, seed it once, restore it.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for start in range(0, count, per_chunk):
                chunk = prompts.select(torch.arange(start, min(start + per_chunk, count))).to(device)
                chunk_ids, chunk_logp = self._generate(model, chunk, group_size, sampling, rules, guides)
                ids.append(chunk_ids)
                logps.append(chunk_logp)
        model.train(was_training)
        t_max = max(x.shape[1] for x in ids)
        completion_ids = torch.cat([F.pad(x, (0, t_max - x.shape[1]), value=rules.pad_id) for x in ids])
        logp = torch.cat([F.pad(x, (0, t_max - x.shape[1])) for x in logps])
        mask = completion_mask_from_eos(completion_ids, rules.eos_ids)
        completion_ids = completion_ids.masked_fill(mask == 0, rules.pad_id)
        return Completions(completion_ids, mask, logp * mask, policy_version)

    @staticmethod
    def _generate(model: nn.Module, prompts: VisionPrompts, group_size: int, sampling: SamplingParams,
                  rules: TokenRules, guides: Sequence[LogitsGuide] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """``group_size`` completions of each prompt row, prompt-major; ``guides`` change the raw logits first."""
        greedy = sampling.temperature == 0
        # An explicit neutral generation config (temperature 1, no top-k / top-p / suppression: the one
        # processor below does all of it): a checkpoint's generation_config.json (top_k, repetition
        # penalty, ...) would otherwise change the sampling distribution silently.
        config = GenerationConfig(do_sample=not greedy, max_new_tokens=sampling.max_new_tokens,
                                  pad_token_id=rules.pad_id, eos_token_id=list(rules.eos_ids),
                                  return_dict_in_generate=True,
                                  **({} if greedy else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}))
        behaviour = BehaviourLogprobs(sampling.temperature, sampling.top_p, rules.suppressed)
        processors = [guide(prompts, group_size) for guide in guides] + [behaviour]
        prefilled = prefill_for_generation(model, prompts, group_size) if group_size > 1 else None
        repeat = torch.arange(prompts.num_rows).repeat_interleave(group_size)
        rows = prompts if group_size == 1 else prompts.select(repeat)
        # Prefilled: the cache holds the prompts (images included); otherwise generate reads every row's.
        inputs = prefilled if prefilled is not None else rows.vision_inputs()
        out = model.generate(input_ids=rows.input_ids, attention_mask=rows.attention_mask,
                             mm_token_type_ids=rows.mm_token_type_ids, generation_config=config,
                             logits_processor=LogitsProcessorList(processors), **inputs)
        completion_ids = out.sequences[:, rows.input_ids.shape[1]:]  # [n, T]
        mask = completion_mask_from_eos(completion_ids, rules.eos_ids)  # [n, T]: tokens up to the first EOS
        logp = behaviour.finish(completion_ids[:, -1])
        return completion_ids, torch.where(mask > 0, logp, torch.zeros_like(logp))
