"""EXPO-FT (seed #89): the Q-guided choice (golden, and the learner's selection against its critic), the edit
bound, the tanh-Gaussian density, the TD target with the selected a', the decisions' stored / executed round trip,
recipe-time refusals, the learner through the trainer (acting through the selection; exact resume, 4 steps against
2 + 2) and a learning check of the offline phase (critic, edit actor and base BC together)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from mmrl.algos.offpolicy import (EditActor, OnTheFlyCritic, TransitionBuffer, episode_from_demonstration,
                                  q_guided_choice, tanh_gaussian_logprob)
from mmrl.algos.offpolicy.expo_ft import EXPOFTParams
from mmrl.algos.offpolicy.wsrl import critic_settings
from mmrl.core.config import ConfigError, load_config
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train
from mmrl.policies.vla import VLAConfig, VLAPolicy

RECIPE = "vla_reach/expo_ft_tiny_cpu"
QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = [*QUIET, "task.args.image_size=32", "policy.args.image_size=32", "warm_start.sft_steps=10",
        "algo.extra.expo_ft.offline_demos=4", "algo.extra.expo_ft.offline_steps=4", "algo.extra.expo_ft.batch_size=32",
        "algo.extra.expo_ft.critic_width=32", "algo.extra.expo_ft.edit_width=32", "rollout.prompts_per_step=4",
        "trainer.minibatches=2", "eval.num_examples=4", "eval.extra_splits=[]", "eval.every=0", "checkpoint.every=1"]


# -- pure pieces ---------------------------------------------------------------------------------------------

def test_q_guided_choice_golden():
    """Two states, three candidates, two members. State 0: min over members [1, 0, 2] → candidate 2; mean
    [1, 1.5, 2] → candidate 2. State 1: min [0, 4, 4] → the first of the tie, 1; mean [2.5, 4, 4.5] → 2."""
    candidates = torch.tensor([[[0.0], [1.0], [2.0]], [[3.0], [4.0], [5.0]]])
    q = torch.tensor([[[1.0, 3.0, 2.0], [0.0, 4.0, 5.0]],
                      [[1.0, 0.0, 2.0], [5.0, 4.0, 4.0]]])  # [E=2, B=2, K=3]
    chosen, index = q_guided_choice(candidates, q, "min")
    assert index.tolist() == [2, 1] and chosen.tolist() == [[2.0], [4.0]]
    chosen, index = q_guided_choice(candidates, q, "mean")
    assert index.tolist() == [2, 2] and chosen.tolist() == [[2.0], [5.0]]
    with pytest.raises(ValueError, match="'min' or 'mean'"):
        q_guided_choice(candidates, q, "max")


def test_tanh_gaussian_logprob_matches_a_tanh_transformed_normal():
    torch.manual_seed(0)
    mean, log_std, u = torch.randn(5, 3), torch.randn(5, 3) * 0.5, torch.randn(5, 3) * 2
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()]).log_prob(torch.tanh(u)).sum(-1)
    assert torch.allclose(tanh_gaussian_logprob(u, mean, log_std), reference, atol=1e-4)


def test_edits_are_bounded_by_the_edit_scale():
    """Whatever the edit actor outputs, an edited action moves by at most β per dimension (and stays in [−1, 1]);
    a saturated actor moves it by β (to float32 precision), a fresh one not at all on average (μ = 0)."""
    actor = EditActor(features=4, action_size=2, width=8)
    h, base = torch.randn(64, 4), torch.rand(64, 2) * 1.2 - 0.6
    e, logp = actor.rsample(h, base, torch.Generator().manual_seed(0))
    assert torch.equal(actor.rsample(h, base, torch.Generator().manual_seed(0))[0], e)  # seeded
    assert e.abs().max() < 1 and logp.shape == (64,)
    assert torch.equal(actor.rsample(h, base, torch.Generator(), temperature=0.0)[0], torch.zeros(64, 2))
    with torch.no_grad():
        actor.net[-1].bias[:2] = 50.0  # μ far positive: tanh(u) = 1
    e, _ = actor.rsample(h, base, torch.Generator().manual_seed(1))
    beta = 0.2
    edited = (base + beta * e).clamp(-1, 1)
    assert ((edited - base).abs() <= beta + 1e-6).all()
    assert torch.allclose(edited - base, torch.full_like(base, beta), atol=1e-5)


@pytest.mark.parametrize("squash", ["none", "tanh"])
def test_stored_decisions_execute_the_chosen_actions(squash):
    policy = VLAPolicy.from_config(VLAConfig(action_head="gaussian", squash=squash, value_head=False, image_size=32))
    actions = torch.tensor([[-1.0, 1.0], [0.3, -0.999], [0.0, 0.5]])
    assert torch.allclose(policy.executed_decisions(policy.stored_decisions(actions)), actions, atol=1e-5)


# -- the learner's selection and TD target on a tiny policy ------------------------------------------------

def tiny_learner(seed: int = 0) -> tuple[OnTheFlyCritic, TransitionBuffer]:
    """A learner around a tiny Gaussian VLA and a buffer of 3 reach demonstrations (32 px)."""
    policy = VLAPolicy.from_config(VLAConfig(action_head="gaussian", value_head=False, image_size=32, init_seed=seed))
    p = EXPOFTParams(critic_width=16, edit_width=16, num_candidates=3)
    learner = OnTheFlyCritic(policy, critic_settings(p, 0.9, True), seed, p)
    task = make_task("robot/reach-v0", {"image_size": 32})
    buffer = TransitionBuffer(200, 0.9, chunked=True)
    for example in task.sample_batch("train", 3, np.random.default_rng(0)):
        demo = task.reference_output(example)
        buffer.add(episode_from_demonstration(demo, policy.encode_instructions([demo.instruction])[0].numpy(), 1))
    return learner, buffer


def test_selection_is_the_argmax_of_the_critic_over_base_samples_and_their_edits():
    learner, buffer = tiny_learner()
    batch = buffer.sample(8, torch.Generator().manual_seed(0))
    policy = learner.policy
    with torch.no_grad():
        h = policy.features(batch.images, batch.proprio, batch.instruction_ids)
        candidates = learner.propose(h, 1.0, torch.Generator().manual_seed(3))  # [8, 6, 2]
        chosen, edited = learner.select(batch.images, batch.proprio, batch.instruction_ids, h, 1.0,
                                        torch.Generator().manual_seed(3))
        q = learner.critic.q(learner.critic.features(batch.images, batch.proprio, batch.instruction_ids), candidates)
    assert candidates.shape == (8, 6, 2)
    edits = candidates[:, 3:] - candidates[:, :3]
    assert (edits.abs() <= learner.edit_scale + 1e-6).all() and edits.abs().max() > 0
    best = q.mean(0).argmax(1)  # select_reduce: mean
    assert torch.equal(chosen, candidates[torch.arange(8), best])
    assert torch.equal(edited, best >= 3)
    with torch.no_grad():  # greedy: the base's mean decision and its mean edit, whatever the generator
        greedy = learner.propose(h, 0.0, torch.Generator().manual_seed(9))
        assert greedy.shape == (8, 2, 2)
        assert torch.equal(greedy, learner.propose(h, 0.0, torch.Generator().manual_seed(1)))
        assert torch.equal(greedy[:, 0], policy.executed_decisions(policy.sample_actions(h, 0.0, torch.Generator())))


def test_td_target_bootstraps_from_the_selected_next_action():
    """y = Σ_k γ^k r_k + γ^c (1 − d) min_{i ∈ M} Q̄_i(s', a'), a' the online critic's choice among the candidates
    at s' (the same seeded draws, in the learner's order: candidates, then the target members)."""
    learner, buffer = tiny_learner()
    with torch.no_grad():  # move the target away from the online critic, so which critic is used matters
        for param in learner.target.heads.parameters():
            param.add_(0.3 * torch.randn(param.shape, generator=torch.Generator().manual_seed(5)))
    batch = buffer.sample(16, torch.Generator().manual_seed(1))
    y, _ = learner.targets(batch, torch.Generator().manual_seed(2))
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        h_next = learner.policy.features(batch.next_images, batch.next_proprio, batch.instruction_ids)
        a_next, _ = learner.select(batch.next_images, batch.next_proprio, batch.instruction_ids, h_next, 1.0, generator)
        members = torch.randperm(2, generator=generator)[:2]
        q_next = learner.target.q(learner.target.features(batch.next_images, batch.next_proprio,
                                                          batch.instruction_ids), a_next)[members].min(0).values
    expected = batch.rewards + 0.9 * (1 - batch.terminal) * q_next  # chunk 1: γ^1
    assert torch.allclose(y, expected, atol=1e-6)
    assert batch.terminal.sum() < len(batch.terminal)  # some rows bootstrap


# -- scripted interventions ----------------------------------------------------------------------------------

def test_runner_takeover_executes_the_scripted_expert_from_the_given_decision():
    """Episode 0 is taken over from its first decision: its executed actions are exactly the noise-free scripted
    demonstration's, and it succeeds as the demonstration does; episode 1 (−1) is never taken over and stays
    where the zero actions leave it; a takeover after decision 2 keeps the policy's first two decisions."""
    import gymnasium

    from mmrl.samplers.gym_runner import GymRunner
    from mmrl.tasks.robot.tabletop import demonstrate

    task = make_task("robot/reach-v0", {"image_size": 32})
    example = task.sample_batch("train", 1, np.random.default_rng(3))[0]
    runner = GymRunner(3, "sync", {"image_size": 32})

    def decide(images, proprio, instructions):
        return np.zeros((len(images), 1, 2), dtype=np.float32), {"marker": np.ones(len(images))}

    batch = runner.run([example.env_id] * 3, [example.seed] * 3, decide, chunk=1, max_decisions=30,
                       takeover_after=[0, -1, 2])
    demo = demonstrate(gymnasium.make(example.env_id, image_size=32), example.seed, 0.0)
    steps = len(demo.actions)
    assert batch.summaries[0].length == steps and batch.summaries[0].success == demo.success
    assert np.allclose(batch.expert_actions[0, :steps, 0], demo.actions, atol=1e-6)
    assert batch.intervened[0, :steps].tolist() == [1.0] * steps and not batch.intervened[1].any()
    assert batch.intervened[2, :2].tolist() == [0.0, 0.0] and batch.intervened[2, 2] == 1.0
    assert not batch.expert_actions[1].any() and not batch.summaries[1].success
    plain = runner.run([example.env_id], [example.seed], decide, chunk=1, max_decisions=30)
    assert plain.intervened is None and plain.summaries[0].length == batch.summaries[1].length


