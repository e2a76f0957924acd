"""A colocated vLLM engine as a :class:`~mmrl.samplers.tokens.CompletionSampler` (GPU nodes only).

vLLM pins its own torch / transformers, so it lives in its own environment (``pip install
mmrl[vllm]`` there) and is imported only inside this module's functions, never at import time.

- **Engine**: ``vllm.LLM`` in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so
  ``collective_rpc`` hands tensors over by reference), built lazily from the policy's folder.
- **Weights**: pushed from the trainer whenever the policy's version (optimizer steps) is newer
  than the engine's — lazily, right before sampling — through ``LLM.collective_rpc`` calling the
  worker model's ``load_weights`` (vLLM maps Hugging Face parameter names itself); the prefix
  cache is reset after each push. Time is reported as ``perf/weight_sync_s``; completions carry
  the version they were sampled with.
- **Behaviour log-probs**: vLLM's, with ``logprobs_mode="processed_logprobs"`` (after
  temperature and the allowed-token mask, i.e. the same tempered, suppressed distribution the
  trainer scores; with ``top_p < 1`` vLLM's also include the nucleus truncation). Engine and
  trainer kernels differ, so set ``trainer.recompute_logp_old: true`` (logs
  ``rollout/logp_diff``) and ``algo.tis_cap`` (truncated importance sampling) in vLLM recipes.

Written against vLLM's documented ``LLM`` / ``SamplingParams`` / ``collective_rpc`` API (0.10+).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from mmrl.policies.tokens import completion_mask_from_eos
from mmrl.core.rollout import SamplingParams
from mmrl.samplers.tokens import Completions, LogitsGuide, TokenRules, VisionPrompts


def _load_weights_on_worker(worker, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside vLLM's worker (``collective_rpc`` passes the worker as the first argument)."""
    loaded = worker.model_runner.model.load_weights(weights=weights)
    return len(loaded) if loaded is not None else len(weights)


class VLLMSampler:
    def __init__(self, settings, model_folder: Callable[[], str], weights: Callable[[], dict[str, torch.Tensor]],
                 max_images_per_prompt: int = 8):
        """``model_folder()`` gives a HF folder to start the engine from (called once);
        ``weights()`` the policy's current weights under Hugging Face names (LoRA merged)."""
        self.settings = settings
        self.model_folder, self.weights = model_folder, weights
        self.max_images_per_prompt = max_images_per_prompt
        self.llm = None
        self.engine_version = -1  # version of the weights the engine holds (-1: the folder's)

    def _engine(self):
        if self.llm is None:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            from vllm import LLM

            s = self.settings
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            self.llm = LLM(model=self.model_folder(), dtype=s.dtype, gpu_memory_utilization=s.gpu_memory_utilization,
                           max_model_len=s.max_model_len, enforce_eager=s.enforce_eager,
                           enable_sleep_mode=s.sleep_between_rollouts, logprobs_mode="processed_logprobs",
                           limit_mm_per_prompt={"image": self.max_images_per_prompt},
                           # one engine per trainer process, as TRL's colocate mode does
                           distributed_executor_backend="external_launcher" if distributed else None,
                           seed=torch.distributed.get_rank() if distributed else 0)
        return self.llm

    def sync_weights(self, policy_version: int) -> float:
        """Push the trainer's weights if the engine's are older; returns the seconds it took."""
        llm = self._engine()
        if self.engine_version == policy_version:
            return 0.0
        start = time.perf_counter()
        weights = list(self.weights().items())
        llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.engine_version = policy_version
        return time.perf_counter() - start

    @torch.no_grad()
    def sample(self, model: nn.Module, prompts: VisionPrompts, sampling: SamplingParams, rules: TokenRules,
               seed: int, policy_version: int, group_size: int = 1,
               guides: Sequence[LogitsGuide] = ()) -> Completions:
        if guides:  # a guide runs a second model beside every decoding step, inside transformers' generate
            raise ValueError("logits guides (e.g. logits extrapolation) need the HF sampler: "
                             "set policy.args.sampler: hf")
        from vllm import SamplingParams as VLLMSamplingParams

        if group_size > 1:  # one request per row (vLLM's prefix cache shares each prompt's prefill)
            prompts = prompts.select(torch.arange(prompts.num_rows).repeat_interleave(group_size))

        if not prompts.texts:
            raise ValueError("the vLLM sampler needs the prompts' texts and images (VisionPrompts.texts / .images)")
        if prompts.video_grid_thw is not None:
            raise ValueError("the vLLM sampler takes images only, and these prompts hold videos: "
                             "use policy.args.sampler: hf for video tasks")
        llm = self._engine()
        if self.settings.sleep_between_rollouts:
            llm.wake_up()
        sync_s = self.sync_weights(policy_version)
        suppressed = set(rules.suppressed.tolist())  # includes embedding rows past the tokenizer
        allowed = [i for i in range(len(llm.get_tokenizer())) if i not in suppressed]
        greedy = sampling.temperature == 0
        requests, params = [], []
        for row, (text, images) in enumerate(zip(prompts.texts, prompts.images)):
            requests.append({"prompt": text, "multi_modal_data": {"image": list(images)}} if images else {"prompt": text})
            params.append(VLLMSamplingParams(
                n=1, temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
                top_k=0, max_tokens=sampling.max_new_tokens, seed=(seed + row) % (2**31 - 1), logprobs=0,
                stop_token_ids=list(rules.eos_ids), allowed_token_ids=allowed, skip_special_tokens=False,
                detokenize=False))
        outputs = llm.generate(requests, params, use_tqdm=False)
        if self.settings.sleep_between_rollouts:
            llm.sleep(level=1)
        ids, logps = [], []
        for out in outputs:
            completion = out.outputs[0]
            token_ids = list(completion.token_ids)
            ids.append(torch.tensor(token_ids, dtype=torch.long))
            logps.append(torch.tensor([completion.logprobs[t][tok].logprob for t, tok in enumerate(token_ids)],
                                      dtype=torch.float32))
        t_max = max(1, max(len(x) for x in ids))
        completion_ids = torch.stack([F.pad(x, (0, t_max - len(x)), value=rules.pad_id) for x in ids])
        logp = torch.stack([F.pad(x, (0, t_max - len(x))) for x in logps])
        mask = completion_mask_from_eos(completion_ids, rules.eos_ids)
        mask = mask * (torch.arange(t_max)[None] < torch.tensor([len(x) for x in ids])[:, None]).long()
        completion_ids = completion_ids.masked_fill(mask == 0, rules.pad_id)
        return Completions(completion_ids, mask, logp * mask, self.engine_version,
                           {"perf/weight_sync_s": sync_s})
