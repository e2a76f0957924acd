"""ConRFT (seed #90): the consistency action head (golden scalings, noise levels and BC loss; the boundary
condition f(x, σ_min) = x; seeded, differentiable sampling), Cal-QL's term for a deterministic actor, the
recipe-time refusals of everything that needs log π, the learner through the trainer (exact resume, 4 steps
against 2 + 2, with and without scripted interventions), the scripted interventions (every training episode taken
over at p = 1, never an evaluation; the corrections reach the BC data; p = 0 leaves the learner as it was) and a
learning check of the offline phase."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mmrl.algos.offpolicy import calql_penalty
from mmrl.core.config import ConfigError, load_config
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer, train
from mmrl.policies.consistency import (ConsistencyHead, NoiseLevels, boundary_scalings, consistency_bc_loss,
                                       karras_sigmas, karras_weight, sampling_sigmas)
from mmrl.policies.vla import VLAConfig, VLAPolicy

RECIPE = "vla_reach/conrft_tiny_cpu"
QUIET = ["log.progress=false", "log.tensorboard=false"]
TINY = [*QUIET, "task.args.image_size=32", "policy.args.image_size=32", "warm_start.sft_steps=10",
        "algo.extra.conrft.offline_demos=4", "algo.extra.conrft.offline_steps=4", "algo.extra.conrft.batch_size=32",
        "algo.extra.conrft.bc_batch_size=16", "algo.extra.conrft.critic_width=32", "rollout.prompts_per_step=4",
        "trainer.minibatches=2", "eval.num_examples=4", "eval.extra_splits=[]", "eval.every=0", "checkpoint.every=1",
        "algo.extra.conrft.online_bc_decay=0.1"]


# -- the consistency head -----------------------------------------------------------------------------

def test_boundary_scalings_golden():
    """σ = 1.2, σ_min = 0.2, σ_d = 0.5: c_skip = 0.25 / (1 + 0.25) = 0.2, √(1.44 + 0.25) = 1.3, so
    c_out = 1 · 0.5 / 1.3 and c_in = 1 / 1.3; at σ_min: c_skip = 1, c_out = 0 (f is the identity)."""
    c_skip, c_out, c_in = boundary_scalings(torch.tensor([1.2, 0.2]), 0.2, 0.5)
    assert c_skip.tolist() == pytest.approx([0.2, 1.0])
    assert c_out.tolist() == pytest.approx([0.5 / 1.3, 0.0])
    assert c_in.tolist() == pytest.approx([1 / 1.3, 1 / math.sqrt(0.04 + 0.25)])


def test_karras_levels_weights_and_bc_loss_golden():
    """ρ = 2, σ ∈ [1, 9], N = 3: σ_n = (3 + n/2 · (1 − 3))² = 9, 4, 1; a 2-step draw visits levels 0 and 1.
    λ(0.5) with σ_d = 0.5: 4 + 4 = 8. BC loss of a row off by (0.5, −0.5) at σ = 1: λ = 1 + 4 = 5, × 0.25."""
    levels = NoiseLevels(sigma_min=1.0, sigma_max=9.0, rho=2.0, levels=3)
    assert karras_sigmas(levels).tolist() == pytest.approx([9.0, 4.0, 1.0])
    assert sampling_sigmas(levels, 2) == pytest.approx([9.0, 4.0])
    assert sampling_sigmas(levels, 1) == [9.0]
    assert karras_weight(torch.tensor(0.5), 0.5).item() == pytest.approx(8.0)
    loss = consistency_bc_loss(torch.tensor([[0.5, -0.5], [0.1, 0.1]]), torch.tensor([[0.0, 0.0], [0.1, 0.1]]),
                               torch.tensor([1.0, 0.3]), 0.5)
    assert loss.tolist() == pytest.approx([1.25, 0.0])
    default = karras_sigmas(NoiseLevels())
    assert (default[0].item(), default[-1].item()) == pytest.approx((80.0, 0.002))
    assert bool((default[1:] < default[:-1]).all())


def test_head_is_the_identity_at_sigma_min():
    """The boundary condition holds for any weights, inputs and features, exactly (c_out(σ_min) = 0)."""
    torch.manual_seed(0)
    head = ConsistencyHead(features=8, decision_size=3, width=16, levels=NoiseLevels())
    x, h = torch.randn(5, 3) * 2, torch.randn(5, 8)
    assert torch.equal(head(x, torch.full((5,), 0.002), h), x)
    assert not torch.allclose(head(x, torch.full((5,), 0.5), h), x)  # away from σ_min the network acts


def test_sampling_is_seeded_differentiable_and_greedy_is_deterministic():
    torch.manual_seed(0)
    head = ConsistencyHead(features=8, decision_size=2, width=16, levels=NoiseLevels())
    h = torch.randn(4, 8)
    a = head.sample(h, 2, torch.Generator().manual_seed(1))
    assert torch.equal(a, head.sample(h, 2, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, head.sample(h, 2, torch.Generator().manual_seed(2)))
    greedy = head.sample(h, 1, torch.Generator().manual_seed(1), temperature=0.0)
    assert torch.equal(greedy, head.sample(h, 1, torch.Generator().manual_seed(5), temperature=0.0))
    a.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_vla_consistency_head_rollout_bc_and_refusals():
    policy = VLAPolicy.from_config(VLAConfig(action_head="consistency", image_size=32, value_head=False,
                                             chunk=2, num_envs=2, max_decisions=4))
    from mmrl.core.registry import make_task
    from mmrl.core.rollout import SamplingParams

    task = make_task("robot/reach-v0", {"image_size": 32})
    examples = task.sample_batch("train", 2, np.random.default_rng(0))
    rollout = policy.rollout(examples, 1, SamplingParams(1.0), seed=0)
    assert torch.equal(rollout.logp, torch.zeros_like(rollout.logp))  # no density: recorded as 0
    out = policy(rollout)
    assert torch.equal(out.logp, torch.zeros_like(out.logp)) and out.logp.requires_grad and out.entropy is None
    h = torch.zeros(1, policy.feature_size)
    with pytest.raises(ValueError, match="without a log-probability"):
        policy.action_logprob(h, torch.zeros(1, 4), 1.0)
    demos = [task.reference_output(e) for e in examples]
    first, again = policy.sft_loss(examples, demos), policy.sft_loss(examples, demos)
    assert first.item() > 0 and first.item() != again.item()  # fresh seeded noise per BC draw
    with pytest.raises(ValueError, match="consistency_levels"):
        VLAPolicy.from_config(VLAConfig(action_head="consistency", consistency_levels=NoiseLevels(sigma_min=100.0)))


# -- Cal-QL for a deterministic actor ---------------------------------------------------------------------

def test_calql_penalty_without_importance_weights_golden():
    """One member, one state, N = 1, τ = 1, V^μ(s) = 2: the policy values 0.5 and −1 are lifted to 2, so
    the log-mean-exp over [uniform 0, next 2, current 2, data 1] minus Q(s, a_D) = 1 is
    ln((1 + 2e² + e) / 4) − 1 = 0.531281; unbounded: ln((1 + e^{−1} + e^{0.5} + e) / 4) − 1 = −0.639727."""
    q_data = torch.tensor([[1.0]], requires_grad=True)
    q_random, q_policy, q_next = torch.tensor([[[0.0]]]), torch.tensor([[[0.5]]]), torch.tensor([[[-1.0]]])
    penalty, _ = calql_penalty(q_data, q_random, q_policy, None, q_next, None, torch.tensor([2.0]), action_dims=1)
    assert penalty.item() == pytest.approx(0.531281, abs=1e-5)
    plain, _ = calql_penalty(q_data, q_random, q_policy, None, q_next, None, None, action_dims=1)
    assert plain.item() == pytest.approx(-0.639727, abs=1e-5)
    with pytest.raises(ValueError, match="both policy log-probs or neither"):
        calql_penalty(q_data, q_random, q_policy, torch.tensor([[0.0]]), q_next, None, None, action_dims=1)


# -- the recipe and its refusals ---------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["algo.offpolicy=wsrl"], r"without a log-probability.*algo.offpolicy: one of \['conrft', 'dsrl', 'expo_ft'\]"),
    (["algo.offpolicy=null", "algo.policy_loss=ppo_clip"], "policy-gradient objectives .* need log π"),
    (["trainer.ref_model=copy"], "trainer.ref_model: none"),
    (["algo.entropy_coef=0.01"], "algo.entropy_coef > 0"),
])
def test_objectives_that_need_log_pi_are_refused_when_the_recipe_loads(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RECIPE, [*QUIET, *overrides])


def test_conrft_refuses_a_gaussian_head_and_entropy_settings(tmp_path):
    with pytest.raises(ValueError, match="action_head: consistency"):
        Trainer(load_config(RECIPE, [*TINY, "policy.args.action_head=gaussian"]), tmp_path / "a")
    with pytest.raises(ValueError, match="auto_alpha and backup_entropy"):
        Trainer(load_config(RECIPE, [*TINY, "algo.extra.conrft.auto_alpha=true"]), tmp_path / "b")
    with pytest.raises(ValueError, match="needs demonstrations"):
        Trainer(load_config(RECIPE, [*TINY, "algo.extra.conrft.offline_demos=0",
                                     "algo.extra.conrft.offline_steps=0"]), tmp_path / "c")


# -- the learner through the trainer ----------------------------------------------------------------------

def rows_of(out):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("variant", [[], ["algo.extra.conrft.interventions=0.5",
                                          "algo.extra.conrft.intervention_after=2",
                                          "algo.extra.conrft.buffer_capacity=1000"]],
                         ids=["recipe", "interventions"])
def test_conrft_learns_online_with_a_decaying_bc_weight_and_resumes_exactly(tmp_path, variant):
    full = tmp_path / "full"
    train(load_config(RECIPE, [*TINY, *variant, "trainer.steps=4"]), full)
    rows = rows_of(full)
    assert "offline/critic_cql" in rows[1] and rows[1]["offline/bc_weight"] == 1.0
    assert rows[1]["offpolicy/online"] == 1.0 and rows[1]["policy/grad_norm"] > 0  # no warm-up
    assert [r["conrft/bc_weight"] for r in rows[1:]] == pytest.approx([0.5, 0.4, 0.3, 0.2])
    assert "critic/cql_logsumexp" not in rows[1]  # online: plain Q-learning
    if variant:  # the resumed half must restore a count and BC data that grew in the first half
        assert 0 < rows[2]["conrft/intervened_decisions"] < rows[4]["conrft/intervened_decisions"]
    part = tmp_path / "part"
    train(load_config(RECIPE, [*TINY, *variant, "trainer.steps=2"]), part)
    Trainer(load_config(RECIPE, [*TINY, *variant, "trainer.steps=4"]), part, resume=True).train()
    resumed = rows_of(part)

    def without_eval(r):
        return {k: v for k, v in r.items() if not k.startswith("eval/")}

    assert [without_eval(r) for r in resumed[1:]] == [without_eval(r) for r in rows[1:]]
    a, b = (VLAPolicy.from_config(VLAConfig(action_head="consistency", value_head=False, image_size=32,
                                            pretrained=str(run / "checkpoints" / "step_4" / "policy")))
            for run in (full, part))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))



# -- scripted interventions (the stand-in for ConRFT's human interventions) ----------------------------------

HIL = ["algo.extra.conrft.interventions=1.0", "algo.extra.conrft.intervention_after=2",
       "algo.extra.conrft.buffer_capacity=1000"]


def test_interventions_take_over_every_training_episode_after_k_decisions_and_never_an_evaluation(tmp_path):
    trainer = Trainer(load_config(RECIPE, [*TINY, *HIL]), tmp_path / "run")
    examples = trainer.task.sample_batch("train", 6, np.random.default_rng(0))
    rollout = trainer.policy.rollout(examples, 1, SamplingParams(1.0), seed=5)
    flags, lengths = rollout.payload.intervened, rollout.mask.sum(1).long()
    assert flags is not None and bool((lengths > 2).all())
    for row, length in enumerate(lengths.tolist()):  # the policy's first two decisions, then the expert's to the end
        assert flags[row, :length].tolist() == [0.0, 0.0] + [1.0] * (length - 2)
    greedy = trainer.policy.rollout(examples, 1, SamplingParams(0.0), seed=5)
    assert greedy.payload.intervened is None


def test_corrections_join_the_bc_data_and_the_online_buffer_keeps_the_episodes_as_executed(tmp_path):
    """p = 1, k = 2: every stored episode's decisions from the third on are the expert's; the BC data grows by
    exactly those decisions (slot for slot the online buffer's, whose episodes are whole), and the count says so."""
    trainer = Trainer(load_config(RECIPE, [*TINY, *HIL, "trainer.steps=2"]), tmp_path / "run")
    hook = trainer.loss_hooks[0][1]
    demo_slots = hook.bc_data.size
    trainer.train()
    rows = rows_of(tmp_path / "run")
    online, bc = hook.buffer.arrays, hook.bc_data.arrays
    ends = (online["terminal"] | ~online["sampleable"])[:hook.buffer.size].nonzero().squeeze(1).tolist()
    starts = [0] + [e + 1 for e in ends[:-1]]
    assert len(ends) == 2 * 4 and hook.buffer.size == rows[-1]["offpolicy/env_steps"]  # 2 steps of 4 episodes
    expected = [slot for s, e in zip(starts, ends) for slot in range(s + 2, e + 1)]
    assert hook.bc_data.size - demo_slots == len(expected) == rows[-1]["conrft/intervened_decisions"]
    assert [r["conrft/intervened_episode_frac"] for r in rows[1:]] == [1.0, 1.0]
    new = torch.arange(demo_slots, hook.bc_data.size)
    for key in ("actions", "images", "proprio", "instruction_ids"):
        assert torch.equal(bc[key][new], online[key][expected]), key


def test_interventions_off_leave_the_learner_as_it_was(tmp_path):
    """p = 0 (the recipe's default): no takeover plan, no flags, no intervention metrics, the BC data exactly the
    demonstrations (no room kept) and nothing extra in the state file."""
    trainer = Trainer(load_config(RECIPE, [*TINY, "trainer.steps=1"]), tmp_path / "run")
    hook = trainer.loss_hooks[0][1]
    assert hook.p.interventions == 0 and trainer.policy.takeover is None
    assert hook.bc_data.capacity == hook.bc_data.size + 1
    rollout = trainer.policy.rollout(trainer.task.sample_batch("train", 2, np.random.default_rng(0)), 1,
                                     SamplingParams(1.0), seed=5)
    assert rollout.payload.intervened is None
    trainer.train()
    assert not any("intervened" in key for row in rows_of(tmp_path / "run") for key in row)
    saved = torch.load(tmp_path / "run" / "offpolicy" / "state_step_1.pt", weights_only=True)
    assert set(saved) == {"learner", "buffer", "counters"}


def test_bad_intervention_settings_are_refused_when_the_recipe_loads():
    with pytest.raises(ConfigError, match=r"algo.extra.conrft: interventions is a probability per episode"):
        load_config(RECIPE, [*QUIET, "algo.extra.conrft.interventions=1.5"])
    with pytest.raises(ConfigError, match="intervention_after must be >= 0"):
        load_config(RECIPE, [*QUIET, "algo.extra.conrft.intervention_after=-1"])
    with pytest.raises(ConfigError, match="intervention_trigger must be one of 'after', 'stall'"):
        load_config(RECIPE, [*QUIET, "algo.extra.conrft.intervention_trigger=failure"])
    with pytest.raises(ConfigError, match="stall_window must be >= 1"):
        load_config(RECIPE, [*QUIET, "algo.extra.conrft.stall_window=0"])


def test_stall_triggered_interventions_take_over_only_stalling_episodes(tmp_path):
    """p = 1, stall trigger: every training episode is chosen, but the expert steps in only after w decisions that
    gained no reward (here at decision k or later), and keeps control; the plan carries the window."""
    trainer = Trainer(load_config(RECIPE, [*TINY, *HIL, "algo.extra.conrft.intervention_trigger=stall",
                                           "algo.extra.conrft.stall_window=2"]), tmp_path / "run")
    plan = trainer.policy.takeover(3, 1.0, 5)
    assert plan.after == [2, 2, 2] and plan.stall_window == 2 and trainer.policy.takeover(3, 0.0, 5) is None
    examples = trainer.task.sample_batch("train", 8, np.random.default_rng(0))
    rollout = trainer.policy.rollout(examples, 1, SamplingParams(1.0), seed=5)
    flags, rewards = rollout.payload.intervened, rollout.payload.chunk_rewards.sum(-1)
    lengths = rollout.mask.sum(1).long().tolist()
    for row, length in enumerate(lengths):
        taken = flags[row, :length].nonzero().squeeze(1).tolist()
        if taken:  # a suffix, starting after a stall of two decisions, not before decision k
            start = taken[0]
            assert taken == list(range(start, length)) and start >= 2
            assert float(rewards[row, start - 2:start].sum()) <= 0
    starts = [int(flags[row].argmax()) if flags[row].any() else None for row in range(len(lengths))]
    assert any(s is not None for s in starts) and any(s != 2 for s in starts)  # not the fixed trigger's decision 2

def test_offline_phase_alone_lowers_the_bc_loss(tmp_path):
    """From random weights (no warm start), ConRFT's offline phase (Cal-QL + β·consistency BC − η·Q, 200 updates
    on 16 reach demonstrations) lowers the consistency BC loss and the greedy action's error on the
    demonstrations' expert labels (measured: BC 2.51 → 0.50, greedy MSE 0.77 → 0.05). Held-out demonstrations
    are not asserted: from random weights on 16 demonstrations both got worse (docs/algorithms.md, ConRFT)."""
    def trainer_after(steps: int) -> Trainer:
        overrides = [*TINY, "warm_start.sft_steps=0", "algo.extra.conrft.offline_demos=16",
                     f"algo.extra.conrft.offline_steps={steps}", "algo.extra.conrft.batch_size=64",
                     "algo.extra.conrft.bc_batch_size=64", "trainer.lr=1e-3"]
        return Trainer(load_config(RECIPE, overrides), tmp_path / f"offline_{steps}")

    start, trained = trainer_after(0), trainer_after(200)
    batch = trained.loss_hooks[0][1].bc_data.sample(256, torch.Generator().manual_seed(0))

    def measure(policy: VLAPolicy) -> tuple[float, float]:
        with torch.no_grad():
            h = policy.features(batch.images, batch.proprio, batch.instruction_ids)
            bc = policy.consistency_bc_loss(h, batch.actions, torch.Generator().manual_seed(1)).item()
            greedy = policy.sample_actions(h, 0.0, torch.Generator()).clamp(-1, 1)
            return bc, ((greedy - batch.actions) ** 2).mean().item()

    (bc_before, mse_before), (bc_after, mse_after) = measure(start.policy), measure(trained.policy)
    assert bc_after < 0.7 * bc_before, (bc_before, bc_after)
    assert mse_after < 0.7 * mse_before, (mse_before, mse_after)
