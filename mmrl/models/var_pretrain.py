"""Pretraining of the tiny VAR model (``mmrl pretrain-imagegen assets/imagegen/var_tiny.json``): first the
multi-scale VQ-VAE, then the next-scale transformer by maximum likelihood on the frozen VQ's tokens,
both on fresh procedural images of ``imagegen/shapes-v0`` every step (Tian et al. 2024, two stages).

The prompts of the ``ood`` split (``shapes.OOD_COMBINATIONS``) are never shown, so RL can be
evaluated on colour × shape combinations that pretraining did not see. Prompts condition the
transformer as bags of word ids (:func:`prompt_word_ids`); with probability ``cond_dropout`` the
prompt is empty (the unconditional model of classifier-free guidance).

A model folder holds ``var_spec.json`` (the :class:`~mmrl.models.var.VARSpec`), ``vq.safetensors``,
``transformer.safetensors`` and ``pretrain.json`` (config, losses, reconstruction quality). Folders
built from a config are cached in ``$MMRL_CACHE/imagegen/var-<hash of the config>/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from mmrl.core.config import build
from mmrl.models.var import MultiScaleVQ, NextScaleTransformer, VARSpec
from mmrl.core.paths import resolve_asset
from mmrl.core.run_folder import mark_written, prepare_atomic_out
from mmrl.tasks.imagegen.shapes import ShapePrompt, all_prompts, is_ood, prompt_vocabulary, render

SPEC_FILE, VQ_FILE, TRANSFORMER_FILE, INFO_FILE = ("var_spec.json", "vq.safetensors", "transformer.safetensors",
                                                   "pretrain.json")


@dataclass(frozen=True)
class StageSchedule:
    steps: int = 1000
    """AdamW steps, a fresh batch of procedural images each."""
    batch_size: int = 64
    lr: float = 2e-3
    warmup_steps: int = 50
    """Linear warm-up, then cosine decay to 0."""


@dataclass(frozen=True)
class VARPretrainConfig:
    kind: Literal["var"]
    spec: dict = field(default_factory=dict)
    """:class:`~mmrl.models.var.VARSpec` fields (scales, image_size, codebook_size, d_model, ...)."""
    vq: StageSchedule = field(default_factory=StageSchedule)
    """Stage 1: the VQ-VAE (reconstruction MSE + commitment loss, dead codes restarted)."""
    transformer: StageSchedule = field(default_factory=StageSchedule)
    """Stage 2: the next-scale transformer (cross-entropy over all scales, teacher forced)."""
    commitment: float = 1.0
    """Weight of the VQ codebook / commitment loss."""
    restart_every: int = 50
    """VQ steps between restarts of unused codes (set to random encoder features of the batch)."""
    cond_dropout: float = 0.1
    """Probability of training the transformer on the empty prompt (classifier-free guidance)."""
    seed: int = 0
    """Seeds initialisation, data and restarts."""


def load_var_config(path: str | Path) -> tuple[VARPretrainConfig, dict]:
    file = resolve_asset(str(path))
    data = json.loads(file.read_text())
    cfg = build(VARPretrainConfig, data, str(file))
    var_spec(cfg, str(file))  # validate the spec early
    return cfg, data


def var_spec(cfg: VARPretrainConfig, where: str = "") -> VARSpec:
    return build(VARSpec, cfg.spec, f"{where}: spec" if where else "spec")


def word_index() -> dict[str, int]:
    """Prompt word → id (0 is padding / the empty prompt)."""
    return {w: i + 1 for i, w in enumerate(prompt_vocabulary())}


def prompt_word_ids(prompts: Sequence[str], vocab_size: int) -> torch.Tensor:
    """[B, W] long word ids of prompt texts, right-padded with 0; "" gives all zeros (the null prompt)."""
    index = word_index()
    if len(index) + 1 > vocab_size:
        raise ValueError(f"VARSpec.vocab_size {vocab_size} < {len(index) + 1} (the imagegen prompt words + padding)")
    rows = []
    for text in prompts:
        unknown = [w for w in text.split() if w not in index]
        if unknown:
            raise ValueError(f"prompt {text!r}: words {unknown} are not in the VAR vocabulary {sorted(index)}")
        rows.append([index[w] for w in text.split()])
    width = max([len(r) for r in rows] + [1])
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long).view(len(rows), width)


def training_prompts() -> list[ShapePrompt]:
    """Prompts shown in pretraining: all but the ``ood`` split's."""
    return [p for p in all_prompts() if not is_ood(p)]


