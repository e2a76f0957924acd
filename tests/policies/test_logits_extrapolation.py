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
from mmrl.samplers.tokens import VisionPrompts

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
    processor = LogitsExtrapolation(base.model, 2.0, VisionPrompts.text_only(ids, mask, rl.pad_id), 1)
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


# -- the VLM policy (tiny Qwen2.5-VL / Qwen3-VL with images) ----------------------------------------------------

def vlm_pair(spec: str = "vlm/qwen2_5_vl_tiny.json"):
    """Two tiny VLMs of one spec with different weights (init_seed 0: the "RL" model, 1: the base)."""
    args = {"model_spec": spec, "max_prompt_tokens": 256}
    return make_policy("vlm", {**args, "init_seed": 0}).eval(), make_policy("vlm", {**args, "init_seed": 1}).eval()


def vlm_examples():
    """One image, two images of different sizes, no image: three prompt lengths (left padding), 3-D positions."""
    from tests.policies.test_vlm import Example, square

    return [Example("<image>What colour is the shape?", (square(56, 56, (220, 30, 30)),)),
            Example("Look: <image> then <image>. Same colour?", (square(84, 56, (30, 60, 220)),
                                                                square(112, 112, (30, 60, 220)))),
            Example("How many shapes? Answer with a digit only.", ())]


SAMPLED = SamplingParams(1.0, 1.0, 8)


@pytest.mark.parametrize("spec", ["vlm/qwen2_5_vl_tiny.json", "vlm/qwen3_vl_tiny.json"])
def test_vlm_alpha_one_samples_the_rl_models_tokens_and_alpha_zero_the_bases(spec):
    rl, base = vlm_pair(spec)
    examples = vlm_examples()
    own, base_own = rl.rollout(examples, 3, SAMPLED, 7), base.rollout(examples, 3, SAMPLED, 7)
    assert not torch.equal(own.payload.completion_ids[:, :1], base_own.payload.completion_ids[:, :1])  # they differ
    with logits_extrapolation(rl, base, 1.0):
        at_one = rl.rollout(examples, 3, SAMPLED, 7)
    assert torch.equal(at_one.payload.completion_ids, own.payload.completion_ids)  # bit for bit
    assert torch.equal(at_one.logp, own.logp)
    with logits_extrapolation(rl, base, 0.0):
        at_zero = rl.rollout(examples, 3, SAMPLED, 7)
    assert torch.equal(at_zero.payload.completion_ids, base_own.payload.completion_ids)
    assert torch.allclose(at_zero.logp, base_own.logp, atol=1e-5)  # the recorded log-probs are the combination's
    assert at_zero.outputs == base_own.outputs and rl.logits_guides == ()  # restored after the block


def vlm_plain_logits(policy, prompts: VisionPrompts, tokens: torch.Tensor) -> torch.Tensor:
    """[N, V]: the model's logits after each row's prompt + ``tokens`` [N, t], from one forward without a cache
    (the model places the 3-D positions itself from the token types and grids)."""
    inputs = prompts.vision_inputs()
    out = policy.model(input_ids=torch.cat([prompts.input_ids, tokens], 1),
                       attention_mask=torch.cat([prompts.attention_mask, torch.ones_like(tokens)], 1),
                       mm_token_type_ids=torch.nn.functional.pad(prompts.mm_token_type_ids, (0, tokens.shape[1])),
                       use_cache=False, **inputs)
    return out.logits[:, -1]


