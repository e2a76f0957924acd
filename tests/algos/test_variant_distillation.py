"""Direct-OPD and SSB (mmrl/algos/variants/distillation.py): golden numbers by hand on tiny tensors, and the
hooks on the sanity policy (the teacher's log-ratio on the student's own tokens, the hinted distillation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmrl.algos import ADVANTAGE_ESTIMATORS, AdvantageInputs, AlgoConfig
from mmrl.algos.hooks import UpdateIndex
from mmrl.algos.variants.distillation import (DirectOpdParams, Ssb, direct_opd_advantages,
                                              distribution_distillation, hint_pairs)
from mmrl.core.config import ConfigError, load_config
from mmrl.core.contracts import FollowUp, RewardResult
from mmrl.core.registry import make_policy
from mmrl.core.rollout import SamplingParams
from mmrl.core.scored import Scored
from mmrl.core.trainer import Trainer

QUIET = ["log.progress=false", "log.tensorboard=false", "eval.every=0", "eval.num_examples=4",
         "warm_start.sft_steps=0", "rollout.prompts_per_step=4", "rollout.group_size=4", "trainer.minibatches=1",
         "trainer.steps=1"]


# -- Direct-OPD ---------------------------------------------------------------------------------------------


def test_direct_opd_advantages_golden():
    r = torch.tensor([[0.5, -1.0, 7.0], [0.2, 0.3, 0.1]])  # the teacher pair's log-ratio (7 sits on padding)
    kl = torch.tensor([[0.1, 0.2, 0.0], [0.0, 0.0, 0.4]])
    outcome = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = direct_opd_advantages(r, kl, outcome, mask, DirectOpdParams(beta=2.0, kl_coef=0.5, outcome_coef=0.25))
    # row 0: 2·0.5 − 0.5·0.1 + 0.25 = 1.2;  2·(−1) − 0.1 + 0.25 = −1.85;  padding 0
    # row 1: 0.4 − 0.25 = 0.15;  0.6 − 0.25 = 0.35;  0.2 − 0.2 − 0.25 = −0.25
    assert torch.allclose(adv, torch.tensor([[1.2, -1.85, 0.0], [0.15, 0.35, -0.25]]))


def test_direct_opd_estimator_reads_the_implicit_rewards_and_the_kl():
    mask = torch.ones(2, 2)
    inputs = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), mask=mask, group_id=torch.tensor([0, 0]),
                             kl=torch.tensor([[0.5, 0.0], [0.0, 1.0]]),
                             implicit_rewards=torch.tensor([[1.0, 2.0], [-1.0, 0.0]]))
    cfg = AlgoConfig(advantage="direct_opd", extra={"direct_opd": {"teacher": "unused"}})
    adv, returns = ADVANTAGE_ESTIMATORS.get("direct_opd")(inputs, cfg)
    assert returns is None
    assert torch.allclose(adv, torch.tensor([[0.5, 2.0], [-1.0, -1.0]]))  # β = λ = 1, no outcome term
    with pytest.raises(ValueError, match="implicit_rewards"):
        ADVANTAGE_ESTIMATORS.get("direct_opd")(AdvantageInputs(inputs.rewards, mask, inputs.group_id, kl=inputs.kl),
                                               cfg)


def saved_teacher(cfg, folder, shift: float):
    """The recipe's initial policy (no warm start) with every weight moved by ``shift``, saved to ``folder``."""
    teacher = make_policy(cfg.policy.name, cfg.policy.args)
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(shift * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    teacher.save_pretrained(str(folder))
    return teacher


def test_teacher_shift_is_the_teacher_pairs_log_ratio_on_the_students_tokens(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.advantage=direct_opd",
                                          f"algo.extra.direct_opd={{teacher: {tmp_path / 'teacher'}}}"])
    teacher = saved_teacher(cfg, tmp_path / "teacher", 0.05)
    trainer = Trainer(cfg, tmp_path / "run")
    batch = trainer.collect()
    rollout = batch.rollout
    shift = batch.row_inputs["implicit_rewards"]
    with torch.no_grad():  # the base is the student's initial policy: the trainer's policy before any update
        expected = (teacher.eval()(rollout).logp - trainer.policy(rollout).logp) * rollout.mask
    assert shift.abs().sum() > 0 and torch.allclose(shift, expected, atol=1e-5)
    advantages, _, _ = trainer.advantages(batch)  # step 1: π_old = π_ref, so the KL part is 0
    assert torch.allclose(advantages, shift, atol=1e-5)


def test_direct_opd_needs_a_teacher_that_exists(tmp_path):
    with pytest.raises(ConfigError, match="teacher"):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, "algo.advantage=direct_opd"]), tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="direct_opd.teacher"):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, "algo.advantage=direct_opd",
                                                f"algo.extra.direct_opd={{teacher: {tmp_path}}}"]), tmp_path / "b")
    with pytest.raises(ConfigError, match="ref_model"):  # the KL part needs a reference
        load_config("sanity/tiny_cpu", [*QUIET, "algo.advantage=direct_opd", "trainer.ref_model=none"])


# -- SSB ----------------------------------------------------------------------------------------------------


