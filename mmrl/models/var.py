"""A tiny next-scale visual autoregressive model (VAR, Tian et al. 2024), built from a config.

- :class:`MultiScaleVQ`: a VQ-VAE whose encoder feature map f [B, D, h, w] is quantised
  *residually over scales* with one shared codebook (VAR §3.2, Alg. 1): for each side s_k,
  r_k = argmin_v ‖interp(f − f̂_<k, s_k) − e_v‖, f̂ += upsample(e[r_k]); the decoder reads f̂.
- :class:`NextScaleTransformer`: predicts all tokens of scale k in parallel from the accumulated
  map f̂_<k interpolated to s_k (VAR Eq. 2, "next-scale prediction"), under a block-causal mask
  (a token sees every token of scales ≤ its own); the first scale's single input is a start token
  made from the prompt (a bag of prompt-word embeddings; word id 0 = the empty / null prompt, the
  unconditional model of classifier-free guidance).

log π(x) = Σ_k Σ_{i∈scale k} log p(r_k[i] | r_<k) (VAR-GRPO, arXiv 2505.23331): one teacher-forced
pass over all scales gives every token's log-prob (:meth:`NextScaleTransformer.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class VARSpec:
    scales: tuple[int, ...] = (1, 2, 4, 8)
    """Side lengths of the token maps, coarse to fine; the last is the feature map's side."""
    image_size: int = 16
    codebook_size: int = 64
    code_dim: int = 16
    vq_channels: int = 32
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    vocab_size: int = 20
    """Prompt-word vocabulary (id 0 is padding / the null prompt)."""

    def __post_init__(self) -> None:
        if list(self.scales) != sorted(set(self.scales)) or self.scales[0] != 1:
            raise ValueError(f"scales must be strictly increasing from 1, got {self.scales}")
        if self.image_size % self.scales[-1] or (self.image_size // self.scales[-1]) not in (1, 2, 4):
            raise ValueError(f"image_size {self.image_size} must be 1, 2 or 4 × the last scale {self.scales[-1]}")

    @property
    def num_tokens(self) -> int:
        return sum(s * s for s in self.scales)

    def scale_of_token(self) -> Tensor:
        """[L] long: the scale index of each token position."""
        return torch.cat([torch.full((s * s,), k) for k, s in enumerate(self.scales)])


class MultiScaleVQ(nn.Module):
    def __init__(self, spec: VARSpec):
        super().__init__()
        self.spec = spec
        c, d = spec.vq_channels, spec.code_dim
        down = {1: 0, 2: 1, 4: 2}[spec.image_size // spec.scales[-1]]
        enc = [nn.Conv2d(3, c, 3, padding=1), nn.SiLU()]
        for _ in range(down):
            enc += [nn.Conv2d(c, c, 4, stride=2, padding=1), nn.SiLU()]
        self.encoder = nn.Sequential(*enc, nn.Conv2d(c, d, 1))
        dec = [nn.Conv2d(d, c, 3, padding=1), nn.SiLU()]
        for _ in range(down):
            dec += [nn.ConvTranspose2d(c, c, 4, stride=2, padding=1), nn.SiLU()]
        self.decoder = nn.Sequential(*dec, nn.Conv2d(c, 3, 3, padding=1))
        self.codebook = nn.Embedding(spec.codebook_size, d)

    def upsample(self, z: Tensor) -> Tensor:
        side = self.spec.scales[-1]
        return z if z.shape[-1] == side else F.interpolate(z, size=(side, side), mode="bilinear", align_corners=False)

    def lookup(self, idx: Tensor, side: int) -> Tensor:
        """Code vectors [B, D, side, side] of indices [B, side²]."""
        return self.codebook(idx).transpose(1, 2).reshape(idx.shape[0], -1, side, side)

    def quantise(self, f: Tensor) -> tuple[list[Tensor], Tensor, Tensor]:
        """(indices per scale [B, s²], f̂ [B, D, h, w], commitment loss) of features f (VAR Alg. 1)."""
        residual, f_hat, idx_all, loss = f, torch.zeros_like(f), [], f.new_zeros(())
        for s in self.spec.scales:
            r = F.interpolate(residual, size=(s, s), mode="area") if s != f.shape[-1] else residual
            flat = r.flatten(2).transpose(1, 2)  # [B, s², D]
            dist = torch.cdist(flat, self.codebook.weight[None].expand(flat.shape[0], -1, -1))
            idx = dist.argmin(-1)  # [B, s²]
            z = self.upsample(self.lookup(idx, s))
            loss = loss + F.mse_loss(z, residual.detach()) + 0.25 * F.mse_loss(residual, z.detach())
            z = residual + (z - residual).detach()  # straight-through
            f_hat, residual = f_hat + z, residual - z
            idx_all.append(idx)
        return idx_all, f_hat, loss / len(self.spec.scales)

    def tokens_to_features(self, tokens: Tensor) -> tuple[Tensor, list[Tensor]]:
        """f̂ from all tokens [B, L], and the accumulated maps f̂_<k for k = 1..K (before scale k)."""
        f_hat = None
        partial, start = [], 0
        for s in self.spec.scales:
            z = self.upsample(self.lookup(tokens[:, start:start + s * s], s))
            partial.append(torch.zeros_like(z) if f_hat is None else f_hat)
            f_hat = z if f_hat is None else f_hat + z
            start += s * s
        return f_hat, partial

    def encode(self, images: Tensor) -> Tensor:
        """Tokens [B, L] of images [B, 3, H, W] in [-1, 1]."""
        idx, _, _ = self.quantise(self.encoder(images))
        return torch.cat(idx, 1)

    def decode(self, tokens: Tensor) -> Tensor:
        """Images [B, 3, H, W] (≈ [-1, 1]) from tokens [B, L]."""
        return self.decoder(self.tokens_to_features(tokens)[0])

    def reconstruct(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """(reconstruction, commitment loss), straight-through gradients to the encoder."""
        _, f_hat, loss = self.quantise(self.encoder(images))
        return self.decoder(f_hat), loss


class NextScaleTransformer(nn.Module):
    def __init__(self, spec: VARSpec):
        super().__init__()
        self.spec = spec
        d = spec.d_model
        self.word_embedding = nn.Embedding(spec.vocab_size, d, padding_idx=0)
        self.null_prompt = nn.Parameter(torch.zeros(d))
        self.feature_in = nn.Linear(spec.code_dim, d)
        self.position = nn.Parameter(0.02 * torch.randn(spec.num_tokens, d))
        self.level = nn.Embedding(len(spec.scales), d)
        layer = nn.TransformerEncoderLayer(d, spec.num_heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, spec.num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, spec.codebook_size)
        scale = spec.scale_of_token()
        self.register_buffer("token_scale", scale, persistent=False)
        # block-causal: True = blocked; token i may attend to j iff scale(j) <= scale(i)
        self.register_buffer("block_mask", scale[None, :] > scale[:, None], persistent=False)

    def condition(self, words: Tensor) -> Tensor:
        """Start embedding [B, d] from prompt word ids [B, W] (all zeros: the null prompt)."""
        bag = self.word_embedding(words).sum(1)
        empty = (words == 0).all(1, keepdim=True)
        return torch.where(empty, self.null_prompt.expand_as(bag), bag)

    def forward(self, start: Tensor, scale_inputs: Tensor) -> Tensor:
        """Logits [B, L', V] for the first L' token positions: ``start`` [B, d], ``scale_inputs``
        [B, L'−1, D] (the interpolated accumulated features of scales 2.., flattened)."""
        x = torch.cat([start[:, None], self.feature_in(scale_inputs)], 1)
        n = x.shape[1]
        x = x + self.position[:n] + self.level(self.token_scale[:n])
        h = self.blocks(x, mask=self.block_mask[:n, :n])
        return self.head(self.norm(h))


def next_scale_inputs(vq: MultiScaleVQ, tokens: Tensor, spec: VARSpec) -> Tensor:
    """[B, Σ_{k≥2} s_k², D]: for each scale k ≥ 2, f̂_<k (from the tokens of scales < k) area-
    interpolated to s_k × s_k, flattened (VAR's teacher-forcing input). ``tokens`` may hold only
    the first scales (sampling): inputs are built for the next scales they determine."""
    b, have = tokens.shape
    f_hat, start, out = None, 0, []
    for k, s in enumerate(spec.scales):
        if k > 0:
            out.append(F.interpolate(f_hat, size=(s, s), mode="area").flatten(2).transpose(1, 2))
        if start + s * s > have:
            break
        z = vq.upsample(vq.lookup(tokens[:, start:start + s * s], s))
        f_hat = z if f_hat is None else f_hat + z
        start += s * s
    return torch.cat(out, 1) if out else tokens.new_zeros((b, 0, spec.code_dim), dtype=torch.float32)


def processed_log_probs(logits_cond: Tensor, logits_uncond: Tensor | None, guidance: float, temperature: float,
                        top_k: int, keep: Tensor | None = None) -> Tensor:
    """Log-probs [..., V] of the distribution actually sampled: CFG-combined logits
    u + g·(c − u) (g = 1: the conditional logits), divided by the temperature, truncated to the
    top-k (k = 0: no truncation) and renormalised. ``keep`` [...] (long) are token ids that stay
    in the support whatever the truncation (re-scoring: the taken token, so a changed top-k set
    under new weights gives a finite log-prob; on-policy the sets are equal)."""
    logits = logits_cond if logits_uncond is None or guidance == 1.0 else (
        logits_uncond + guidance * (logits_cond - logits_uncond))
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        threshold = logits.topk(top_k, dim=-1).values[..., -1:]
        blocked = logits < threshold
        if keep is not None:
            blocked = blocked & ~F.one_hot(keep, logits.shape[-1]).bool()
        logits = logits.masked_fill(blocked, float("-inf"))
    return logits.log_softmax(-1)


def guided_logits(model: NextScaleTransformer, vq: MultiScaleVQ, words: Tensor, tokens: Tensor,
                  guidance: float) -> tuple[Tensor, Tensor | None]:
    """(conditional, unconditional or None) logits [B, L', V] of positions 0..L'−1 given the
    tokens of the coarser scales (teacher forcing; one pass, CFG doubles the batch)."""
    inputs = next_scale_inputs(vq, tokens, model.spec)
    if guidance == 1.0:
        return model(model.condition(words), inputs), None
    both = model(torch.cat([model.condition(words), model.condition(torch.zeros_like(words))]),
                 torch.cat([inputs, inputs]))
    cond, uncond = both.chunk(2)
    return cond, uncond


@torch.no_grad()
def sample_tokens(model: NextScaleTransformer, vq: MultiScaleVQ, words: Tensor, guidance: float,
                  temperature: float, top_k: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """(tokens [B, L], behaviour log-probs [B, L]) sampled scale by scale; all tokens of a scale are
    drawn in parallel from the processed distribution of :func:`processed_log_probs`. ``temperature``
    0 takes the most likely token of the CFG-combined logits (greedy; log-probs are then 0)."""
    b, spec = words.shape[0], model.spec
    tokens = words.new_zeros((b, 0))
    logps = []
    for s in spec.scales:
        end = tokens.shape[1] + s * s
        cond, uncond = guided_logits(model, vq, words, tokens, guidance)
        if temperature == 0:
            new = processed_log_probs(cond[:, -s * s:], None if uncond is None else uncond[:, -s * s:], guidance,
                                      1.0, 0).argmax(-1)
            logps.append(torch.zeros(b, s * s))
        else:
            lp = processed_log_probs(cond[:, -s * s:], None if uncond is None else uncond[:, -s * s:], guidance,
                                     temperature, top_k)  # [B, s², V]
            new = torch.multinomial(lp.exp().flatten(0, 1), 1, generator=gen).view(b, s * s)
            logps.append(lp.gather(-1, new[..., None])[..., 0])
        tokens = torch.cat([tokens, new], 1)
        assert tokens.shape[1] == end
    return tokens, torch.cat(logps, 1)


def teacher_forced_log_probs(model: NextScaleTransformer, vq: MultiScaleVQ, words: Tensor, tokens: Tensor,
                             guidance: float, temperature: float, top_k: int) -> Tensor:
    """log p(r_k[i] | r_<k) [B, L] of every token in ONE pass over all scales, with gradients
    (VAR-GRPO's log π(x) = Σ_k Σ_i of these)."""
    cond, uncond = guided_logits(model, vq, words, tokens, guidance)
    lp = processed_log_probs(cond, uncond, guidance, temperature, top_k, keep=tokens)
    return lp.gather(-1, tokens[..., None])[..., 0]