def test_vlm_each_step_combines_two_plain_forwards_of_the_same_multimodal_prefix():
    """A hand-run of three decoding steps over a group of 2 per prompt: the processor's output equals
    z_base + α·(z_RL − z_base) with both logits from full forwards of prompt + tokens (no cache)."""
    rl, base = vlm_pair()
    prompts = rl.encode(vlm_examples())
    rows = prompts.select(torch.arange(prompts.num_rows).repeat_interleave(2))  # [6 rows]: the group of 2
    alpha = 1.5
    processor = LogitsExtrapolation(base.model, alpha, prompts, 2)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.zeros(rows.num_rows, 0, dtype=torch.long)
    with torch.no_grad():
        for step in range(3):
            z_rl, z_base = vlm_plain_logits(rl, rows, tokens), vlm_plain_logits(base, rows, tokens)
            out = processor(torch.cat([rows.input_ids, tokens], 1), z_rl)
            assert torch.allclose(out, z_base + alpha * (z_rl - z_base), atol=1e-4), step
            assert (z_rl - z_base).abs().max() > 0.1  # the two models' logits differ, so the check can fail
            # the next tokens: ordinary text ids (past the 13 special ones), differing between a group's two rows
            tokens = torch.cat([tokens, torch.randint(20, 600, (rows.num_rows, 1), generator=generator)], 1)


def test_vlm_refusals_name_the_mismatch(sanity_config):
    rl, base = vlm_pair()
    base.processor.tokenizer.add_tokens(["<extra_token>"])  # another vocabulary
    with pytest.raises(ValueError, match="share one tokenizer"):
        with logits_extrapolation(rl, base, 1.5):
            pass
    text_rl, _ = two_policies(sanity_config)
    with pytest.raises(TypeError, match="one kind of policy"):
        with logits_extrapolation(rl, text_rl, 1.5):
            pass
    vllm = make_policy("vlm", {"model_spec": "vlm/qwen2_5_vl_tiny.json", "max_prompt_tokens": 256, "sampler": "vllm"})
    with pytest.raises(ValueError, match="sampler: hf"):
        with logits_extrapolation(vllm, vlm_pair()[1], 1.5):
            pass
    wide = make_policy("vlm", {"model_spec": "vlm/qwen2_5_vl_tiny.json", "max_prompt_tokens": 256,
                               "max_pixels": 6272})
    with pytest.raises(ValueError, match="max_pixels"):
        with logits_extrapolation(rl, wide, 1.5):
            pass
    assert rl.logits_guides == ()


def test_mmrl_eval_extrapolates_a_vlm_recipe_from_a_base_folder(tmp_path, capsys):
    """``mmrl eval configs/data/tiny_cpu.yaml --model RL --base BASE --extrapolate-logits α`` on the VQA data task:
    α = 1 gives the "RL" model's own metrics (greedy and pass@2: here a short warm start), α = 0 the base's
    (the untrained model it started from); ``--base warm_start`` names the config's cached warm start."""
    from mmrl.core.config import load_config
    from mmrl.core.warm_start import build_initial_policy

    cfg = load_config("configs/data/tiny_cpu.yaml", [*QUIET, "warm_start.sft_steps=40"])
    rl, base = build_initial_policy(cfg).eval(), make_policy(cfg.policy.name, cfg.policy.args).eval()
    rl.save_pretrained(str(tmp_path / "rl"))
    base.save_pretrained(str(tmp_path / "base"))

    def evaluate(model: str, *extra: str) -> dict:
        report = tmp_path / "eval.json"
        assert main(["eval", "configs/data/tiny_cpu.yaml", "--model", str(tmp_path / model), "--num-examples", "12",
                     "--k", "2", *extra, "--json", str(report)]) == 0
        return json.loads(report.read_text())["metrics"]["test"]

    rl_alone, base_alone = evaluate("rl"), evaluate("base")
    assert rl_alone != base_alone
    assert evaluate("rl", "--extrapolate-logits", "1", "--base", str(tmp_path / "base")) == rl_alone
    assert evaluate("rl", "--extrapolate-logits", "0", "--base", str(tmp_path / "base")) == pytest.approx(base_alone)
    # the cached warm start of this config (the "RL" model here) as the base, at α = 0
    assert evaluate("base", "warm_start.sft_steps=40", "--extrapolate-logits", "0",
                    "--base", "warm_start") == pytest.approx(rl_alone)
    capsys.readouterr()
    assert main(["eval", "configs/data/tiny_cpu.yaml", "warm_start.sft_steps=41", "--model", str(tmp_path / "rl"),
                 "--extrapolate-logits", "0", "--base", "warm_start"]) == 2  # none cached for 41 steps
    assert "no cached warm start" in capsys.readouterr().err