class StallEnv:
    """A 1-D line for the stall trigger: the state moves by the action (clipped to [−1, 1]); the reward is the
    progress x_t − x_{t−1}; the expert pushes +1; 12 steps."""

    @staticmethod
    def make():
        import gymnasium
        from gymnasium import spaces

        class Line(gymnasium.Env):
            observation_space = spaces.Dict({"image": spaces.Box(0, 255, (4, 4, 3), np.uint8),
                                             "proprio": spaces.Box(-np.inf, np.inf, (1,), np.float32),
                                             "instruction": spaces.Text(8)})
            action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

            def reset(self, seed=None, options=None):
                super().reset(seed=seed)
                self.x, self.t = 0.0, 0
                return self.obs(), {}

            def obs(self):
                return {"image": np.zeros((4, 4, 3), np.uint8), "proprio": np.array([self.x], np.float32),
                        "instruction": "go"}

            def step(self, action):
                before, self.t = self.x, self.t + 1
                self.x += float(np.clip(action[0], -1, 1))
                return self.obs(), self.x - before, False, self.t >= 12, {"success": False}

            def expert_action(self):
                return np.ones(1, np.float32)

        return Line()


def test_a_stall_triggered_takeover_waits_for_a_stalling_episode():
    """Rows 0 and 1 stand still from decision 2, row 2 keeps moving: with the stall trigger (w = 3, eligible from
    decision 1) rows 0 and 1 are taken over at decision 5, the first after three decisions without reward gained,
    row 2 never; row 1 is not chosen (−1). The fixed trigger takes row 2 over at its decision 1."""
    import gymnasium

    from mmrl.samplers.gym_runner import GymRunner

    if "test/StallLine-v0" not in gymnasium.registry:
        gymnasium.register("test/StallLine-v0", entry_point=StallEnv.make)
    runner = GymRunner(3, "sync")
    decision = [0]

    def decide(images, proprio, instructions):
        moving = np.array([[0.5], [0.5], [0.5]]) if decision[0] < 2 else np.array([[0.0], [0.0], [0.5]])
        decision[0] += 1
        return moving[:, None, :].astype(np.float32), {}

    batch = runner.run(["test/StallLine-v0"] * 3, [0, 1, 2], decide, chunk=1, max_decisions=12,
                       takeover_after=[1, -1, 1], stall_window=3)
    assert batch.intervened[0].tolist() == [0.0] * 5 + [1.0] * 7
    assert not batch.intervened[1].any() and not batch.intervened[2].any()
    assert batch.expert_actions[0, 5:, 0, 0].tolist() == [1.0] * 7 and batch.summaries[0].episode_return == 1.0 + 7.0
    decision[0] = 0
    fixed = runner.run(["test/StallLine-v0"] * 3, [0, 1, 2], decide, chunk=1, max_decisions=12,
                       takeover_after=[-1, -1, 1])
    assert fixed.intervened[2].tolist() == [0.0] + [1.0] * 11
    with pytest.raises(ValueError, match="stall_window must be >= 1"):
        runner.run(["test/StallLine-v0"], [0], decide, chunk=1, max_decisions=2, takeover_after=[0], stall_window=0)


