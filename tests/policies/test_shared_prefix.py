"""Each prompt read once for its group (mmrl/policies/shared_prefix.py): the shared-prefix re-scoring
equals the row-by-row forward in log-probs and gradients, and the prefilled sampler draws the same
tokens as generate over every row, on prompts of different lengths, image counts, text-only rows,
videos, LoRA and Qwen3-VL."""

from __future__ import annotations

import pytest
import torch

from mmrl.core.registry import make_policy
from mmrl.core.rollout import Rollout, SamplingParams
from mmrl.policies.shared_prefix import can_share, prefill_for_generation
from mmrl.samplers.hf_generate import HFGenerateSampler
from tests.policies.test_vlm import mixed_examples

SPEC = "vlm/qwen2_5_vl_tiny.json"


def tiny(spec: str = SPEC, **args):
    return make_policy("vlm", {"model_spec": spec, "max_prompt_tokens": 256, **args})


def grads(policy, loss) -> list[torch.Tensor]:
    params = [p for p in policy.parameters() if p.requires_grad]
    return [g if g is not None else torch.zeros_like(p)
            for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))]


def assert_shared_equals_plain(policy, rollout: Rollout) -> None:
    payload = rollout.payload
    assert payload.prompts.num_rows < len(payload.prompt_of_row) and can_share(policy.model, payload.prompts)
    shared = policy.score(payload, with_entropy=True)
    plain = policy.score(payload, with_entropy=True, shared_prefix=False)
    mask = rollout.mask
    assert ((shared.logp - plain.logp) * mask).abs().max() < 1e-5
    assert ((shared.entropy - plain.entropy) * mask).abs().max() < 1e-4
    assert ((shared.logp - rollout.logp) * mask).abs().max() < 1e-5  # and both equal the sampler's
    loss = lambda out: (out.logp * mask).sum() / mask.sum()  # noqa: E731
    for a, b in zip(grads(policy, loss(shared)), grads(policy, loss(policy.score(payload, shared_prefix=False)))):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec", [SPEC, "vlm/qwen3_vl_tiny.json"])
def test_shared_prefix_scores_equal_the_row_by_row_forward(spec):
    policy = tiny(spec).train()
    rollout = policy.rollout(mixed_examples(), 3, SamplingParams(temperature=1.0, max_new_tokens=10), seed=5)
    # four prompts of four lengths (left padding), 0, 1 or 2 images, 3 completions each, stored once each
    prompts = rollout.payload.prompts
    assert prompts.num_rows == 4 and len(set(prompts.attention_mask.sum(1).tolist())) == 4
    assert_shared_equals_plain(policy, rollout)
    # minibatches of rows: select keeps only the prompts its rows continue, and still shares them
    part = rollout.select(torch.tensor([11, 0, 2, 7, 10]))
    assert part.payload.prompts.num_rows == 3 and part.payload.prompt_of_row.tolist() == [2, 0, 0, 1, 2]
    assert_shared_equals_plain(policy, part)
    # rollouts of different rounds concatenate (their prompts are kept apart)
    other = policy.rollout(mixed_examples()[:2], 2, SamplingParams(temperature=1.0, max_new_tokens=6), seed=9)
    assert_shared_equals_plain(policy, Rollout.concat([rollout, other]))


def test_shared_prefix_with_lora_and_one_token_completions():
    policy = tiny(lora_rank=4).train()
    rollout = policy.rollout(mixed_examples(), 2, SamplingParams(temperature=1.0, max_new_tokens=6), seed=3)
    assert_shared_equals_plain(policy, rollout)
    one = policy.rollout(mixed_examples(), 2, SamplingParams(temperature=1.0, max_new_tokens=1), seed=3)
    assert one.payload.completion_ids.shape[1] == 1
    assert_shared_equals_plain(policy, one)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_gradient_checkpointing_shares_the_prompt_with_the_same_numbers(lora_rank):
    """share_prompts_under_checkpointing: the prompt pass runs plain and writes the cache; the completion pass is
    checkpointed over a read-only copy (its recompute reads the same states): log-probs and gradients as without."""
    plain = tiny(lora_rank=lora_rank).train()
    checkpointed = tiny(lora_rank=lora_rank, gradient_checkpointing=True,
                        share_prompts_under_checkpointing=True).train()
    rollout = plain.rollout(mixed_examples(), 2, SamplingParams(temperature=1.0, max_new_tokens=6), seed=3)
    payload, mask = rollout.payload, rollout.mask
    assert can_share(checkpointed.model, payload.prompts, under_checkpointing=True)
    assert not can_share(checkpointed.model, payload.prompts)  # by default checkpointing scores row by row
    attention = next(m for m in checkpointed.modules() if type(m).__name__.endswith("DecoderLayer")).self_attn
    calls = []
    handle = attention.register_forward_hook(lambda *_: calls.append(1))
    out = checkpointed.score(payload)
    loss = (out.logp * mask).sum() / mask.sum()
    gradients = grads(checkpointed, loss)
    handle.remove()
    assert len(calls) == 3  # the prompt pass, the completion pass, and its recompute in the backward pass
    reference = plain.score(payload, shared_prefix=False)
    assert ((out.logp - reference.logp) * mask).abs().max() < 1e-5
    for a, b in zip(gradients, grads(plain, (reference.logp * mask).sum() / mask.sum())):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    # the layers' own flags are back as they were
    layer = attention
    assert "_can_checkpoint_with_cache" not in vars(layer) and all(
        m.gradient_checkpointing for m in checkpointed.modules() if hasattr(m, "gradient_checkpointing")
        and type(m).__name__.endswith("DecoderLayer"))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_the_prefilled_sampler_draws_what_generate_over_every_row_draws(temperature):
    policy = tiny().eval()
    prompts = policy.encode(mixed_examples())
    assert prefill_for_generation(policy.model, prompts, 3) is not None  # the one-prefill path is taken
    sampling = SamplingParams(temperature=temperature, max_new_tokens=8)
    group = 3
    sampler = HFGenerateSampler()
    shared = sampler.sample(policy.model, prompts, sampling, policy.rules, 7, 0, group_size=group)
    every_row = sampler.sample(policy.model, prompts.select(torch.arange(4).repeat_interleave(group)), sampling,
                               policy.rules, 7, 0)
    assert torch.equal(shared.ids, every_row.ids) and torch.equal(shared.mask, every_row.mask)
    assert (shared.logp - every_row.logp).abs().max() < 1e-5
    # chunks of whole groups (max_batch_rows 5 → one prompt's 3 rows per generate call) draw valid rows
    chunked = HFGenerateSampler(max_batch_rows=5).sample(policy.model, prompts, sampling, policy.rules, 7, 0,
                                                         group_size=group)
    assert chunked.ids.shape[0] == 12 and bool((chunked.mask.sum(1) > 0).all())
    if temperature == 0:
        assert torch.equal(chunked.ids[:, :shared.ids.shape[1]], shared.ids[:, :chunked.ids.shape[1]])
