"""The colocated vLLM sampler (GPU nodes with vLLM installed; skipped elsewhere).

vLLM cannot share the CPU environment (it pins its own torch / transformers), so these tests run
only where ``import vllm`` works and CUDA is available. They check what users of peer frameworks
hit: the engine's behaviour log-probs match the trainer's re-scoring, weights are pushed after an
optimizer step (the next rollout is stamped with the new version and comes from the new
weights), the sync is timed, and no vision token is ever returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from PIL import Image

pytestmark = pytest.mark.gpu

vllm = pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("the vLLM sampler needs a CUDA device", allow_module_level=True)

from mmrl.cli import main  # noqa: E402
from mmrl.core.registry import make_policy  # noqa: E402
from mmrl.core.rollout import SamplingParams  # noqa: E402


@dataclass(frozen=True)
class Example:
    prompt: str
    images: tuple
    system: str | None = None


def examples():
    return [Example("<image>What colour is the shape?", (Image.new("RGB", (56, 56), (220, 30, 30)),)),
            Example("<image> and <image>: same?", (Image.new("RGB", (112, 112), (30, 60, 220)),
                                                   Image.new("RGB", (84, 56), (30, 170, 40)))),
            Example("No image: say hi.", ())]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_vlm")
    assert main(["init-model", "vlm/qwen2_5_vl_tiny.json", "--out", str(folder / "m")]) == 0
    args = {"pretrained": str(folder / "m"), "sampler": "vllm", "max_prompt_tokens": 256,
            "vllm": {"dtype": "float32", "gpu_memory_utilization": 0.2, "max_model_len": 512}}
    return make_policy("vlm", args).cuda()


def test_vllm_logprobs_match_rescoring_and_sync_after_a_step(policy):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    rollout = policy.rollout(examples(), 4, sampling, seed=0)
    assert rollout.policy_version == policy.version and "perf/weight_sync_s" in rollout.stats
    assert not torch.isin(rollout.payload.completion_ids[rollout.payload.completion_mask > 0],
                          policy.suppressed.cpu()).any()
    rescored = policy(rollout).logp.detach().cpu()
    diff = ((rescored - rollout.logp).abs() * rollout.mask).sum() / rollout.mask.sum()
    assert diff < 1e-3  # different kernels, fp32: close, not bit-equal (hence recompute_logp_old + TIS)

    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    (-policy(rollout).logp.sum()).backward()
    optimizer.step()
    policy.version += 1  # what the trainer does after each optimizer step
    after = policy.rollout(examples(), 4, sampling, seed=0)
    assert after.policy_version == policy.version
    assert after.stats["perf/weight_sync_s"] > 0
    new_scores = policy(after).logp.detach().cpu()
    assert ((new_scores - after.logp).abs() * after.mask).sum() / after.mask.sum() < 1e-3  # new weights sampled
    again = policy.rollout(examples(), 4, sampling, seed=0)
    assert again.stats["perf/weight_sync_s"] == 0.0  # no step, no push