def test_interventions_are_stored_flagged_counted_as_real_steps_and_join_the_bc_data(tmp_path):
    overrides = [*TINY, "trainer.steps=2", "algo.extra.expo_ft.interventions=0.5", "algo.extra.expo_ft.intervention_after=2",
                 "algo.extra.expo_ft.bc_data=demonstrations"]
    trainer = Trainer(load_config(RECIPE, overrides), tmp_path / "run")
    hook = trainer.loss_hooks[0][1]
    demo_decisions = len(hook.bc_data)
    rollout = trainer.policy.rollout(trainer.task.sample_batch("train", 8, np.random.default_rng(0)), 1,
                                     SamplingParams(1.0),
                                     seed=11)
    flags = rollout.payload.intervened
    assert flags is not None and 0 < int((flags.sum(1) > 0).sum()) < 8  # some episodes taken over, not all
    assert torch.equal(flags[:, :2], torch.zeros(8, 2))  # after the policy's first two decisions
    taken = flags.sum(1) > 0
    assert torch.equal(taken, torch.tensor(np.random.default_rng([11, 89]).random(8) < 0.5))
    trainer.train()
    rows = rows_of(tmp_path / "run")
    assert rows[-1]["expo/intervened_decisions"] > 0 and len(hook.bc_data) > demo_decisions
    assert rows[-1]["eval/real_env_steps"] == rows[-1]["offpolicy/env_steps"] + rows[1]["offline/transitions"]
    greedy = trainer.policy.rollout(trainer.task.sample_batch("test", 2, np.random.default_rng(0)), 1,
                                    SamplingParams(0.0),
                                    seed=11)
    assert greedy.payload.intervened is None  # evaluations are never taken over


