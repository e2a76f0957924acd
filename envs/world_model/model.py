"""An action-conditioned latent-dynamics video model: the learned simulator of VLA-RFT at CPU scale.

    frame x_0 ─ conv encoder ─ z_0 ─┬─ z_{t+1} = z_t + f([z_t, a_t])  (residual MLP dynamics)
                                    └─ each z_t ─ conv decoder ─ x̂_t,   proprio head ─ p̂_t

VLA-RFT (Li et al. 2025, §3.1) uses iVideoGPT (a VQ tokenizer + an autoregressive transformer).
On one CPU thread a deterministic latent model (the "latent overshooting"-free open-loop variant of
PlaNet's deterministic path, Hafner et al. 2019) trains in minutes and is what we use: it is
trained on exactly what the environment does, an open-loop rollout of the latent from the
encoded first frame under a sequence of actions (multi-step prediction loss, see
:mod:`mmrl.envs.world_model.training`).

Saved as a folder: ``model.safetensors`` (weights) + ``config.json`` (:class:`WorldModelConfig`:
image size, action dims, task id, widths) + ``reference_pool.npz`` (the real initial frames and
expert actions the environment resets from, see :mod:`mmrl.envs.world_model.env`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
POOL_FILE = "reference_pool.npz"
ARCHITECTURE = "mmrl.LatentWorldModel"


@dataclass(frozen=True)
class WorldModelConfig:
    task: str = "reach"
    """Table-top task whose frames the model predicts (a key of ``mmrl.envs.robot.RULES``)."""
    image_size: int = 64
    """Side of the square RGB frames (must be divisible by 16: four stride-2 convolutions)."""
    action_dims: int = 2
    """Action dimensions (reach / push: 2; pick-and-place: 4)."""
    proprio_dims: int = 4
    """Proprioception predicted with each frame (the env's ``proprio``)."""
    latent: int = 128
    """Size of the latent state z."""
    channels: int = 32
    """Base conv width c: the encoder's stages have c/2, c, 2c, 2c channels (the decoder mirrors it)."""
    hidden: int = 256
    """Width of the dynamics MLP."""
    max_steps: int = 30
    """Steps of one episode in the learned simulator (the real task's time limit)."""

    def validate(self) -> None:
        if self.image_size % 16 or not 16 <= self.image_size <= 256:
            raise ValueError(f"world model image_size must be a multiple of 16 in 16..256, got {self.image_size}")
        for name in ("action_dims", "proprio_dims", "latent", "channels", "hidden", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"world model {name} must be >= 1, got {getattr(self, name)}")


class LatentWorldModel(nn.Module):
    """Encoder, residual latent dynamics, frame decoder and proprio head (see the module docstring)."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        s, w = cfg.image_size // 16, self.widths()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, w[0], 4, 2, 1), nn.GELU(), nn.Conv2d(w[0], w[1], 4, 2, 1), nn.GELU(),
            nn.Conv2d(w[1], w[2], 4, 2, 1), nn.GELU(), nn.Conv2d(w[2], w[3], 4, 2, 1), nn.GELU(),
            nn.Flatten(), nn.Linear(w[3] * s * s, cfg.latent))
        self.dynamics = nn.Sequential(
            nn.Linear(cfg.latent + cfg.action_dims, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(),
            nn.Linear(cfg.hidden, cfg.latent))
        nn.init.zeros_(self.dynamics[-1].weight)  # start as the identity map z_{t+1} = z_t
        nn.init.zeros_(self.dynamics[-1].bias)
        self.decoder_in = nn.Linear(cfg.latent, w[3] * s * s)
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(w[3], w[2], 4, 2, 1), nn.GELU(), nn.ConvTranspose2d(w[2], w[1], 4, 2, 1), nn.GELU(),
            nn.ConvTranspose2d(w[1], w[0], 4, 2, 1), nn.GELU(), nn.ConvTranspose2d(w[0], 4, 4, 2, 1))
        nn.init.constant_(self.decoder[-1].bias[3], 3.0)  # the mask starts near 1: copy the first frame
        self.proprio_head = nn.Sequential(nn.Linear(cfg.latent, cfg.hidden), nn.GELU(),
                                          nn.Linear(cfg.hidden, cfg.proprio_dims))

    def widths(self) -> tuple[int, int, int, int]:
        """Conv widths at 1/2, 1/4, 1/8, 1/16 of the image side: narrow where the maps are large."""
        c = self.cfg.channels
        return max(1, c // 2), c, 2 * c, 2 * c

    @staticmethod
    def to_input(frames: Tensor) -> Tensor:
        """uint8 [B, H, W, 3] → float [B, 3, H, W] in [−0.5, 0.5]."""
        return frames.permute(0, 3, 1, 2).float() / 255.0 - 0.5

    def encode(self, frames: Tensor) -> Tensor:
        """Latent z [B, latent] of real frames [B, H, W, 3] uint8."""
        size = self.cfg.image_size
        if frames.shape[1:] != (size, size, 3):
            raise ValueError(f"frames must be [B, {size}, {size}, 3] for this world model, got {tuple(frames.shape)}")
        return self.encoder(self.to_input(frames))

    def step(self, z: Tensor, actions: Tensor) -> Tensor:
        """z_{t+1} from z_t [B, latent] and actions [B, A] in [−1, 1]."""
        return z + self.dynamics(torch.cat([z, actions.clamp(-1, 1)], dim=-1))

    def decode(self, z: Tensor, first_frames: Tensor) -> Tensor:
        """Predicted frames [B, 3, H, W] in [0, 1]: x̂ = m ⊙ x_0 + (1 − m) ⊙ g.

        The decoder paints colours g and a mask m (compositing, as in Finn et al. 2016's CDNA):
        what does not change (the table, a still object) is copied from the real first frame
        ``first_frames`` [B, H, W, 3] uint8 of the episode; what moves (the arm) is painted.
        """
        s = self.cfg.image_size // 16
        out = self.decoder(self.decoder_in(z).view(-1, self.widths()[3], s, s))
        mask, paint = torch.sigmoid(out[:, 3:]), torch.sigmoid(out[:, :3])
        first = first_frames.permute(0, 3, 1, 2).float() / 255.0
        return mask * first + (1 - mask) * paint

    def proprio(self, z: Tensor) -> Tensor:
        return self.proprio_head(z)

    def rollout_latents(self, first_frames: Tensor, actions: Tensor) -> Tensor:
        """Open-loop latents [B, T+1, latent] from first frames [B, H, W, 3] and actions [B, T, A]."""
        z = self.encode(first_frames)
        latents = [z]
        for t in range(actions.shape[1]):
            z = self.step(z, actions[:, t])
            latents.append(z)
        return torch.stack(latents, dim=1)

    @staticmethod
    def to_uint8(frames: Tensor) -> Tensor:
        """[B, 3, H, W] in [0, 1] → [B, H, W, 3] uint8."""
        return (frames.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)

    # -- saving -----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, out / WEIGHTS_FILE)
        (out / CONFIG_FILE).write_text(json.dumps({"architecture": ARCHITECTURE, **asdict(self.cfg)}, indent=1))


def read_config(path: str | Path) -> WorldModelConfig:
    """The :class:`WorldModelConfig` of a saved world-model folder; clear errors when it is not one."""
    folder = Path(path)
    file = folder / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: a world-model checkpoint is a folder written by "
                                f"`mmrl train-world-model <recipe> --out DIR`")
    raw = json.loads(file.read_text())
    if raw.pop("architecture", None) != ARCHITECTURE:
        raise ValueError(f"{file} is not a world-model checkpoint (architecture must be {ARCHITECTURE!r})")
    known = set(WorldModelConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{file} has unknown world-model fields {unknown}; known: {sorted(known)}")
    return WorldModelConfig(**raw)


def load_world_model(path: str | Path) -> LatentWorldModel:
    """A saved world model (eval mode, no gradients)."""
    cfg = read_config(path)
    model = LatentWorldModel(cfg)
    file = Path(path) / WEIGHTS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found next to {Path(path) / CONFIG_FILE}")
    missing, unexpected = model.load_state_dict(load_file(file), strict=False)
    if missing or unexpected:
        raise ValueError(f"{file} does not fit its config.json (missing {missing}, unexpected {unexpected})")
    return model.eval().requires_grad_(False)
