"""Multi-scale VQ and next-scale transformer: shapes, residual quantisation, block-causal mask,
and exact teacher-forced re-scoring of sampled tokens (GRPO ratio 1 on-policy)."""

import pytest
import torch

from mmrl.models.var import (MultiScaleVQ, NextScaleTransformer, VARSpec, next_scale_inputs, sample_tokens,
                             teacher_forced_log_probs)


def tiny():
    torch.manual_seed(0)
    spec = VARSpec(scales=(1, 2, 4, 8), image_size=16, codebook_size=32, code_dim=8, vq_channels=16,
                   d_model=32, num_layers=2, num_heads=2, vocab_size=12)
    return spec, MultiScaleVQ(spec).eval(), NextScaleTransformer(spec).eval()


def test_spec_validation():
    with pytest.raises(ValueError, match="strictly increasing"):
        VARSpec(scales=(2, 4))
    with pytest.raises(ValueError, match="image_size"):
        VARSpec(scales=(1, 2, 3), image_size=16)
    assert VARSpec().num_tokens == 1 + 4 + 16 + 64


def test_encode_decode_round_trip_is_consistent():
    spec, vq, _ = tiny()
    images = torch.rand(3, 3, 16, 16) * 2 - 1
    tokens = vq.encode(images)
    assert tokens.shape == (3, spec.num_tokens) and tokens.dtype == torch.long
    with torch.no_grad():
        recon, _ = vq.reconstruct(images)
        assert torch.allclose(vq.decode(tokens), recon, atol=1e-5)  # f̂ rebuilt from tokens = quantiser's f̂


def test_residual_quantisation_sums_scales():
    spec, vq, _ = tiny()
    with torch.no_grad():
        f = vq.encoder(torch.rand(4, 3, 16, 16) * 2 - 1)
        idx, f_hat, _ = vq.quantise(f)
        errors, acc = [], torch.zeros_like(f)
        for s, i in zip(spec.scales, idx):
            acc = acc + vq.upsample(vq.lookup(i, s))
            errors.append(float((f - acc).pow(2).mean()))
    assert torch.allclose(acc, f_hat, atol=1e-6)  # f̂ = Σ_k upsample(e[r_k]) (error falls only once trained)
    assert len(errors) == len(spec.scales)


def test_block_causal_mask_and_inputs():
    spec, vq, model = tiny()
    scale = spec.scale_of_token()
    mask = model.block_mask
    assert not mask[0, 0] and mask[0, 1] and not mask[4, 1] and mask[4, 5] and not mask[5, 4]
    tokens = torch.randint(0, 32, (2, spec.num_tokens))
    assert next_scale_inputs(vq, tokens, spec).shape == (2, spec.num_tokens - 1, spec.code_dim)
    # tokens of scale k never change logits of scales <= k... i.e. changing the last scale's tokens
    # leaves every logit unchanged (they are predicted from coarser scales only)
    words = torch.tensor([[1, 2, 0], [3, 0, 0]])
    with torch.no_grad():
        lp_a = teacher_forced_log_probs(model, vq, words, tokens, 1.0, 1.0, 0)
        changed = tokens.clone()
        changed[:, -64:] = torch.randint(0, 32, (2, 64))
        full_a = model(model.condition(words), next_scale_inputs(vq, tokens, spec))
        full_b = model(model.condition(words), next_scale_inputs(vq, changed, spec))
    assert torch.allclose(full_a, full_b, atol=1e-6)
    assert lp_a.shape == (2, spec.num_tokens) and (scale.max() == 3)


@pytest.mark.parametrize("guidance,temperature,top_k", [(1.0, 1.0, 0), (3.0, 1.0, 0), (2.0, 0.7, 5), (1.0, 1.3, 3)])
def test_rescoring_equals_sampling_log_probs(guidance, temperature, top_k):
    spec, vq, model = tiny()
    words = torch.tensor([[1, 4, 7], [2, 5, 0], [0, 0, 0]])
    tokens, logp = sample_tokens(model, vq, words, guidance, temperature, top_k, torch.Generator().manual_seed(1))
    rescored = teacher_forced_log_probs(model, vq, words, tokens, guidance, temperature, top_k)
    assert tokens.shape == logp.shape == (3, spec.num_tokens)
    assert torch.isfinite(logp).all()
    assert torch.allclose(rescored, logp, atol=1e-5)  # ratio 1 on-policy


def test_top_k_truncation_is_in_the_behaviour_log_prob():
    spec, vq, model = tiny()
    words = torch.tensor([[1, 2, 3]])
    _, full = sample_tokens(model, vq, words, 1.0, 1.0, 0, torch.Generator().manual_seed(2))
    tokens, trunc = sample_tokens(model, vq, words, 1.0, 1.0, 2, torch.Generator().manual_seed(2))
    # renormalised over 2 tokens: every log-prob >= log(1/2)... no: >= the log of the smaller share,
    # but the sum of the two kept probabilities is 1, so each kept token's prob exceeds the untruncated one
    untrunc = teacher_forced_log_probs(model, vq, words, tokens, 1.0, 1.0, 0)
    assert (trunc >= untrunc - 1e-6).all() and (trunc > untrunc + 1e-4).any()


def test_sampling_is_seeded_and_gradients_flow():
    spec, vq, model = tiny()
    words = torch.tensor([[1, 2, 3], [4, 5, 6]])
    a, _ = sample_tokens(model, vq, words, 2.0, 1.0, 0, torch.Generator().manual_seed(3))
    b, _ = sample_tokens(model, vq, words, 2.0, 1.0, 0, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    lp = teacher_forced_log_probs(model, vq, words, a, 2.0, 1.0, 0)
    lp.sum().backward()
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