# -- recipe-time refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["policy.args.action_head=tokens"], ("action_head: tokens samples discrete action tokens: algo.offpolicy: "
                                          "expo_ft needs continuous actions")),
    (["algo.offpolicy=wsrl", "policy.args.action_head=tokens"], "wsrl needs continuous actions"),
    (["algo.extra.expo_ft.cql_alpha=1.0"], "no conservative term"),
    (["algo.extra.expo_ft.edit_scale=0"], r"edit_scale must be in \(0, 2\]"),
    (["algo.extra.expo_ft.num_candidates=0"], "num_candidates must be >= 1"),
    (["algo.extra.expo_ft.backup_entropy=true"], "backup_entropy must be false"),
    (["algo.extra.expo_ft.warmup_steps=1"], "warmup_steps must be 0"),
    (["algo.extra.expo_ft.interventions=1.5"], r"interventions is a probability per episode, in \[0, 1\]"),
])
def test_bad_settings_are_refused_when_the_recipe_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [*QUIET, *overrides])


def test_a_consistency_base_is_accepted():
    """The base trains by BC only, so a head without log π may be the base (the edit actor has its own density)."""
    cfg = load_config(RECIPE, [*QUIET, "policy.args.action_head=consistency"])
    assert cfg.algo.offpolicy == "expo_ft"


# -- through the trainer ------------------------------------------------------------------------------------

def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("variant", [["algo.extra.expo_ft.bc_data=buffer"], ["algo.extra.expo_ft.interventions=0.5"]],
                         ids=["buffer_bc", "interventions"])
def test_expo_ft_acts_through_the_selection_and_resumes_exactly(tmp_path, variant):
    full = tmp_path / "full"
    trainer = Trainer(load_config(RECIPE, [*TINY, *variant, "trainer.steps=4"]), full)
    assert trainer.policy.action_selector is trainer.loss_hooks[0][1]
    trainer.train()
    rows = rows_of(full)
    assert "offline/edit_entropy" in rows[1] and rows[1]["offpolicy/online"] == 1.0 and rows[1]["policy/grad_norm"] > 0
    assert all(0 < r["expo/edited_chosen_frac"] < 1 for r in rows[1:])  # both kinds of candidates get executed
    assert rows[1]["offpolicy/buffer_transitions"] > rows[1]["offpolicy/env_steps"]  # the demonstrations are kept
    part = tmp_path / "part"
    train(load_config(RECIPE, [*TINY, *variant, "trainer.steps=2"]), part)
    Trainer(load_config(RECIPE, [*TINY, *variant, "trainer.steps=4"]), part, resume=True).train()

    def without_eval(row):  # the 2-step run also evaluated at its last step
        return {k: v for k, v in row.items() if not k.startswith("eval/")}

    assert [without_eval(r) for r in rows_of(part)[1:]] == [without_eval(r) for r in rows[1:]]
    a, b = (VLAPolicy.from_config(VLAConfig(action_head="gaussian", value_head=False, image_size=32,
                                            pretrained=str(run / "checkpoints" / "step_4" / "policy")))
            for run in (full, part))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    saved = [torch.load(run / "offpolicy" / "state_step_4.pt", weights_only=True)["learner"]["edit_actor"]
             for run in (full, part)]
    assert all(torch.equal(saved[0][k], saved[1][k]) for k in saved[0])