def image_batch(prompts: list[ShapePrompt], n: int, size: int, rng: np.random.Generator
                ) -> tuple[list[ShapePrompt], torch.Tensor]:
    batch = [prompts[i] for i in rng.integers(0, len(prompts), size=n)]
    images = np.stack([render(p, size, rng) for p in batch])
    return batch, torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1


def _optimizer(params: list[torch.nn.Parameter], s: StageSchedule):
    optimizer = torch.optim.AdamW(params, lr=s.lr)

    def lr_at(i: int) -> float:
        return min(1.0, (i + 1) / max(s.warmup_steps, 1)) * 0.5 * (1 + math.cos(math.pi * i / s.steps))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)


def train_vq(cfg: VARPretrainConfig, vq: MultiScaleVQ, rng: np.random.Generator, progress: bool) -> list[float]:
    """Stage 1: MSE(reconstruction, image) + commitment; unused codes are restarted every
    ``restart_every`` steps from random encoder features of the batch (a standard fix for codebook
    collapse)."""
    s, prompts, spec = cfg.vq, training_prompts(), vq.spec
    optimizer, sched = _optimizer(list(vq.parameters()), s)
    used = torch.zeros(spec.codebook_size, dtype=torch.bool)
    losses = []
    for step in tqdm(range(s.steps), desc="pretrain var: vq", disable=not progress, dynamic_ncols=True):
        _, x = image_batch(prompts, s.batch_size, spec.image_size, rng)
        f = vq.encoder(x)
        idx, f_hat, commit = vq.quantise(f)
        loss = F.mse_loss(vq.decoder(f_hat), x) + cfg.commitment * commit
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vq.parameters(), 1.0)
        optimizer.step()
        sched.step()
        losses.append(loss.item())
        used[torch.cat(idx, 1).unique()] = True
        if (step + 1) % cfg.restart_every == 0 and step + 1 < s.steps:
            dead = (~used).nonzero().squeeze(1)
            if len(dead):
                feats = f.detach().flatten(2).transpose(1, 2).reshape(-1, spec.code_dim)
                pick = torch.from_numpy(rng.integers(0, len(feats), size=len(dead)))
                with torch.no_grad():
                    vq.codebook.weight[dead] = feats[pick]
            used.zero_()
    return losses


