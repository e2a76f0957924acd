"""Hugging Face ``generate`` as a :class:`~mmrl.samplers.tokens.CompletionSampler` (CPU and GPU).

KV cache, batched (in chunks of at most ``max_batch_rows`` rows: bounded memory), temperature and
top-p, stop on EOS, ``max_new_tokens``. Behaviour log-probs come from the *raw* logits
(``output_logits``, not the processed ``output_scores``) through
:func:`mmrl.policies.tokens.token_logprobs`, the same function the re-scoring forward uses, with the
same temperature and suppressed ids, so on-policy ratios are 1.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationConfig

from mmrl.policies.tokens import completion_mask_from_eos, token_logprobs
from mmrl.core.rollout import SamplingParams
from mmrl.samplers.tokens import Completions, TokenRules, VisionPrompts


class HFGenerateSampler:
    def __init__(self, max_batch_rows: int = 0):
        if max_batch_rows < 0:
            raise ValueError(f"max_batch_rows must be >= 0 (0: one batch), got {max_batch_rows}")
        self.max_batch_rows = max_batch_rows

    @torch.no_grad()
    def sample(self, model: nn.Module, prompts: VisionPrompts, sampling: SamplingParams, rules: TokenRules,
               seed: int, policy_version: int) -> Completions:
        device = rules.suppressed.device
        rows = prompts.num_rows
        size = self.max_batch_rows or rows
        was_training = model.training
        model.eval()
        ids, logps = [], []
        # generate draws from the global RNG (CUDA's on a GPU): fork it, seed it once, restore it.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for start in range(0, rows, size):
                chunk = prompts.select(torch.arange(start, min(start + size, rows))).to(device)
                chunk_ids, chunk_logp = self._generate(model, chunk, sampling, rules)
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
    def _generate(model: nn.Module, prompts: VisionPrompts, sampling: SamplingParams,
                  rules: TokenRules) -> tuple[torch.Tensor, torch.Tensor]:
        greedy = sampling.temperature == 0
        # An explicit neutral generation config: a checkpoint's generation_config.json (top_k,
        # repetition penalty, ...) would otherwise change the sampling distribution silently.
        config = GenerationConfig(
            do_sample=not greedy, max_new_tokens=sampling.max_new_tokens, pad_token_id=rules.pad_id,
            eos_token_id=list(rules.eos_ids), suppress_tokens=rules.suppressed.tolist() or None,
            output_logits=True, return_dict_in_generate=True,
            **({} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}))
        out = model.generate(input_ids=prompts.input_ids, attention_mask=prompts.attention_mask,
                             mm_token_type_ids=prompts.mm_token_type_ids, generation_config=config,
                             **prompts.vision_inputs())
        completion_ids = out.sequences[:, prompts.input_ids.shape[1]:]  # [n, T]
        logits = torch.stack(out.logits, dim=1)  # [n, T, V] raw logits (before processors)
        mask = completion_mask_from_eos(completion_ids, rules.eos_ids)  # [n, T]: tokens up to the first EOS
        logp, _ = token_logprobs(logits, completion_ids, sampling.temperature, rules.suppressed, mask)
        return completion_ids, logp
