"""Gradient checkpointing with LoRA adapters, on the tiny VLM and the tiny text policy: in train mode the
loss and every adapter gradient equal those without checkpointing, and checkpointing really recomputes
(the first decoder layer's attention runs twice per forward + backward instead of once)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.core.contracts import Policy
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import Rollout, SamplingParams


@dataclass(frozen=True)
class Example:
    prompt: str
    images: tuple
    system: str | None = None


def vlm_examples() -> list[Example]:
    return [Example("<image>What colour is the shape?", (Image.new("RGB", (56, 56), (220, 30, 30)),)),
            Example("Look: <image> and <image>. Same colour?", (Image.new("RGB", (84, 56), (30, 60, 220)),
                                                                Image.new("RGB", (56, 56), (30, 170, 40)))),
            Example("How many shapes? Answer with a digit only.", ())]


def build(kind: str, gradient_checkpointing: bool) -> Policy:
    args = {"lora_rank": 4, "gradient_checkpointing": gradient_checkpointing}
    if kind == "vlm":
        return make_policy("vlm", {"model_spec": "vlm/qwen2_5_vl_tiny.json", "max_prompt_tokens": 256, **args})
    return make_policy("causal_lm", {"model_config": "assets/sanity/qwen2_tiny.json",
                                     "tokenizer_chars": "0123456789>", **args})


def examples_for(kind: str) -> list:
    if kind == "vlm":
        return vlm_examples()
    return make_task("sanity/reverse-v0", {"min_len": 2, "max_len": 6}).sample_batch("train", 4, np.random.default_rng(0))


def loss_grads_and_attention_calls(policy: Policy, rollout: Rollout, kind: str) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """A policy-gradient-shaped loss (log-probs and an entropy bonus) in train mode, its backward, the
    adapters' gradients and how often the first decoder layer's attention ran."""
    with torch.no_grad():  # non-zero B (seeded per name), so that A gets a gradient too
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    attention = next(m for m in policy.modules() if type(m).__name__.endswith("DecoderLayer")).self_attn
    calls = []
    handle = attention.register_forward_hook(lambda *_: calls.append(1))
    policy.train()
    # The VLM row by row in both cases (without checkpointing it would share each prompt across its rows:
    # two forwards, tests/policies/test_shared_prefix.py), so the call count shows the recomputation.
    out = policy.score(rollout.payload, with_entropy=True, shared_prefix=False) if kind == "vlm" \
        else policy(rollout, with_entropy=True)
    mask = rollout.mask
    loss = -((out.logp + 0.01 * out.entropy) * mask).sum() / mask.sum()
    loss.backward()
    handle.remove()
    grads = {name: param.grad.clone() for name, param in policy.named_parameters() if param.requires_grad}
    return loss.detach(), grads, len(calls)


@pytest.mark.parametrize("kind", ["vlm", "text"])
def test_gradient_checkpointing_with_lora_gives_the_same_loss_and_gradients(kind):
    plain, checkpointed = build(kind, False), build(kind, True)
    rollout = plain.rollout(examples_for(kind), 3, SamplingParams(max_new_tokens=8), seed=0)
    assert rollout.mask.sum() > 10
    loss, grads, calls = loss_grads_and_attention_calls(plain, rollout, kind)
    loss_gc, grads_gc, calls_gc = loss_grads_and_attention_calls(checkpointed, rollout, kind)

    assert (calls, calls_gc) == (1, 2)  # checkpointing recomputed the layer in the backward pass
    torch.testing.assert_close(loss_gc, loss, rtol=1e-6, atol=0.0)
    assert grads.keys() == grads_gc.keys() and all("lora_" in name for name in grads)
    assert {name.split("lora_")[1][0] for name in grads} == {"A", "B"}
    for name, grad in grads.items():
        assert grad.abs().max() > 0, f"{name}: no gradient"
        torch.testing.assert_close(grads_gc[name], grad, rtol=1e-5, atol=1e-8, msg=lambda m: f"{name}: {m}")