def train_transformer(cfg: VARPretrainConfig, vq: MultiScaleVQ, model: NextScaleTransformer,
                      rng: np.random.Generator, progress: bool) -> list[float]:
    """Stage 2: mean cross-entropy of every token given the coarser scales (VAR Eq. 2, teacher forced
    in one pass), tokens from the frozen VQ."""
    from mmrl.models.var import next_scale_inputs

    s, prompts, spec = cfg.transformer, training_prompts(), model.spec
    optimizer, sched = _optimizer(list(model.parameters()), s)
    losses = []
    for _ in tqdm(range(s.steps), desc="pretrain var: transformer", disable=not progress, dynamic_ncols=True):
        batch, x = image_batch(prompts, s.batch_size, spec.image_size, rng)
        with torch.no_grad():
            tokens = vq.encode(x)
            inputs = next_scale_inputs(vq, tokens, spec)
        texts = ["" if rng.random() < cfg.cond_dropout else p.prompt for p in batch]
        logits = model(model.condition(prompt_word_ids(texts, spec.vocab_size)), inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        sched.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def reconstruction_quality(vq: MultiScaleVQ, n: int = 256, seed: int = 1234) -> dict[str, float]:
    """PSNR (dB, images in [0, 255]) of VQ reconstructions of fresh training-prompt images, the MSE of
    each scale-prefix reconstruction (using tokens of scales 1..k only; falls with k), the codebook
    usage, and the prompt correctness of reconstructions (the imagegen reward's checks)."""
    from mmrl.tasks.imagegen.task import ShapesConfig, ShapesTask

    rng, spec = np.random.default_rng(seed), vq.spec
    prompts, x = image_batch(training_prompts(), n, spec.image_size, rng)
    tokens = vq.encode(x)
    recon = vq.decode(tokens).clamp(-1, 1)
    mse = F.mse_loss((recon + 1) * 127.5, (x + 1) * 127.5).item()
    f_hat, before = vq.tokens_to_features(tokens)  # before[k] = f̂ of scales < k
    prefix_mse = [F.mse_loss(vq.decoder(f).clamp(-1, 1), x).item() for f in [*before[1:], f_hat]]
    task = ShapesTask(ShapesConfig(size=spec.image_size))
    images = ((recon + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    correct = [task.reward(p, img).components["correct"] for p, img in zip(prompts, images)]
    return {"psnr_db": 10 * math.log10(255 ** 2 / max(mse, 1e-12)), "mse_by_scale_prefix": prefix_mse,
            "codebook_usage": len(tokens.unique()) / spec.codebook_size,
            "reconstruction_correct": float(np.mean(correct))}


def pretrain_var(config: str | Path, out: str | Path, progress: bool = True, overwrite: bool = False,
                 steps: int | None = None) -> Path:
    """Train the VQ and the transformer of ``config`` and save them to ``out``; ``steps`` overrides both
    stages' step counts (quick runs)."""
    cfg, raw = load_var_config(config)
    if steps is not None:
        cfg = dataclasses.replace(cfg, vq=dataclasses.replace(cfg.vq, steps=steps),
                                  transformer=dataclasses.replace(cfg.transformer, steps=steps))
    out = Path(out)
    prepare_atomic_out(out, overwrite, "mmrl pretrain-imagegen")
    spec = var_spec(cfg)
    rng = np.random.default_rng(cfg.seed)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        vq, model = MultiScaleVQ(spec), NextScaleTransformer(spec)
        vq_losses = train_vq(cfg, vq.train(), rng, progress)
        vq.eval().requires_grad_(False)
        tf_losses = train_transformer(cfg, vq, model.train(), rng, progress)
    quality = reconstruction_quality(vq)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_var(tmp, vq, model.eval())
    (tmp / INFO_FILE).write_text(json.dumps({"config": raw, "vq_losses": vq_losses, "transformer_losses": tf_losses,
                                             "reconstruction": quality}))
    mark_written(tmp, "pretrain-imagegen")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


def save_var(folder: Path, vq: MultiScaleVQ, model: NextScaleTransformer) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SPEC_FILE).write_text(json.dumps(dataclasses.asdict(model.spec)))
    save_file({k: v.contiguous() for k, v in vq.state_dict().items()}, folder / VQ_FILE)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / TRANSFORMER_FILE)


def load_var(folder: str | Path) -> tuple[MultiScaleVQ, NextScaleTransformer]:
    """(VQ, transformer) of a folder written by :func:`save_var`, in eval mode."""
    folder = Path(folder)
    missing = [f for f in (SPEC_FILE, VQ_FILE, TRANSFORMER_FILE) if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a VAR model folder (missing {missing}); build one with "
                                f"`mmrl pretrain-imagegen assets/imagegen/var_tiny.json --out DIR`")
    data = json.loads((folder / SPEC_FILE).read_text())
    spec = build(VARSpec, data, str(folder / SPEC_FILE))
    vq, model = MultiScaleVQ(spec), NextScaleTransformer(spec)
    vq.load_state_dict(load_file(folder / VQ_FILE))
    model.load_state_dict(load_file(folder / TRANSFORMER_FILE))
    return vq.eval(), model.eval()


def cached_var(config: str | Path, progress: bool = True) -> Path:
    """The model folder of ``config``, pretrained once and cached (key: the config's content)."""
    from mmrl.core.paths import cache_root

    _, raw = load_var_config(config)
    key = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root() / "imagegen" / f"var-{key}"
    if not (path / TRANSFORMER_FILE).is_file():
        shutil.rmtree(path, ignore_errors=True)
        pretrain_var(config, path, progress=progress)
    return path


def run_pretrain_var(args) -> str:
    out = pretrain_var(args.config, args.out, progress=not args.no_progress, overwrite=args.overwrite,
                       steps=args.steps)
    info = json.loads((out / INFO_FILE).read_text())
    q = info["reconstruction"]
    return (f"VAR model saved to {out} (VQ final loss {np.mean(info['vq_losses'][-50:]):.4f}, PSNR "
            f"{q['psnr_db']:.1f} dB, reconstructions correct {q['reconstruction_correct']:.2f}, codebook usage "
            f"{q['codebook_usage']:.2f}; transformer final NLL {np.mean(info['transformer_losses'][-50:]):.3f})")
