"""The causal-LM policy: sampler and re-scorer agree exactly on-policy; sampling is seeded and clean."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mmrl.policies.causal_lm import CausalLMPolicy, char_tokenizer
from mmrl.core.registry import make_policy, make_task
from mmrl.core.rollout import SamplingParams

CHARS = "0123456789>"


def tiny_policy(**args) -> CausalLMPolicy:
    return make_policy("causal_lm", {"model_config": "assets/sanity/qwen2_tiny.json", "tokenizer_chars": CHARS,
                                     **args})


@pytest.fixture(scope="module")
def examples():
    task = make_task("sanity/reverse-v0", {"min_len": 1, "max_len": 6})  # prompt lengths 2..7: mixed padding
    return task.sample_batch("train", 12, np.random.default_rng(0))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_on_policy_logprobs_equal_the_samplers(examples, temperature):
    policy = tiny_policy()
    rollout = policy.rollout(examples, 4, SamplingParams(temperature=temperature, max_new_tokens=8), seed=3)
    assert len({len(e.prompt) for e in examples}) > 2  # the batch really mixes prompt lengths
    out = policy(rollout, with_entropy=True)
    diff = (out.logp - rollout.logp) * rollout.mask
    assert diff.abs().max() < 1e-5
    ratio = torch.exp(diff)[rollout.mask > 0]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)
    entropy = out.entropy[rollout.mask > 0]
    assert (entropy >= 0).all() and (entropy <= math.log(len(CHARS) + 1) + 1e-4).all()


def test_logprobs_have_gradients(examples):
    policy = tiny_policy()
    rollout = policy.rollout(examples[:4], 2, SamplingParams(max_new_tokens=6), seed=0)
    policy(rollout).logp.sum().backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_diverged_forward_gives_nonfinite_logprobs_on_real_tokens_only(examples):
    # A NaN weight (a diverged update) makes every logit NaN. The log-probs of the completion tokens must
    # show it (before, they were silently 0 and the update trained on zeros); padding stays 0.
    from mmrl.algos.masked import count_nonfinite

    policy = tiny_policy()
    rollout = policy.rollout(examples[:6], 2, SamplingParams(temperature=3.0, max_new_tokens=8), seed=1)
    assert (rollout.mask == 0).any()  # some rows stop early: there is padding
    with torch.no_grad():
        policy.model.model.norm.weight[0] = float("nan")
    out = policy(rollout, with_entropy=True)
    valid = rollout.mask > 0
    assert torch.isnan(out.logp[valid]).all()
    assert (out.logp[~valid] == 0).all()
    assert count_nonfinite(out.logp, rollout.mask) == int(rollout.mask.sum())
    assert count_nonfinite(rollout.logp, rollout.mask) == 0  # the rollout itself was sampled before


def test_rollouts_are_seeded(examples):
    policy = tiny_policy()
    params = SamplingParams(max_new_tokens=8)
    a, b = (policy.rollout(examples, 2, params, seed=11) for _ in range(2))
    c = policy.rollout(examples, 2, params, seed=12)
    assert a.outputs == b.outputs and torch.equal(a.logp, b.logp)
    assert a.outputs != c.outputs
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    policy.rollout(examples, 2, params, seed=11)
    assert torch.rand(1) == before  # sampling does not touch the global RNG


def test_completion_stops_at_eos_and_never_samples_pad(examples):
    policy = tiny_policy()
    # A hot, untrained model: pad would be sampled often if it were not suppressed.
    rollout = policy.rollout(examples, 4, SamplingParams(temperature=3.0, max_new_tokens=10), seed=1)
    ids, mask = rollout.payload.completion_ids, rollout.payload.completion_mask
    eos, pad = policy.tokenizer.eos_token_id, policy.tokenizer.pad_token_id
    assert not ((ids == pad) & (mask == 1)).any()
    lengths = mask.sum(1)
    assert (mask == (torch.arange(ids.shape[1]) < lengths[:, None]).long()).all()  # a prefix
    stopped = lengths < ids.shape[1]
    assert stopped.any()
    assert (ids[stopped, lengths[stopped] - 1] == eos).all()  # the last kept token is EOS
    assert all("<pad>" not in o and "<eos>" not in o for o in rollout.outputs)


def test_checkpoint_generation_config_cannot_change_sampling(tmp_path, examples):
    policy = tiny_policy()
    policy.save_pretrained(str(tmp_path))
    gen = tmp_path / "generation_config.json"
    gen.write_text(json.dumps({**json.loads(gen.read_text()), "top_k": 1, "do_sample": False,
                               "repetition_penalty": 5.0}))
    loaded = CausalLMPolicy.from_pretrained(tmp_path)
    rollout = loaded.rollout(examples[:1], 16, SamplingParams(temperature=1.0, max_new_tokens=6), seed=0)
    assert len(set(rollout.outputs)) > 1  # top_k=1 / greedy from the file would make them identical
    assert ((loaded(rollout).logp - rollout.logp).abs() * rollout.mask).max() < 1e-5


def test_save_and_load_round_trip(tmp_path, examples):
    policy = tiny_policy(value_head=True)
    with torch.no_grad():
        policy.value_head.bias.fill_(0.5)
    policy.save_pretrained(str(tmp_path))
    rollout = policy.rollout(examples, 2, SamplingParams(max_new_tokens=6), seed=0)
    loaded = CausalLMPolicy.from_pretrained(tmp_path, value_head=True)
    a, b = policy(rollout), loaded(rollout)
    assert torch.equal(a.logp, b.logp) and torch.equal(a.values, b.values)
    fresh = tiny_policy(value_head=True, init_seed=1)
    fresh.load_weights(str(tmp_path))
    assert torch.equal(fresh(rollout).logp, a.logp)


def test_value_head(examples):
    policy = tiny_policy(value_head=True)
    rollout = policy.rollout(examples, 2, SamplingParams(max_new_tokens=6), seed=0)
    assert rollout.values is not None and rollout.values.shape == rollout.mask.shape
    assert (rollout.values == 0).all()  # zero-initialised critic
    out = policy(rollout)
    out.values.sum().backward()
    assert policy.value_head.weight.grad.abs().sum() > 0


def test_sft_loss_learns(examples):
    policy = tiny_policy()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    targets = [e.target for e in examples]
    first = policy.sft_loss(examples, targets).item()
    for _ in range(30):
        loss = policy.sft_loss(examples, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5 * first


def test_char_tokenizer_encodes_runs_of_newlines_one_character_at_a_time():
    tokenizer = char_tokenizer("ab\n")
    ids = tokenizer("a\n\nb\n\n\n", add_special_tokens=False)["input_ids"]
    assert ids == [2, 4, 4, 3, 4, 4, 4] and tokenizer.decode(ids) == "a\n\nb\n\n\n"


def test_char_tokenizer_rejects_repeats():
    with pytest.raises(ValueError, match="repeated characters"):
        char_tokenizer("0120")


def test_pretrained_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder"):
        CausalLMPolicy.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="either pretrained or model_config"):
        tiny_policy(pretrained=str(tmp_path))


def test_lora_trains_adapters_only_and_disabling_them_gives_the_base(tmp_path, examples):
    policy = tiny_policy(lora_rank=4)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    rollout = policy.rollout(examples, 2, SamplingParams(max_new_tokens=6), seed=0)
    with torch.no_grad(), policy.adapter_disabled():
        base = policy(rollout).logp
    assert torch.equal(policy(rollout).logp, base)  # B = 0: adapters start as the identity
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    (-policy(rollout).logp.sum()).backward()
    optimizer.step()
    tuned = policy(rollout).logp.detach()
    with torch.no_grad(), policy.adapter_disabled():
        assert torch.equal(policy(rollout).logp, base)  # the base is untouched
    assert (tuned - base).abs().max() > 1e-4
    policy.save_pretrained(str(tmp_path))
    assert (tmp_path / "adapter_model.safetensors").is_file()
    again = tiny_policy(lora_rank=4)
    again.load_weights(str(tmp_path))
    assert torch.allclose(again(rollout).logp, tuned, atol=1e-6)


def test_adapter_reference_needs_adapters():
    with pytest.raises(TypeError, match="has no adapters: use trainer.ref_model: copy"):
        tiny_policy().adapter_disabled()
