"""The denoising steps against diffusers' schedulers and the closed-form Gaussian log-prob."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

from mmrl.algos.flow_grpo import gaussian_mean_kl
from mmrl.samplers.diffusion import (cfg_combine, ddim_deterministic_step, ddim_step, flow_ode_step,
                                     flow_sde_std, flow_sde_step, gaussian_logprob, rlg_combine)


def scheduler(clip: bool) -> DDIMScheduler:
    s = DDIMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", clip_sample=clip,
                      set_alpha_to_one=False, steps_offset=1)
    s.set_timesteps(10)
    return s


@pytest.mark.parametrize("clip", [False, True])
def test_ddim_step_matches_scheduler_every_step(clip):
    """prev_sample equals DDIMScheduler.step(..., variance_noise=z) at every step, including the
    last (σ > 0 with set_alpha_to_one=False), and log p = mean(−z²/2) − log σ − ½ log 2π."""
    s = scheduler(clip)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 4, generator=gen) * 2.0  # large values so clipping matters
    step_size = s.config.num_train_timesteps // s.num_inference_steps
    for t in s.timesteps.tolist():
        eps = torch.randn(x.shape, generator=gen)
        z = torch.randn(x.shape, generator=gen)
        ref = s.step(eps, t, x, eta=1.0, variance_noise=z).prev_sample
        prev_t = t - step_size
        a_t = s.alphas_cumprod[t].expand(3)
        a_prev = (s.alphas_cumprod[prev_t] if prev_t >= 0 else s.final_alpha_cumprod).expand(3)
        out = ddim_step(eps, x, a_t, a_prev, eta=1.0, noise=z, clip_sample=1.0 if clip else None)
        torch.testing.assert_close(out.next_sample, ref, atol=1e-5, rtol=1e-5)
        expected = (-(z**2) / 2).flatten(1).mean(1) - torch.log(out.std) - 0.5 * math.log(2 * math.pi)
        torch.testing.assert_close(out.logp, expected, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(out.logp).all()
        # re-scoring the recorded sample gives the same log-prob
        again = ddim_step(eps, x, a_t, a_prev, eta=1.0, next_sample=out.next_sample,
                          clip_sample=1.0 if clip else None)
        torch.testing.assert_close(again.logp, out.logp)
        x = ref


def test_ddim_clip_changes_the_mean():
    s = scheduler(True)
    x = torch.full((1, 1, 2, 2), 3.0)
    eps = torch.zeros_like(x)
    a_t, a_prev = s.alphas_cumprod[901].expand(1), s.alphas_cumprod[801].expand(1)
    clipped = ddim_step(eps, x, a_t, a_prev, 1.0, noise=torch.zeros_like(x), clip_sample=1.0).mean
    plain = ddim_step(eps, x, a_t, a_prev, 1.0, noise=torch.zeros_like(x)).mean
    assert not torch.allclose(clipped, plain)


def test_ddim_zero_sigma_is_refused():
    """Default DDIM (set_alpha_to_one=True): the last step has σ = 0 and no log-prob."""
    x = torch.randn(2, 1, 2, 2)
    one = torch.ones(2)
    with pytest.raises(ValueError, match="set_alpha_to_one=False"):
        ddim_step(torch.zeros_like(x), x, torch.full((2,), 0.99), one, 1.0, noise=torch.zeros_like(x))
    with pytest.raises(ValueError, match="exactly one"):
        ddim_step(torch.zeros_like(x), x, torch.full((2,), 0.5), torch.full((2,), 0.6), 1.0)


def test_ddim_deterministic_matches_scheduler_eta0():
    s = scheduler(False)
    x, eps = torch.randn(2, 1, 3, 3), torch.randn(2, 1, 3, 3)
    t = int(s.timesteps[3])
    ref = s.step(eps, t, x, eta=0.0).prev_sample
    out = ddim_deterministic_step(eps, x, s.alphas_cumprod[t].expand(2), s.alphas_cumprod[t - 100].expand(2))
    torch.testing.assert_close(out, ref)


def test_flow_sde_golden_numbers():
    """Hand-computed step: σ = 0.5, σ' = 0.25, a = 0.7, x = 1, v = 2, z = 0.5."""
    x, v, z = torch.ones(1, 1, 1, 1), torch.full((1, 1, 1, 1), 2.0), torch.full((1, 1, 1, 1), 0.5)
    out = flow_sde_step(v, x, torch.tensor([0.5]), torch.tensor([0.25]), sigma_max=0.9, noise_level=0.7,
                        noise=z)
    s = 0.7 * math.sqrt(0.5 / 0.5)  # 0.7
    dt = -0.25
    mean = 1 * (1 + s**2 / (2 * 0.5) * dt) + 2 * (1 + s**2 * 0.5 / (2 * 0.5)) * dt
    std = s * math.sqrt(0.25)
    assert out.mean.item() == pytest.approx(mean, abs=1e-6)
    assert out.std.item() == pytest.approx(std, abs=1e-6)
    assert out.next_sample.item() == pytest.approx(mean + std * 0.5, abs=1e-6)
    assert out.logp.item() == pytest.approx(-0.125 - math.log(std) - 0.5 * math.log(2 * math.pi), abs=1e-6)


