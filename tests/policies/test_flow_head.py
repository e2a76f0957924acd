"""The flow-matching action head (``policy.args.action_head: flow``): golden numbers of the loss, the path and the
Euler sampler (on hand-built velocity fields and a hand-set head); g_θ(h, z) deterministic and differentiable;
greedy decoding at zero noise; behaviour cloning lowers the loss; the VLA's rollout / re-scoring without log π and
its refusals; EXPO-FT and ConRFT accept it as their base / actor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmrl.core.config import ConfigError, load_config
from mmrl.core.registry import make_task
from mmrl.core.rollout import SamplingParams
from mmrl.core.trainer import Trainer
from mmrl.policies.flow_head import FlowHead, euler_integrate, flow_matching_loss, interpolate
from mmrl.policies.vla import VLAConfig, VLAPolicy

QUIET = ["log.progress=false", "log.tensorboard=false"]


def constant_head(velocity: list[float], features: int = 3) -> FlowHead:
    """A head whose velocity is the same everywhere: v_θ(x, τ, h) = ``velocity`` (last layer zero, bias v)."""
    head = FlowHead(features, len(velocity), width=8)
    with torch.no_grad():
        head.net[-1].weight.zero_()
        head.net[-1].bias.copy_(torch.tensor(velocity))
    return head


# -- golden numbers ----------------------------------------------------------------------------------------

def test_flow_matching_loss_and_path_golden():
    """v = (1, 0), z = (0.5, −0.5), a = (1, 0.5): a − z = (0.5, 1), errors (0.5, −1), mean of squares 0.625.
    The path at τ = 0.25 between z = (0, 2) and a = (1, 0): (0.25, 1.5); at τ = 0 it is z, at τ = 1 it is a."""
    loss = flow_matching_loss(torch.tensor([[1.0, 0.0], [0.5, 1.0]]), torch.tensor([[0.5, -0.5], [0.5, -0.5]]),
                              torch.tensor([[1.0, 0.5], [1.0, 0.5]]))
    assert loss.tolist() == pytest.approx([0.625, 0.0])
    z, a = torch.tensor([[0.0, 2.0]] * 3), torch.tensor([[1.0, 0.0]] * 3)
    assert interpolate(z, a, torch.tensor([0.25, 0.0, 1.0])).flatten().tolist() == [0.25, 1.5, 0.0, 2.0, 1.0, 0.0]


def test_the_modules_doctests_pass():
    import doctest

    from mmrl.policies import flow_head

    result = doctest.testmod(flow_head)
    assert result.attempted >= 3 and result.failed == 0


def test_euler_sampler_golden():
    """dx/dτ = −x from 1: two steps give ¼, four give (¾)⁴ = 0.31640625. dx/dτ = τ from 0 in four steps:
    Σ_k (k/4)/4 = 0.375 (the exact integral is 0.5: Euler evaluates at the left end of each step)."""
    one = torch.tensor([[1.0]])
    assert euler_integrate(lambda x, t: -x, one, 2).item() == 0.25
    assert euler_integrate(lambda x, t: -x, one, 4).item() == pytest.approx(0.31640625)
    assert euler_integrate(lambda x, t: t[:, None].expand_as(x), torch.zeros(1, 1), 4).item() == pytest.approx(0.375)


def test_a_constant_velocity_head_moves_the_noise_by_the_velocity():
    """v ≡ (0.5, −1): g(h, z) = z + (0.5, −1) whatever the number of steps; its flow-matching loss against
    a = z + v is exactly 0, and against a = z it is mean(0.25, 1) = 0.625."""
    head = constant_head([0.5, -1.0])
    h, z = torch.randn(2, 3), torch.tensor([[0.2, 0.3], [0.0, 0.0]])
    for steps in (1, 3, 10):
        assert head.sample(h, z, steps).flatten().tolist() == pytest.approx([0.7, -0.7, 0.5, -1.0])
    tau = torch.tensor([0.3, 0.9])
    v = head(interpolate(z, z + torch.tensor([0.5, -1.0]), tau), tau, h)
    assert flow_matching_loss(v, z, z + torch.tensor([0.5, -1.0])).tolist() == pytest.approx([0.0, 0.0])
    assert flow_matching_loss(v, z, z).tolist() == pytest.approx([0.625, 0.625])


# -- the sampler as a function ------------------------------------------------------------------------------

def test_g_is_deterministic_given_h_and_z_and_differentiable_in_theta_h_and_z():
    torch.manual_seed(0)
    head = FlowHead(features=6, decision_size=2, width=16)
    h, z = torch.randn(4, 6, requires_grad=True), torch.randn(4, 2, requires_grad=True)
    a = head.sample(h, z, 5)
    assert torch.equal(a, head.sample(h, z, 5))
    assert not torch.equal(a, head.sample(h, z + 0.1, 5)) and not torch.equal(a, head.sample(h, z, 6))
    a.sum().backward()
    assert h.grad.abs().sum() > 0 and z.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def tiny_flow_policy(**kwargs) -> VLAPolicy:
    settings = {"image_size": 32, "value_head": False, "num_envs": 2, "max_decisions": 4, "flow_steps": 4,
                "flow_width": 32} | kwargs
    return VLAPolicy.from_config(VLAConfig(action_head="flow", **settings))


def test_greedy_is_zero_noise_and_sampling_is_seeded():
    policy = tiny_flow_policy(chunk=2)
    h = torch.randn(3, policy.feature_size)
    zero = policy.flow_actions(h, torch.zeros(3, policy.decision_size))
    assert torch.equal(policy.sample_actions(h, 0.0, torch.Generator().manual_seed(1)), zero)
    assert torch.equal(policy.sample_actions(h, 0.0, torch.Generator().manual_seed(7)), zero)
    hot = policy.sample_actions(h, 1.0, torch.Generator().manual_seed(1))
    assert hot.shape == (3, 4) and not torch.equal(hot, zero)
    assert torch.equal(hot, policy.sample_actions(h, 1.0, torch.Generator().manual_seed(1)))
    noise = torch.randn((3, 4), generator=torch.Generator().manual_seed(1)) * 0.5  # τ = 0.5: z ~ N(0, τ² I)
    assert torch.equal(policy.sample_actions(h, 0.5, torch.Generator().manual_seed(1)), policy.flow_actions(h, noise))
    actions, logp = policy.rsample_actions(h, torch.Generator().manual_seed(1))
    assert logp is None and torch.equal(actions, hot)  # τ = 1, no density


def test_behaviour_cloning_lowers_the_flow_matching_loss_on_a_toy_batch():
    """Actions a smooth function of h; 150 Adam steps of the VLA's imitation loss on the head: the loss on a fixed
    draw of (τ, z) falls by more than half and the greedy action's error by more than half."""
    policy = tiny_flow_policy()
    g = torch.Generator().manual_seed(0)
    h = torch.randn((64, policy.feature_size), generator=g)
    actions = torch.tanh(h[:, :2] + 0.5 * h[:, 2:4])

    def measure() -> tuple[float, float]:
        with torch.no_grad():
            loss = policy.imitation_loss(h, actions, torch.Generator().manual_seed(1)).item()
            greedy = policy.sample_actions(h, 0.0, torch.Generator())
            return loss, ((greedy - actions) ** 2).mean().item()

    (loss_before, error_before) = measure()
    optimizer = torch.optim.Adam(policy.flow.parameters(), lr=3e-3)
    for step in range(150):
        loss = policy.imitation_loss(h, actions)  # seeded by init_seed and the draw count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    loss_after, error_after = measure()
    assert loss_after < 0.5 * loss_before, (loss_before, loss_after)
    assert error_after < 0.5 * error_before, (error_before, error_after)