def test_offline_phase_fits_the_critic_climbs_q_with_the_edits_and_imitates(tmp_path):
    """From the BC warm start, 150 offline updates on 16 reach demonstrations: the TD error on the data falls, the
    edit actor's edits raise the critic's value over the base's own samples (the mean gain is positive and larger
    than at the start, where μ = 0), and the base's BC loss on the data falls (measured: TD error 0.24 → 0.16, edit
    gain 1e-4 → 0.015, BC loss 1.26 → 0.09; 9 s)."""
    def trainer_after(steps: int) -> Trainer:
        overrides = [*TINY, "algo.extra.expo_ft.offline_demos=16", f"algo.extra.expo_ft.offline_steps={steps}",
                     "algo.extra.expo_ft.batch_size=64", "trainer.lr=1e-3", "algo.extra.expo_ft.bc_data=buffer"]
        return Trainer(load_config(RECIPE, overrides), tmp_path / f"offline_{steps}")

    start, trained = trainer_after(0), trainer_after(150)
    hook = trained.loss_hooks[0][1]
    batch = hook.buffer.sample(256, torch.Generator().manual_seed(0))

    def measure(trainer: Trainer) -> tuple[float, float, float]:
        learner, policy = trainer.loss_hooks[0][1].learner, trainer.policy
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            y, _ = learner.targets(batch, generator)
            h_c = learner.critic.features(batch.images, batch.proprio, batch.instruction_ids)
            td = (learner.critic.q(h_c, batch.actions) - y[None]).abs().mean().item()
            h = policy.features(batch.images, batch.proprio, batch.instruction_ids)
            base = policy.executed_decisions(policy.sample_actions(h, 1.0, generator))
            edits, _ = learner.edit_actor.rsample(h, base, generator)
            gain = (learner.critic.q(h_c, learner.edited(base, edits)) - learner.critic.q(h_c, base)).mean().item()
            bc = policy.imitation_loss(h, batch.actions).item()
        return td, gain, bc

    (td0, gain0, bc0), (td1, gain1, bc1) = measure(start), measure(trained)
    assert td1 < 0.8 * td0, (td0, td1)
    assert gain1 > 0 and gain1 > gain0, (gain0, gain1)
    assert bc1 < bc0, (bc0, bc1)


def test_mmrl_eval_of_a_run_acts_through_its_learner_as_the_run_did(tmp_path):
    from mmrl.core.evaluate import EvalSettings, acting_learner_of, evaluate_target

    run = tmp_path / "run"
    cfg = load_config(RECIPE, [*TINY, "trainer.steps=2", "eval.every=2", "eval.num_examples=6"])
    train(cfg, run)
    logged = rows_of(run)[-1]
    assert acting_learner_of(str(run)) == "expo_ft" and acting_learner_of(str(tmp_path)) is None
    settings = EvalSettings(num_examples=6, seed=cfg.eval.seed, temperature=0.0)

    def measured(through_learner):
        return evaluate_target(RECIPE, str(run), TINY, ["test"], settings, through_learner=through_learner)["test"]

    through, alone = measured(True), measured(False)
    assert through["return_mean"] == pytest.approx(logged["eval/return_mean"], abs=1e-9)
    assert through["success_rate"] == logged["eval/success_rate"]
    assert alone["return_mean"] != pytest.approx(through["return_mean"], abs=1e-9)  # the base alone acts otherwise
    (run / "offpolicy" / "offline.pt").unlink()
    with pytest.raises(FileNotFoundError, match="offline result"):
        measured(True)


def test_demonstrations_are_retained_without_an_offline_phase(tmp_path):
    trainer = Trainer(load_config(RECIPE, [*TINY, "algo.extra.expo_ft.offline_steps=0"]), tmp_path / "run")
    learner = trainer.loss_hooks[0][1]
    assert len(learner.buffer) == sum(e.length for e in learner.offline_episodes()) > 0
    kept = Trainer(load_config(RECIPE, [*TINY, "algo.extra.expo_ft.offline_steps=0",
                                        "algo.extra.expo_ft.retain_offline=false"]), tmp_path / "dropped")
    assert len(kept.loss_hooks[0][1].buffer) == 0