def test_distribution_distillation_golden():
    teacher = torch.log(torch.tensor([[[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]]]))  # one row, two tokens, V = 3
    student = torch.log(torch.tensor([[[0.25, 0.5, 0.25], [0.3, 0.3, 0.4]]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 0.0]])  # the second token is padding
    loss = distribution_distillation(teacher, student, mask, temperature=2.0)
    # KL = 0.5·ln(0.5/0.25) + 0.5·ln(1) + 0 (no teacher mass) = 0.5·ln 2; × T² = 4
    assert math.isclose(loss.item(), 4 * 0.5 * math.log(2), rel_tol=1e-6)
    loss.backward()
    # ∂/∂ log q_v = −T²·p_v on the real token, nothing on padding
    assert torch.allclose(student.grad, torch.tensor([[[-2.0, -2.0, 0.0], [0.0, 0.0, 0.0]]]))


def test_distribution_distillation_ignores_ids_both_suppress():
    inf = float("-inf")
    teacher = torch.tensor([[[math.log(0.5), math.log(0.5), inf]]])
    student = torch.tensor([[[math.log(0.5), math.log(0.5), inf]]], requires_grad=True)
    loss = distribution_distillation(teacher, student, torch.ones(1, 1), 1.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(student.grad).all()


def scored(outputs, outcome, example_index, examples):
    from mmrl.core.rollout import Rollout

    n = len(outputs)
    index = torch.tensor(example_index)
    rollout = Rollout(logp=torch.zeros(n, 1), mask=torch.ones(n, 1), group_id=index.clone(), example_index=index,
                      outputs=list(outputs), payload=None, policy_version=0)
    return Scored(rollout, list(examples), [RewardResult(float(o)) for o in outcome], torch.tensor(outcome),
                  torch.tensor(outcome))


def test_hint_pairs_take_a_correct_answer_and_the_most_common_wrong_one():
    batch = scored(["a", "b", "b", "c", "x", "y", "p", "q"], [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5],
                   [0, 0, 0, 0, 1, 1, 2, 2], ["e0", "e1", "e2"])
    assert hint_pairs(batch, 1.0) == [(0, "a", "b")]  # group 1 all correct, group 2 all wrong
    assert hint_pairs(batch, 0.5) == [(0, "a", "b"), (2, "q", "p")]


def test_ssb_distils_the_hinted_answer_into_the_bare_prompt(tmp_path):
    cfg = load_config("sanity/tiny_cpu", [*QUIET, "algo.ssb=true",
                                          "algo.extra.ssb={hint_template: '{correct}>{incorrect}>', "
                                          "success_threshold: 0.0}"])
    trainer = Trainer(cfg, tmp_path / "run")
    hook = dict(trainer.loss_hooks)["ssb"]
    assert isinstance(hook, Ssb)
    examples = trainer.task.sample_batch("train", 2, np.random.default_rng(3))
    # hand-set outcomes: −1 marks a wrong answer (every real score is ≥ 0, so every teacher answer is kept)
    hook.prepare(scored(["12", "34", "56", "78"], [1.0, -1.0, 1.0, -1.0], [0, 0, 1, 1], examples))
    assert hook.hinted == [FollowUp(examples[0], (("user", "12>34>"),)), FollowUp(examples[1], (("user", "56>78>"),))]
    assert hook.bases == examples and len(hook.answers) == 2
    term, metrics = hook.update_term(UpdateIndex(1, 0, 0))
    with torch.no_grad():
        teacher, _ = hook.teacher.completion_log_distributions(hook.hinted, hook.answers, 2.0)
    student, mask = trainer.policy.completion_log_distributions(hook.bases, hook.answers, 2.0)
    assert math.isclose(term.item(), distribution_distillation(teacher, student, mask, 2.0).item(), rel_tol=1e-5)
    assert term.item() > 0 and metrics["loss/ssb_kd"] == term.item()
    term.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.policy.parameters())
    assert hook.update_term(UpdateIndex(1, 1, 0)) is None  # once per step


def test_ssb_and_cipo_refuse_texts_the_policy_cannot_encode(tmp_path):
    with pytest.raises(ConfigError, match="hint_template"):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, "algo.ssb=true"]), tmp_path / "a")
    with pytest.raises(ConfigError, match="instruction"):
        Trainer(load_config("sanity/tiny_cpu", [*QUIET, "algo.cipo=true"]), tmp_path / "b")


def test_policy_distributions_agree_with_its_token_log_probs(sanity_config):
    cfg = sanity_config("warm_start.sft_steps=0")
    policy = make_policy(cfg.policy.name, cfg.policy.args)
    examples = [type("E", (), {"prompt": "123>"})(), type("E", (), {"prompt": "45>"})()]
    outputs = ["321", "5"]
    logp_all, mask = policy.completion_log_distributions(examples, outputs, 0.7)
    scored_rows = policy.rollout_from_outputs(examples, outputs, SamplingParams(0.7))
    ids = scored_rows.payload.completion_ids
    picked = logp_all.gather(-1, ids[..., None]).squeeze(-1)
    picked = torch.where(mask > 0, picked, torch.zeros_like(picked))  # padding is the suppressed pad id: −inf
    assert torch.equal(mask, scored_rows.mask) and torch.allclose(picked, scored_rows.logp, atol=1e-6)
