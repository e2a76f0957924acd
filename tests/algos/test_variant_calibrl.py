"""CalibRL (arXiv 2602.20197) on the extra-loss-term axis (mmrl/algos/variants/loss_terms.py): golden numbers
of the calibration term on hand-built rows (pass / fail, LeakyReLU slope, |A| weighting, masks, position
alignment when expert and sample lengths differ), composition with clip-higher / dual-clip PPO and every loss
aggregation, and the trainer wiring: the expert rows stay out of the group and the PPO term, their π_old is
the policy's own log-prob of the reference output, losses are finite, and resume is exact."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algos import AGGREGATIONS, POLICY_LOSSES, AlgoConfig, aggregate
from mmrl.algos.variants import LOSS_TERMS, LossTermInputs, LossTermRows, algo_needs
from mmrl.algos.variants.loss_terms import align_positions, calibration_term
from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train

# row 0 passes, row 1 fails; the sample has 3 positions, the expert 2 (row 1's sample has 2 real tokens)
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -0.9]])
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
EXPERT = torch.tensor([[-1.5, -1.0], [-0.7, -0.1]])
EXPERT_MASK = torch.ones(2, 2)
PASSED = torch.tensor([True, False])
ABS_ADV = torch.tensor([[2.0, 2, 2], [0.5, 0.5, 0.5]])


def test_calibration_term_golden():
    logp = LOGP.clone().requires_grad_(True)
    term = calibration_term(logp, EXPERT, EXPERT_MASK, MASK, PASSED, ABS_ADV, slope=0.5)
    # row 0 (pass, sign +1): g = −(logp − e) = [−0.5, 1.0, (no expert token)] → LeakyReLU [−0.25, 1.0, 0] × 2
    # row 1 (fail, sign −1): g = logp − e = [0.5, −2.9, (padding)] → [0.5, −1.45, 0] × 0.5
    assert_close(term.detach(), torch.tensor([[-0.5, 2.0, 0.0], [0.25, -0.725, 0.0]]))
    term.sum().backward()
    # d/dlogp: pass rows −slope·|A| (g < 0) or −|A| (g > 0); failed rows +|A| or +slope·|A|
    assert_close(logp.grad, torch.tensor([[-1.0, -2.0, 0.0], [0.5, 0.25, 0.0]]))


def test_slope_one_is_linear_and_zero_is_a_relu():
    linear = calibration_term(LOGP, EXPERT, EXPERT_MASK, MASK, PASSED, torch.ones(2, 3), slope=1.0)
    assert_close(linear[:, :2], torch.tensor([[-0.5, 1.0], [0.5, -2.9]]))
    relu = calibration_term(LOGP, EXPERT, EXPERT_MASK, MASK, PASSED, torch.ones(2, 3), slope=0.0)
    assert_close(relu[:, :2], torch.tensor([[0.0, 1.0], [0.5, 0.0]]))


def test_zero_advantage_and_masks_remove_the_term():
    assert torch.all(calibration_term(LOGP, EXPERT, EXPERT_MASK, MASK, PASSED, torch.zeros(2, 3), 0.5) == 0)
    no_expert = calibration_term(LOGP, EXPERT, torch.zeros(2, 2), MASK, PASSED, ABS_ADV, 0.5)
    assert torch.all(no_expert == 0)
    empty = calibration_term(LOGP, EXPERT, EXPERT_MASK, torch.zeros(2, 3), PASSED, ABS_ADV, 0.5)
    assert torch.all(empty == 0) and torch.isfinite(empty).all()


def test_positions_align_when_the_expert_is_longer_or_shorter():
    values, mask = align_positions(torch.tensor([[1.0, 2, 3, 4]]), torch.tensor([[1.0, 1, 1, 0]]), 2)
    assert values.tolist() == [[1.0, 2.0]] and mask.tolist() == [[1.0, 1.0]]
    values, mask = align_positions(torch.tensor([[1.0]]), torch.tensor([[1.0]]), 3)
    assert values.tolist() == [[1.0, 0.0, 0.0]] and mask.tolist() == [[1.0, 0.0, 0.0]]
    # an expert longer than the sample: its tokens past T are ignored; position t meets position t
    long_expert = torch.tensor([[-1.5, -1.0, -0.3, -9.0]])
    term = calibration_term(LOGP[:1], long_expert, torch.ones(1, 4), MASK[:1], PASSED[:1], ABS_ADV[:1], 0.5)
    assert_close(term, torch.tensor([[-0.5, 2.0, 0.4]]))  # g_2 = −(−0.5 − (−0.3)) = 0.2, × |A| = 2


def rows(outcome):
    return LossTermRows(torch.tensor(outcome), EXPERT, EXPERT_MASK)


def test_registered_term_weights_by_coef_and_passes_strictly_above_the_threshold():
    cfg = AlgoConfig(loss_terms=("calibrl",), extra={"calibrl": {"coef": 0.1}})
    adv = torch.tensor([[2.0, 2, 2], [-0.5, -0.5, -0.5]])  # |A| is what weighs, not A
    inputs = LossTermInputs(LOGP, LOGP, adv, MASK, rows([0.11, 0.1]))  # 0.1 is not > 0.1: row 1 fails
    loss, metrics = LOSS_TERMS.get("calibrl")(inputs, cfg)
    assert_close(loss, 0.1 * torch.tensor([[-0.5, 2.0, 0.0], [0.25, -0.725, 0.0]]))
    assert metrics["policy/calibrl_pass_rate"] == 0.5
    # both rows fail: row 0's sign flips (g = logp − e = [0.5, −1.0] → [0.5, −0.5] × 2)
    loss, _ = LOSS_TERMS.get("calibrl")(LossTermInputs(LOGP, LOGP, adv, MASK, rows([0.0, 0.0])), cfg)
    assert_close(loss[0, :2], 0.1 * torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="expert rows"):
        LOSS_TERMS.get("calibrl")(LossTermInputs(LOGP, LOGP, adv, MASK, LossTermRows(torch.zeros(2), None, None)),
                                  cfg)


@pytest.mark.parametrize("clip", [{"clip_high": 0.28}, {"clip_high": 0.28, "dual_clip_c": 3.0}],
                         ids=["clip-higher", "dual-clip"])
@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_composes_with_ppo_clip_and_every_aggregation(clip, aggregation):
    """PPO + calibrl aggregated like the trainer does: on-policy the gradient is that of the aggregated
    −A·log π + coef·guided, and splitting the rows into micro-batches with the global denominators (the
    trainer's gradient accumulation) gives the same total."""
    cfg = AlgoConfig(loss_terms=("calibrl",), loss_agg=aggregation, **clip)
    adv = torch.tensor([[1.5, 1.5, 1.5], [-0.5, -0.5, -0.5]])
    term_rows = rows([1.0, 0.0])
    denominators = {"num_tokens": float(MASK.sum()), "num_seqs": 2.0, "norm_len": 4.0}

    def total(logp, index):
        pg, _ = POLICY_LOSSES.get("ppo_clip")(logp[index], LOGP[index], adv[index], MASK[index], cfg)
        term, _ = LOSS_TERMS.get("calibrl")(LossTermInputs(logp[index], LOGP[index], adv[index], MASK[index],
                                                           term_rows.select(index)), cfg)
        return aggregate(pg, MASK[index], aggregation, **denominators) + \
            aggregate(term, MASK[index], aggregation, **denominators)

    whole = LOGP.clone().requires_grad_(True)
    total(whole, torch.arange(2)).backward()
    split = LOGP.clone().requires_grad_(True)
    (total(split, torch.tensor([0])) + total(split, torch.tensor([1]))).backward()
    assert_close(split.grad, whole.grad)
    reference = LOGP.clone().requires_grad_(True)
    guided = 0.1 * calibration_term(reference, EXPERT, EXPERT_MASK, MASK, PASSED, adv.abs(), 0.5)
    (aggregate(-adv * reference * MASK, MASK, aggregation, **denominators)
     + aggregate(guided, MASK, aggregation, **denominators)).backward()
    assert_close(whole.grad, reference.grad)
    # off-policy beyond 1 + ε_high with A > 0: PPO gives row 0 no gradient, only the calibration term remains
    moved = (LOGP + math.log(1.5)).requires_grad_(True)
    pg, _ = POLICY_LOSSES.get("ppo_clip")(moved, LOGP, adv, MASK, cfg)
    aggregate(pg, MASK, aggregation, **denominators).backward()
    assert torch.all(moved.grad[0] == 0)


def test_recipe_selects_it_with_typed_parameters(sanity_config):
    cfg = sanity_config("algo.loss_terms=[calibrl]", "algo.extra={calibrl: {coef: 0.2}}")
    assert cfg.algo.loss_terms == ("calibrl",) and algo_needs(cfg.algo) == {"expert_rows"}
    with pytest.raises(ConfigError, match="coef"):
        sanity_config("algo.loss_terms=[calibrl]", "algo.extra={calibrl: {cof: 0.2}}")
    with pytest.raises(ConfigError, match="calibrl"):
        sanity_config("algo.loss_terms=[calibrlx]")


QUIET = ["log.progress=false", "log.tensorboard=false"]
SHORT = ["eval.num_examples=8", "rollout.prompts_per_step=8", "rollout.group_size=4", "warm_start.sft_steps=20"]


def calibrl_overrides():
    from mmrl.experiments.sweep import SWEEP_ARMS

    return list(SWEEP_ARMS.get("calibrl").overrides)


def test_trainer_keeps_expert_rows_out_of_the_group_and_feeds_their_old_log_probs(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, *SHORT, *calibrl_overrides(), "trainer.steps=1", "eval.every=0"])
    assert cfg.algo.dual_clip_c == 3.0 and not cfg.algo.norm_adv_by_std  # the paper's PPO-clip and Dr.GRPO
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.step = 1
    batch = trainer.collect()
    # only sampled rows are trained (and enter the baseline): the expert has no row, hence no PPO gradient
    assert batch.rollout.num_rows == 8 * 4 and batch.stats["rollout/generated"] == 8 * 4
    hook = dict(trainer.loss_hooks)["loss_terms"]
    hook.prepare(batch)
    term_rows = hook.rows
    references = [trainer.task.reference_output(e) for e in batch.examples]
    expert = trainer.policy.rollout_from_outputs(batch.examples, references, SamplingParams(1.0, 1.0, 8))
    index = batch.rollout.example_index
    assert_close(term_rows.expert_logp, expert.logp[index], rtol=0, atol=0)
    assert_close(term_rows.expert_mask, expert.mask[index], rtol=0, atol=0)
    with torch.no_grad():  # π_old of the expert: the policy's own log-prob of it before the update
        assert_close(trainer.policy(expert).logp * expert.mask, expert.logp)
    adv, returns, reference = trainer.advantages(batch)
    metrics = trainer.update(batch.rollout, adv, returns, reference)  # the hook prepared above
    assert math.isfinite(metrics["loss/calibrl"]) and metrics["loss/calibrl"] != 0.0
    assert math.isfinite(metrics["loss/total"]) and 0 <= metrics["policy/calibrl_pass_rate"] <= 1
    assert trainer.guard.skipped_updates == 0


def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_resume_is_exact(tmp_path):
    base = [*QUIET, *SHORT, *calibrl_overrides(), "checkpoint.every=2", "eval.every=2"]
    train(load_config("sanity/tiny_cpu", [*base, "trainer.steps=4"]), tmp_path / "full")
    train(load_config("sanity/tiny_cpu", [*base, "trainer.steps=2"]), tmp_path / "resumed")
    Trainer(load_config("sanity/tiny_cpu", [*base, "trainer.steps=4"]), tmp_path / "resumed", resume=True).train()
    full = rows_of(tmp_path / "full")
    assert rows_of(tmp_path / "resumed") == full
    assert all(math.isfinite(r["loss/calibrl"]) for r in full[1:])
