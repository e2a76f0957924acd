"""RECAP, NPO / AutoNPO and SCOPE-RL (issue 25; mmrl/algos/variants/programs.py).

Golden numbers for each rule, each hook's rows / terms in a real trainer on the text data task, exact resume
for the hooks with state, and the NPO program (a scout stage guiding the next)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from mmrl.algos.hooks import UpdateIndex
from mmrl.algos.variants.history import prompt_key
from mmrl.algos.variants.hooks import training_sampling
from mmrl.algos.variants.programs import (answer_steps, objective_weights, plateaued, prefix_credit, process_shape,
                                          scope_reward, signal_score)
from mmrl.core.config import ConfigError, load_config
from mmrl.core.program import plan, run_program
from mmrl.core.trainer import Trainer, train

RECIPE = "configs/data/text_tiny_cpu.yaml"
QUIET = ["log.progress=false", "log.tensorboard=false"]
SHORT = ["eval.num_examples=8", "eval.every=0", "rollout.prompts_per_step=8", "rollout.group_size=4",
         "warm_start.sft_steps=30", "trainer.minibatches=1"]


def text_trainer(tmp_path, *overrides: str, name: str = "run") -> Trainer:
    return Trainer(load_config(RECIPE, [*QUIET, *SHORT, *overrides]), tmp_path / name)


def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def resume_is_exact(tmp_path, *overrides: str) -> dict:
    """Train 4 steps at once and 2 + 2 with a resume between: the same metrics; the step-2 hook state."""
    common = [*QUIET, *SHORT, *overrides, "checkpoint.every=2", "eval.every=2"]
    train(load_config(RECIPE, [*common, "trainer.steps=4"]), tmp_path / "full")
    train(load_config(RECIPE, [*common, "trainer.steps=2"]), tmp_path / "resumed")
    Trainer(load_config(RECIPE, [*common, "trainer.steps=4"]), tmp_path / "resumed", resume=True).train()
    assert rows_of(tmp_path / "resumed") == rows_of(tmp_path / "full")
    state = json.loads((tmp_path / "resumed" / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    return state["hooks"] | state["loss_hooks"]


# -- RECAP ------------------------------------------------------------------------------------------------

def test_objective_weights_move_focus_from_saturated_to_stalled_and_volatile_objectives():
    flat, saturated = [1.0, 1.0, 1.0, 1.0], [1.0, 0.5, 0.1, 0.1]
    w = objective_weights([flat, saturated], window=2, temperature=1.0)
    s_sat = (0.1 + 1e-3) / (1.0 + 1e-3)
    assert w.tolist() == pytest.approx([2 / (1 + math.exp(s_sat - 1.0)), 2 / (1 + math.exp(1.0 - s_sat))])
    assert float(w.sum()) == pytest.approx(2.0)
    volatile = [1.0, 0.5, 1.5, 0.5]  # same recent mean as the flat one, coefficient of variation 1/2
    w = objective_weights([flat, volatile], window=2, temperature=1.0)
    # scores 1 and 1 + 0.5 / 1.001 → w₁ − w₀ = 2 tanh(Δ / 2)
    assert float(w[1] - w[0]) == pytest.approx(2 * math.tanh(0.5 * 0.5 / 1.001))
    # no evidence yet: equal weights; a lower temperature sharpens the shift
    assert objective_weights([[1.0], []], 4, 1.0).tolist() == [1.0, 1.0]
    soft, sharp = (objective_weights([flat, saturated], 2, t)[0] for t in (1.0, 0.25))
    assert sharp > soft > 1.0


def test_recap_replay_term_is_the_reweighted_sft_loss_on_the_warm_start_data(tmp_path):
    trainer = text_trainer(tmp_path, "algo.recap=true", "algo.extra.recap={replay_batch: 4, coef: 0.5, window: 3}")
    hook = dict(trainer.loss_hooks)["recap"]
    batch = trainer.collect()
    hook.prepare(batch)
    assert hook.task_losses == [pytest.approx(1.0 - float(batch.outcome.mean()))] and hook.replay_weight == 0.5
    loss, metrics = hook.update_term(UpdateIndex(1, 0, 0))
    replay = metrics["loss/recap_replay"]
    assert float(loss.detach()) == pytest.approx(0.5 * replay) and replay > 0
    hook.task_losses += [0.9, 0.9]  # a stalled task objective; the replay objective converging
    hook.replay_losses, hook.step_replay = [2.0, 1.0], [0.5]
    hook.prepare(batch)
    w = objective_weights([hook.task_losses, [2.0, 1.0, 0.5]], 3, 0.5)
    assert hook.replay_losses == [2.0, 1.0, 0.5] and hook.replay_weight == pytest.approx(0.5 * float(w[1] / w[0]))


def test_recap_needs_warm_start_data(tmp_path):
    with pytest.raises(ConfigError, match="warm_start.sft_steps"):
        text_trainer(tmp_path, "algo.recap=true", "warm_start.sft_steps=0")


def test_recap_state_resumes_exactly(tmp_path):
    hooks = resume_is_exact(tmp_path, "algo.recap=true", "algo.extra.recap={replay_batch: 4}")
    assert len(hooks["recap"]["task_losses"]) == 2 and len(hooks["recap"]["replay_losses"]) == 1


# -- NPO / AutoNPO ----------------------------------------------------------------------------------------

def test_signal_score_and_plateau_trigger():
    quality = torch.tensor([1.0, 1.0, 0.0, 0.0])
    guide = torch.tensor([[-0.5, -0.5], [-1.0, 0.0], [0.0, 0.0], [-2.0, 0.0]])
    policy = torch.tensor([[-1.5, -0.5], [-1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    # per-row token-mean squared log-ratio: 0.5, 0, 0, 4 → V = 0.1 + 1.125; Q = 0.5
    assert signal_score(quality, guide, policy, mask, 0.1) == pytest.approx(0.5 / 1.225)
    assert not plateaued([0.1, 0.2, 0.3], 2, 0.02)  # too short to tell
    assert not plateaued([0.1, 0.2, 0.4, 0.5], 2, 0.02)  # +0.3 over the window: still learning
    assert plateaued([0.4, 0.5, 0.46, 0.45], 2, 0.02)  # no gain
    assert plateaued([0.4, 0.4, 0.41, 0.41], 2, 0.02)  # +0.01 ≤ tolerance


@pytest.fixture(scope="module")
def guide_run(tmp_path_factory):
    """A 3-step run of the text task keeping every checkpoint: the near future of a run from its start."""
    out = tmp_path_factory.mktemp("guide") / "scout"
    train(load_config(RECIPE, [*QUIET, *SHORT, "trainer.steps=3", "checkpoint.every=1", "checkpoint.keep_last=0"]),
          out)
    return out


def test_npo_rows_come_from_the_guide_with_its_logprobs_as_pi_old(tmp_path, guide_run):
    trainer = text_trainer(tmp_path, "algo.npo=true", f"algo.extra.npo={{guide_run: {guide_run}, rows: 2, "
                                                       "guide_step: 2, end_step: 1}")
    hook = dict(trainer.rollout_hooks)["npo"]
    assert list(hook.guides) == [2]
    batch = trainer.collect()
    rollout, guide = batch.rollout, hook.guides[2]
    assert rollout.num_rows == 8 * 4 and batch.stats["rollout/npo_guide_step"] == 2
    assert batch.stats["rollout/npo_guide_rows"] == 16
    for g in range(8):
        rows = (rollout.example_index == g).nonzero().squeeze(1).tolist()
        assert len(rows) == 4
        last = rows[-2:]  # the guide's rows join the group after its two own samples
        examples = [batch.examples[g]] * 2
        outputs = [rollout.outputs[i] for i in last]
        mu = guide.rollout_from_outputs(examples, outputs, training_sampling(trainer.cfg)).logp
        width = mu.shape[1]  # the batch is padded to its longest row
        assert torch.allclose(rollout.logp[last][:, :width], mu, atol=1e-6)
        assert not rollout.logp[last][:, width:].any()
        own = trainer.policy.rollout_from_outputs(examples, outputs, training_sampling(trainer.cfg)).logp
        assert not torch.allclose(own, mu)  # π_old is the guide's, not the policy's
        assert batch.outcome[last].tolist() == [r.score for r in (batch.results[i] for i in last)]
    second = trainer.collect()  # after end_step: on-policy only
    assert second.stats["rollout/npo_guide_step"] == 0 and second.stats["rollout/npo_guide_rows"] == 0


def test_autonpo_chooses_the_checkpoint_with_the_largest_signal(tmp_path, guide_run):
    trainer = text_trainer(tmp_path, "algo.npo=true", f"algo.extra.npo={{guide_run: {guide_run}, auto: true, "
                                                       "bootstrap_steps: 1, plateau_window: 1, plateau_tolerance: -1.0}")
    hook = dict(trainer.rollout_hooks)["npo"]
    assert sorted(hook.guides) == [1, 2, 3]
    batch = trainer.collect()  # a bootstrap step: intervenes when some guide beats the policy's own rows
    chosen = batch.stats["rollout/npo_guide_step"]
    assert chosen in (0, 1, 2, 3) and hook.rewards == [pytest.approx(hook.rewards[0])]
    if chosen:
        assert batch.stats["rollout/npo_signal"] > 0
    hook.step = 5  # past bootstrapping; tolerance −1 means no plateau ever: on-policy
    hook.rewards = [0.1, 0.1]
    assert not hook.intervenes()
    hook.params = type(hook.params)(**{**hook.params.__dict__, "plateau_tolerance": 0.0})
    assert hook.intervenes()


def test_npo_refuses_a_missing_guide_and_recomputed_pi_old(tmp_path):
    with pytest.raises(ConfigError, match="guide_run"):
        text_trainer(tmp_path, "algo.npo=true", f"algo.extra.npo={{guide_run: {tmp_path / 'nowhere'}}}")
    with pytest.raises(ConfigError, match="algo.npo trains guide checkpoint rows"):
        load_config(RECIPE, ["algo.npo=true", "trainer.recompute_logp_old=true"])


def test_autonpo_state_resumes_exactly(tmp_path, guide_run):
    hooks = resume_is_exact(tmp_path, "algo.npo=true", f"algo.extra.npo={{guide_run: {guide_run}, auto: true, "
                                                        "bootstrap_steps: 1, plateau_window: 1}")
    assert hooks["npo"]["step"] == 2 and len(hooks["npo"]["rewards"]) == 2


def test_the_npo_recipe_plans_a_scout_and_a_guided_stage():
    stages = plan(load_config("configs/npo/text_tiny_cpu.yaml"))
    assert [s.spec.name for s in stages] == ["scout", "npo"]
    assert not stages[0].cfg.algo.npo and stages[1].cfg.algo.npo and stages[1].spec.init == "scout@start"
    assert stages[0].cfg.checkpoint.keep_last == 0


def test_an_npo_program_is_guided_by_its_scout_stage(tmp_path):
    data = yaml.safe_load(open("configs/npo/text_tiny_cpu.yaml"))
    data["algo"]["extra"]["npo"] = {"guide_run": "scout", "rows": 1, "auto": False}
    data["stages"][0]["overrides"] = {"trainer.steps": 2}
    path = tmp_path / "npo.yaml"
    path.write_text(yaml.safe_dump(data))
    out = run_program(load_config(str(path), [*QUIET, *SHORT, "trainer.steps=2", "checkpoint.every=1"]),
                      tmp_path / "out")
    rows = [r for r in rows_of(out) if r["stage"] == "npo" and "rollout/npo_guide_step" in r]
    assert len(rows) == 2 and all(r["rollout/npo_guide_step"] == 2 and r["rollout/npo_guide_rows"] == 8 for r in rows)


# -- SCOPE-RL ---------------------------------------------------------------------------------------------

def test_prefix_credit_and_process_shape():
    assert answer_steps("a = 1\n\nb = 2\n") == ["a = 1", "b = 2"] and answer_steps(" 12 ") == ["1", "2"]
    assert prefix_credit("a = 1\nb = 3", "a = 1\nb = 2\nc = 5") == pytest.approx(1 / 3)
    assert prefix_credit("b = 2", "a = 1\nb = 2") == 0.0  # only a prefix of the chain counts
    assert prefix_credit("12", "12") == 1.0 and prefix_credit("1", "12") == 0.5 and prefix_credit("", "12") == 0.0
    assert process_shape("12", "12") == 1.0 and process_shape("12 12", "12") == 0.4 and process_shape("", "12") == 0.0
    assert process_shape("a = 1\nb = 2\nb = 2\nc = 5", "a = 1\nb = 2\nc = 5") == 0.75


def test_scope_reward_switches_from_prefix_credit_to_gated_process_shape():
    # before the prompt is solved: failed rows earn credit, successes their outcome
    assert scope_reward(0.0, 0.5, 0.2, False, 1.0, 0.5, 0.2) == 0.25
    assert scope_reward(1.0, 1.0, 0.2, False, 1.0, 0.5, 0.2) == 1.0
    # after: correct rows scaled by their shape, wrong rows get no credit and no shape
    assert scope_reward(1.0, 1.0, 0.5, True, 1.0, 0.5, 0.2) == pytest.approx(0.9)
    assert scope_reward(0.0, 0.5, 1.0, True, 1.0, 0.5, 0.2) == 0.0


def test_scope_rl_shapes_rewards_and_remembers_solved_prompts(tmp_path):
    trainer = text_trainer(tmp_path, "algo.scope_rl=true", "algo.extra.scope_rl={credit_coef: 0.5, shape_coef: 0.2}")
    hook = dict(trainer.rollout_hooks)["scope_rl"]
    batch = trainer.collect()
    task, keys = trainer.task, [prompt_key(e) for e in batch.examples]
    for i, g in enumerate(batch.rollout.example_index.tolist()):
        reference, output = task.reference_output(batch.examples[g]), batch.rollout.outputs[i]
        want = scope_reward(float(batch.outcome[i]), prefix_credit(output, reference), 0.0, False, 1.0, 0.5, 0.2)
        assert float(batch.rewards[i]) == pytest.approx(want)  # nothing solved before the first round
    solved = {keys[g] for g in batch.rollout.example_index[batch.outcome >= 1.0].tolist()}
    assert hook.solved == solved and batch.stats["rollout/scope_solved_prompts"] == len(solved)
    assert batch.stats["rollout/scope_scaffolded_rows"] == batch.rollout.num_rows


def test_scope_rl_state_resumes_exactly(tmp_path):
    hooks = resume_is_exact(tmp_path, "algo.scope_rl=true")
    assert hooks["scope_rl"]["solved"]
