"""Logits extrapolation (mmrl/policies/logits_extrapolation.py, seed #10): z_base + α·(z_RL − z_base) at sampling
time. α = 1 is the RL model, α = 0 the base; a hand-computed combination; ``mmrl eval --extrapolate-logits``."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.cli import main
from mmrl.core.registry import make_policy
from mmrl.core.rollout import SamplingParams
from mmrl.policies.logits_extrapolation import LogitsExtrapolation, extrapolated_logits, logits_extrapolation

QUIET = ["log.progress=false", "log.tensorboard=false"]


def test_extrapolated_logits_golden():
    base, rl = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 0.0, 3.0])
    # 1 + 1.5·1 = 2.5;  2 + 1.5·(−2) = −1;  3 + 0 = 3
    assert torch.equal(extrapolated_logits(base, rl, 1.5), torch.tensor([2.5, -1.0, 3.0]))
    assert torch.equal(extrapolated_logits(base, rl, 0.0), base) and torch.equal(extrapolated_logits(base, rl, 1.0), rl)


def two_policies(sanity_config):
    """A briefly warm-started policy (the "RL" model) and the untrained one it started from (the base)."""
    from mmrl.core.warm_start import build_initial_policy

    cfg = sanity_config("warm_start.sft_steps=30")
    rl = build_initial_policy(cfg).eval()
    base = make_policy(cfg.policy.name, cfg.policy.args).eval()
    return rl, base


class Prompt:
    def __init__(self, prompt: str):
        self.prompt = prompt


PROMPTS = [Prompt("1234>"), Prompt("907>"), Prompt("55>")]  # different lengths: left padding
GREEDY = SamplingParams(0.0, 1.0, 6)


def test_alpha_one_is_the_rl_model_and_alpha_zero_the_base(sanity_config):
    rl, base = two_policies(sanity_config)
    own, base_own = rl.rollout(PROMPTS, 1, GREEDY, 0), base.rollout(PROMPTS, 1, GREEDY, 0)
    assert own.outputs != base_own.outputs  # the two models differ
    with logits_extrapolation(rl, base, 1.0):
        assert rl.rollout(PROMPTS, 1, GREEDY, 0).outputs == own.outputs
    with logits_extrapolation(rl, base, 0.0):
        at_zero = rl.rollout(PROMPTS, 1, GREEDY, 0)
    assert at_zero.outputs == base_own.outputs
    assert torch.allclose(at_zero.logp, base_own.logp, atol=1e-5)  # the recorded log-probs are the combination's
    assert rl.logits_guides == ()  # restored after the block


def test_each_step_combines_both_models_logits_for_the_same_prefix(sanity_config):
    """A hand-run of two decoding steps: the processor's output equals the combination of full forwards."""
    rl, base = two_policies(sanity_config)
    ids, mask = rl._encode_prompts([p.prompt for p in PROMPTS])
    processor = LogitsExtrapolation(base.model, 2.0, mask)
    from mmrl.policies.tokens import positions_from_mask

    def last_logits(model, ids, mask):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[:, -1]

    with torch.no_grad():
        z_rl = last_logits(rl.model, ids, mask)
        out = processor(ids, z_rl)
        assert torch.allclose(out, last_logits(base.model, ids, mask) + 2.0 * (z_rl - last_logits(base.model, ids, mask)),
                              atol=1e-5)
        step = torch.tensor([[3], [4], [5]])
        ids2, mask2 = torch.cat([ids, step], 1), torch.cat([mask, torch.ones_like(step)], 1)
        z_rl2 = last_logits(rl.model, ids2, mask2)
        z_base2 = last_logits(base.model, ids2, mask2)
        assert torch.allclose(processor(ids2, z_rl2), z_base2 + 2.0 * (z_rl2 - z_base2), atol=1e-4)


def test_mmrl_eval_extrapolates_logits_from_a_base_folder(tmp_path, sanity_config, capsys):
    rl, base = two_policies(sanity_config)
    rl.save_pretrained(str(tmp_path / "rl"))
    base.save_pretrained(str(tmp_path / "base"))

    def evaluate(model: str, *extra: str) -> dict:
        report = tmp_path / "eval.json"
        assert main(["eval", "sanity/tiny_cpu", "--model", str(tmp_path / model), "--num-examples", "16", *extra,
                     "--json", str(report)]) == 0
        return json.loads(report.read_text())["metrics"]["test"]

    rl_alone, base_alone = evaluate("rl"), evaluate("base")
    assert evaluate("rl", "--extrapolate-logits", "1", "--base", str(tmp_path / "base")) == pytest.approx(rl_alone)
    assert "logits extrapolated from" in capsys.readouterr().out
    assert evaluate("rl", "--extrapolate-logits", "0", "--base", str(tmp_path / "base")) == pytest.approx(base_alone)
    assert main(["eval", "sanity/tiny_cpu", "--model", str(tmp_path / "rl"), "--extrapolate-logits", "1"]) == 2
    assert "go together" in capsys.readouterr().err