def test_flow_sde_std_replaces_sigma_one():
    std = flow_sde_std(torch.tensor([1.0, 0.5]), sigma_max=0.9, noise_level=0.7)
    assert std[0].item() == pytest.approx(0.7 * math.sqrt(1 / 0.1))
    assert std[1].item() == pytest.approx(0.7)


def test_flow_sde_zero_noise_is_euler_and_ode_matches_scheduler():
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    sched.set_timesteps(4)
    x, v = torch.randn(2, 1, 3, 3), torch.randn(2, 1, 3, 3)
    sig, nxt = sched.sigmas[1].expand(2), sched.sigmas[2].expand(2)
    sched.step(v, sched.timesteps[0], x)  # the scheduler counts its steps: advance to index 1
    ref = sched.step(v, sched.timesteps[1], x).prev_sample
    torch.testing.assert_close(flow_ode_step(v, x, sig, nxt), ref)
    tiny = flow_sde_step(v, x, sig, nxt, 1.0, noise_level=1e-6, noise=torch.zeros_like(x))
    torch.testing.assert_close(tiny.mean, ref, atol=1e-5, rtol=1e-5)


def test_flow_sde_keeps_the_marginals_of_the_ode():
    """Data = one point c; the exact velocity is v = (x − c)/σ. The SDE run from N(0, I) must end
    near c, and at σ its samples must have mean (1 − σ)c and std σ (the flow's marginal)."""
    c = 0.8
    n, steps = 20000, 40
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, generator=gen)
    for i in range(steps // 2):
        sig, nxt = sigmas[i].expand(n), sigmas[i + 1].expand(n)
        v = (x - c) / sig[:, None] if i else x - c  # at σ = 1, v = ε − c = x − c
        x = flow_sde_step(v, x, sig, nxt, float(sigmas[1]), 0.7, noise=torch.randn(x.shape, generator=gen)).next_sample
    sig = float(sigmas[steps // 2])
    assert x.mean().item() == pytest.approx((1 - sig) * c, abs=0.03)
    assert x.std().item() == pytest.approx(sig, abs=0.03)


def test_gaussian_logprob_and_kl_golden():
    x, mean = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 2.0]])
    std = torch.tensor([2.0])
    expected = ((-1 / 8) + 0) / 2 - math.log(2.0) - 0.5 * math.log(2 * math.pi)
    assert gaussian_logprob(x, mean, std).item() == pytest.approx(expected)
    assert gaussian_mean_kl(x[None], mean[None], std[None]).item() == pytest.approx((1.0 / 2) / (2 * 4.0))


def test_guidance_combinations():
    u, c = torch.tensor([1.0]), torch.tensor([3.0])
    assert cfg_combine(u, c, 2.0).item() == 5.0
    base, tuned = torch.tensor([1.0]), torch.tensor([2.0])
    assert rlg_combine(base, tuned, 0.0).item() == 1.0
    assert rlg_combine(base, tuned, 1.0).item() == 2.0
    assert rlg_combine(base, tuned, 1.5).item() == 2.5
