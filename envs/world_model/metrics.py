"""Frame distances for the world model's accuracy and the VLA-RFT reward: MAE and SSIM.

VLA-RFT's reward (Li et al. 2025, eq. 3) is −(L1 + LPIPS) between the world model's frames under
the policy's actions and under the expert's. LPIPS needs downloaded VGG/AlexNet weights, so our
perceptual term is 1 − SSIM (Wang et al. 2004), computed here with no download.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

SSIM_C1 = 0.01 ** 2  # (K1·L)² with K1 = 0.01 and dynamic range L = 1 (Wang et al. 2004, eq. 13)
SSIM_C2 = 0.03 ** 2


def gaussian_window(size: int = 7, sigma: float = 1.5) -> Tensor:
    """Normalised 2-D Gaussian kernel [size, size]."""
    x = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    g = torch.exp(-x ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim(a: Tensor, b: Tensor, window: int = 7) -> Tensor:
    """Mean SSIM per image of a, b [B, C, H, W] in [0, 1] → [B] (Gaussian window, σ = 1.5).

    Non-finite pixels are treated as 0 so the result is always finite, in [−1, 1].
    """
    if a.shape != b.shape or a.dim() != 4:
        raise ValueError(f"ssim needs two [B, C, H, W] tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = torch.nan_to_num(a.float()), torch.nan_to_num(b.float())
    c = a.shape[1]
    kernel = gaussian_window(window).to(a.device).expand(c, 1, window, window)
    blur = lambda x: F.conv2d(x, kernel, groups=c)  # noqa: E731  ('valid' windows, as scikit-image)
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a ** 2
    var_b = blur(b * b) - mu_b ** 2
    cov = blur(a * b) - mu_a * mu_b
    value = ((2 * mu_a * mu_b + SSIM_C1) * (2 * cov + SSIM_C2)) / ((mu_a ** 2 + mu_b ** 2 + SSIM_C1) * (var_a + var_b + SSIM_C2))
    return value.flatten(1).mean(1).clamp(-1, 1)


def mae(a: Tensor, b: Tensor) -> Tensor:
    """Mean absolute pixel difference per image of a, b [B, C, H, W] in [0, 1] → [B]."""
    return (torch.nan_to_num(a.float()) - torch.nan_to_num(b.float())).abs().flatten(1).mean(1)


def frame_distance(a: Tensor, b: Tensor) -> Tensor:
    """MAE + (1 − SSIM) per image → [B], in [0, 3]: the negated VLA-RFT reward of one frame pair."""
    return mae(a, b) + (1.0 - ssim(a, b))
