"""Guidance for prompts the policy fails (issue 24): SEELE, AMPO, EAPO, FEST (mmrl/algos/variants/guidance.py).

Golden numbers for each formula / selection rule, the hooks' rows in a real trainer on the text sanity policy,
and exact resume for the hooks with state (SEELE's fits, EAPO's buffer)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from mmrl.algos.hooks import Round, UpdateIndex
from mmrl.algos.variants.history import prompt_key

from mmrl.algos.variants.guidance import (Experience, ExperienceBuffer, behaviour_logp, comprehension, fest_weight,
                                          fit_difficulty, hint_for_target, hint_prefix, irt_success,
                                          select_guidance)
from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train

QUIET = ["log.progress=false", "log.tensorboard=false"]
SHORT = ["eval.num_examples=8", "eval.every=0", "rollout.prompts_per_step=8", "rollout.group_size=4",
         "warm_start.sft_steps=20", "trainer.minibatches=1"]
FEW_PROMPTS = ["task.args.min_len=2", "task.args.max_len=2"]  # 80 training prompts: they come back within steps


def sanity(tmp_path, *overrides: str, name: str = "run", resume: bool = False) -> Trainer:
    return Trainer(load_config("sanity/tiny_cpu", [*QUIET, *SHORT, *overrides]), tmp_path / name, resume=resume)


def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def resume_is_exact(tmp_path, *overrides: str) -> dict:
    """Train 4 steps at once and 2 + 2 with a resume between: the same metrics; the step-2 hook state."""
    common = [*QUIET, *SHORT, *overrides, "checkpoint.every=2", "eval.every=2"]
    train(load_config("sanity/tiny_cpu", [*common, "trainer.steps=4"]), tmp_path / "full")
    train(load_config("sanity/tiny_cpu", [*common, "trainer.steps=2"]), tmp_path / "resumed")
    Trainer(load_config("sanity/tiny_cpu", [*common, "trainer.steps=4"]), tmp_path / "resumed", resume=True).train()
    assert rows_of(tmp_path / "resumed") == rows_of(tmp_path / "full")
    return json.loads((tmp_path / "resumed" / "checkpoints" / "step_2" / "trainer_state.json").read_text())["hooks"]


# -- SEELE ------------------------------------------------------------------------------------------------

def test_irt_curve_and_the_hint_that_reaches_the_target():
    assert float(irt_success(torch.tensor(0.5), 0.25, 8.0)) == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert hint_for_target(0.25, 8.0, 0.5) == pytest.approx(0.25)
    assert hint_for_target(0.25, 8.0, 1 / (1 + math.exp(-2.0))) == pytest.approx(0.5)
    assert hint_for_target(-1.0, 8.0, 0.5) == 0.0 and hint_for_target(2.0, 8.0, 0.5) == 1.0  # clipped to [0, 1]
    assert hint_prefix("2413", 0.5) == "24" and hint_prefix("2413", 0.3) == "2" and hint_prefix("2413", 0.0) == ""


def test_difficulty_fit_is_the_map_estimate():
    hints = torch.tensor([0.0, 0.0, 0.25, 0.5, 0.5, 0.75])
    successes = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    slope, mu, sd = 8.0, 0.0, 0.5

    def negative_log_posterior(b: float) -> float:  # the same objective, by scipy's bounded scalar search
        z = slope * (hints.double() - b)
        logsigmoid = torch.nn.functional.logsigmoid
        ll = (successes * logsigmoid(z) + (1 - successes) * logsigmoid(-z)).sum()
        return -(float(ll) - (b - mu) ** 2 / (2 * sd ** 2))

    expected = minimize_scalar(negative_log_posterior, bounds=(-2, 3), method="bounded").x
    assert fit_difficulty(hints, successes, slope, mu, sd) == pytest.approx(expected, abs=0.005)
    # failures without a hint push the difficulty (and so the hint) up; successes pull it back to 0
    assert fit_difficulty(torch.zeros(4), torch.zeros(4), slope, mu, sd) > 0.2
    assert hint_for_target(fit_difficulty(torch.zeros(4), torch.ones(4), slope, mu, sd), slope, 0.5) == 0.0


def test_seele_draws_hinted_rounds_and_records_what_it_saw(tmp_path):
    trainer = sanity(tmp_path, "algo.seele=true", "algo.extra.seele={prior_mean: 0.5}")  # no history: h = 0.5
    hook = dict(trainer.rollout_hooks)["seele"]
    batch = trainer.collect()
    rollout, task = batch.rollout, trainer.task
    assert rollout.num_rows == 8 * 4 and batch.stats["rollout/seele_hint_mean"] > 0
    for g in range(8):  # a group's rows: the first round's, then the second's
        first_round_row = int((rollout.example_index == g).nonzero()[0])
        reference = task.reference_output(batch.examples[g])
        assert rollout.outputs[first_round_row].startswith(reference[:round(0.5 * len(reference))])
    # the hint is context: the trained prompt holds it, and the decisions are only the continuation
    first = batch.examples[0]
    hinted_prompt = trainer.policy.tokenizer.decode(rollout.payload.prompt_ids[0][rollout.payload.prompt_mask[0] > 0])
    assert hinted_prompt.startswith(first.prompt) and len(hinted_prompt) > len(first.prompt)
    pairs = hook.pairs  # one (hint, success) pair per row, added after the step
    assert sum(len(v) for v in pairs.values()) == min(rollout.num_rows, 8 * hook.params.max_history)
    success = [float(r.score >= 1.0) for r in batch.results]
    assert sorted(s for v in pairs.values() for _, s in v) == sorted(success)


def test_seele_state_resumes_exactly(tmp_path):
    hooks = resume_is_exact(tmp_path, "algo.seele=true", *FEW_PROMPTS)
    assert hooks["seele"]["pairs"] and all(len(v) <= 16 for v in hooks["seele"]["pairs"].values())


# -- AMPO -------------------------------------------------------------------------------------------------

def test_comprehension_and_selection_rule():
    logp = torch.log(torch.tensor([[0.5, 0.5, 1.0], [0.9, 0.1, 0.0], [0.2, 0.2, 0.2]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert torch.allclose(comprehension(logp, mask), torch.tensor([0.5, 0.5, 0.2]))
    scores, usable = torch.tensor([0.3, 0.9, 0.5, 0.7]), torch.tensor([True, False, True, True])
    assert select_guidance(scores, usable, 2) == [3, 2]  # the best usable first; the unusable 0.9 never
    assert select_guidance(scores, usable, 9) == [3, 2, 0]


def test_ampo_replaces_failed_rows_with_teacher_answers_at_pi_old_one(tmp_path):
    # a group without an exact answer (score ≤ 0.99) gets the reference teacher's answer in one of its rows
    trainer = sanity(tmp_path, "algo.ampo=true", "algo.extra.ampo={fail_threshold: 0.99, max_rows: 1}")
    batch = trainer.collect()
    rollout, task = batch.rollout, trainer.task
    guided = 0
    for g in range(8):
        rows = (rollout.example_index == g).nonzero().squeeze(1).tolist()
        teacher = [i for i in rows if float(rollout.logp[i].abs().sum()) == 0.0]  # π_old = 1
        own = [i for i in rows if i not in teacher]
        assert len(rows) == 4  # the group keeps its size
        if max(float(batch.outcome[i]) for i in own) > 0.99:
            assert not teacher  # a group with a success gets no guidance
            continue
        guided += 1
        assert len(teacher) == 1 and rollout.outputs[teacher[0]] == task.reference_output(batch.examples[g])
        assert batch.outcome[teacher[0]] == 1.0
    assert batch.stats["rollout/ampo_guided_groups"] == guided == batch.stats["rollout/ampo_teacher_rows"]
    assert guided > 0


def test_ampo_leaves_groups_with_a_success_alone_and_loads_checkpoint_teachers(tmp_path):
    trainer = sanity(tmp_path, "algo.ampo=true", "algo.extra.ampo.fail_threshold=-1.0")
    assert trainer.collect().stats["rollout/ampo_guided_groups"] == 0
    trainer.policy.save_pretrained(str(tmp_path / "teacher"))
    teacher = sanity(tmp_path, "algo.ampo=true", f"algo.extra.ampo.teachers=[reference, {tmp_path / 'teacher'}]",
                     name="with_teacher")
    hook = dict(teacher.rollout_hooks)["ampo"]
    examples = teacher.task.sample_batch("train", 3, np.random.default_rng(0))
    answers = hook.teacher_answers(examples, seed=0)
    greedy = teacher.policy.rollout(examples, 1, SamplingParams(0.0, 1.0, 8), 0).outputs  # the same weights
    assert [a[0] for a in answers] == [teacher.task.reference_output(e) for e in examples]
    assert [a[1] for a in answers] == greedy
    with pytest.raises(ConfigError, match="nowhere"):
        sanity(tmp_path, "algo.ampo=true", "algo.extra.ampo.teachers=[nowhere]", name="bad")
    with pytest.raises(ConfigError, match="recompute_logp_old"):
        load_config("sanity/tiny_cpu", ["algo.ampo=true", "trainer.recompute_logp_old=true"])


# -- EAPO -------------------------------------------------------------------------------------------------

def test_experience_buffer_keeps_the_newest_distinct_answers():
    buffer = ExperienceBuffer(2)
    for output in ("a", "b", "a", "c"):
        buffer.add("k", Experience(output, (-0.5,), 0))
    assert [e.output for e in buffer.get("k")] == ["c", "a"] and buffer.get("other") == []
    copy = ExperienceBuffer(2)
    copy.load_state_dict(json.loads(json.dumps(buffer.state_dict())))
    assert copy.get("k") == buffer.get("k")
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logp = behaviour_logp([Experience("x", (-1.0, -2.0), 0), Experience("y", (-3.0,), 0)], mask)
    assert torch.equal(logp, torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="decisions"):
        behaviour_logp([Experience("x", (-1.0,), 0)], mask[:1])


def test_eapo_replays_stored_successes_with_their_behaviour_logprobs(tmp_path):
    # every row is a "success" (stored) and every group a "failure" (replayed into)
    trainer = sanity(tmp_path, "algo.eapo=true", "algo.extra.eapo={success_threshold: -1.0, fail_threshold: 2.0}")
    hook = dict(trainer.rollout_hooks)["eapo"]
    first = trainer.collect()
    assert first.stats["rollout/eapo_replayed_rows"] == 0  # a round replays only what earlier rounds stored
    keys = [prompt_key(e) for e in first.examples]
    stored = {k: list(hook.buffer.get(k)) for k in keys}
    assert all(len(v) == min(2, len({o for o, e in zip(first.rollout.outputs, first.rollout.example_index.tolist())
                                      if keys[e] == k})) for k, v in stored.items())
    sampling = SamplingParams(1.0, 1.0, 8)
    again = trainer.score(trainer.policy.rollout(first.examples, 4, sampling, 5), first.examples)  # the same prompts
    batch = hook.refine(again, Round(0, sampling, 5, trainer.draw))
    for g, key in enumerate(keys):
        rows = (batch.rollout.example_index == g).nonzero().squeeze(1).tolist()
        newest = stored[key][0]
        replayed = [i for i in rows if batch.rollout.outputs[i] == newest.output
                    and torch.equal(batch.rollout.logp[i, :len(newest.logp)], torch.tensor(newest.logp))]
        assert len(rows) == 4 and replayed  # one row replaced, π_old = the stored behaviour log-probs
    assert hook.metrics()["rollout/eapo_replayed_rows"] == 8


def test_eapo_buffer_resumes_exactly(tmp_path):
    hooks = resume_is_exact(tmp_path, "algo.eapo=true", *FEW_PROMPTS,
                            "algo.extra.eapo={success_threshold: 0.5, fail_threshold: 0.99}")
    assert hooks["eapo"]["buffer"]
    after_resume = rows_of(tmp_path / "resumed")[3:]  # steps 3 and 4 replay what the checkpoint's buffer held
    assert sum(r["rollout/eapo_replayed_rows"] for r in after_resume) > 0


# -- FEST -------------------------------------------------------------------------------------------------

def test_fest_weight_decays_geometrically():
    assert fest_weight(1, 2.0, 0.9) == 2.0
    assert fest_weight(3, 2.0, 0.9) == pytest.approx(2.0 * 0.81)


def test_fest_term_is_the_decayed_sft_loss_on_the_fixed_demonstrations(tmp_path):
    trainer = sanity(tmp_path, "algo.fest=true", "algo.extra.fest={demonstrations: 6, batch_size: 4, decay: 0.5}")
    hook = dict(trainer.loss_hooks)["fest"]
    again = sanity(tmp_path, "algo.fest=true", "algo.extra.fest={demonstrations: 6, batch_size: 4, decay: 0.5}",
                   name="again")
    assert dict(again.loss_hooks)["fest"].demos == hook.demos and len(hook.demos) == 6  # fixed by the seed
    index = UpdateIndex(3, 0, 0)
    term, metrics = hook.update_term(index)
    sft = metrics["loss/fest_sft"]
    assert float(term.detach()) == pytest.approx(0.25 * sft) and hook.metrics()["policy/fest_weight"] == 0.25
    term_again, _ = hook.update_term(index)  # the step's draw is seeded: the same demonstrations
    assert float(term_again.detach()) == pytest.approx(float(term.detach()))
    demos = {d.digits for d in hook.demos}
    losses = [trainer.policy.sft_loss([d], [trainer.task.reference_output(d)]).item() for d in hook.demos]
    assert min(losses) - 1e-5 <= sft <= max(losses) + 1e-5 and len(demos) == 6


# -- on the VLM (Qwen2.5-VL architecture, bring-your-own-data rows with images) ----------------------------

VLM = ["warm_start.sft_steps=5", "warm_start.vision_steps=0", "rollout.prompts_per_step=4", "rollout.group_size=4",
       "trainer.minibatches=1", "eval.num_examples=4", "eval.every=0", *QUIET]


@pytest.mark.parametrize("variant", [
    ["algo.seele=true"],
    ["algo.ampo=true", "algo.extra.ampo={fail_threshold: 0.5}"],
    ["algo.eapo=true", "algo.extra.eapo={success_threshold: -1.0, fail_threshold: 2.0}"],
    ["algo.fest=true", "algo.extra.fest={demonstrations: 8, batch_size: 4}"],
], ids=["seele", "ampo", "eapo", "fest"])
def test_guidance_variants_train_the_vlm(tmp_path, variant):
    trainer = Trainer(load_config("data/tiny_cpu", [*VLM, "trainer.steps=2", *variant]), tmp_path / "run")
    if "algo.eapo=true" in variant:  # replayed rows re-scored by the VLM keep their stored behaviour log-probs
        hook = dict(trainer.rollout_hooks)["eapo"]
        first = trainer.collect()
        sampling = SamplingParams(1.0, 1.0, trainer.cfg.rollout.max_new_tokens)
        again = trainer.score(trainer.policy.rollout(first.examples, 4, sampling, 5), first.examples)
        batch = hook.refine(again, Round(0, sampling, 5, trainer.draw))
        assert hook.metrics()["rollout/eapo_replayed_rows"] == 4 and batch.rollout.num_rows == 16
    trainer.train()
    rows = rows_of(tmp_path / "run")
    assert all(math.isfinite(r["loss/total"]) for r in rows[1:])
    name = variant[0].split(".")[1].split("=")[0]
    assert any(name in key for key in rows[-1])  # the hook's metrics are logged