# -- the VLA with a flow head ---------------------------------------------------------------------------------

def test_vla_flow_head_rollout_bc_and_refusals():
    policy = tiny_flow_policy(chunk=2)
    task = make_task("robot/reach-v0", {"image_size": 32})
    examples = task.sample_batch("train", 2, np.random.default_rng(0))
    rollout = policy.rollout(examples, 1, SamplingParams(1.0), seed=0)
    assert torch.equal(rollout.logp, torch.zeros_like(rollout.logp))  # no density: recorded as 0
    out = policy(rollout)
    assert torch.equal(out.logp, torch.zeros_like(out.logp)) and out.logp.requires_grad and out.entropy is None
    with pytest.raises(ValueError, match="flow samples actions without a log-probability"):
        policy.action_logprob(torch.zeros(1, policy.feature_size), torch.zeros(1, 4), 1.0)
    demos = [task.reference_output(e) for e in examples]
    first, again = policy.sft_loss(examples, demos), policy.sft_loss(examples, demos)
    assert first.item() > 0 and first.item() != again.item()  # fresh seeded noise per BC draw
    first.backward()
    assert all(p.grad is not None for p in policy.flow.parameters())
    with pytest.raises(ValueError, match="flow_steps and flow_width must be >= 1"):
        tiny_flow_policy(flow_steps=0)
    gaussian = VLAPolicy.from_config(VLAConfig(action_head="gaussian", image_size=32))
    with pytest.raises(ValueError, match="flow head only"):
        gaussian.flow_actions(torch.zeros(1, gaussian.feature_size), torch.zeros(1, 2))


@pytest.mark.parametrize("overrides, message", [
    (["algo.offpolicy=null", "algo.policy_loss=ppo_clip"], "flow samples actions without a log-probability"),
    (["algo.offpolicy=wsrl"], r"algo.offpolicy: one of \['conrft', 'dsrl', 'expo_ft'\]"),
    (["policy.args.context_smoothing={levels: 4}", "policy.args.timestep_policy=fixed"], "timestep_policy needs"),
])
def test_objectives_that_need_log_pi_are_refused_for_the_flow_head(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("vla_reach/dsrl_tiny_cpu", [*QUIET, *overrides])


def test_expo_ft_and_conrft_take_a_flow_head(tmp_path):
    """EXPO-FT's base and ConRFT's actor only need samples and a BC loss: with a flow head both run a trainer step
    (the base / actor moves: its BC or Q gradient reaches the flow head)."""
    tiny = [*QUIET, "task.args.image_size=32", "policy.args.image_size=32", "warm_start.sft_steps=4",
            "policy.args.action_head=flow", "policy.args.flow_steps=4", "rollout.prompts_per_step=4",
            "trainer.minibatches=2", "eval.num_examples=4", "eval.extra_splits=[]", "eval.every=0",
            "checkpoint.every=0", "trainer.steps=1"]
    for recipe, name, extra in (("expo_ft_tiny_cpu", "expo_ft", ["algo.extra.expo_ft.edit_width=32"]),
                                ("conrft_tiny_cpu", "conrft", ["algo.extra.conrft.bc_batch_size=16"])):
        section = f"algo.extra.{name}"
        trainer = Trainer(load_config(f"vla_reach/{recipe}", [*tiny, *extra, f"{section}.offline_demos=2",
                                                              f"{section}.offline_steps=2", f"{section}.batch_size=16",
                                                              f"{section}.critic_width=32"]), tmp_path / name)
        before = {k: v.clone() for k, v in trainer.policy.flow.state_dict().items()}
        trainer.train()
        after = trainer.policy.flow.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before), name
