"""Image metrics between a sim frame and a rollout frame: PSNR and SSIM.

SSIM is hand-written (about ten lines) rather than pulled from scikit-image so the comparison
extra stays numpy + OpenCV. It is Wang et al. 2004 as scikit-image computes it with
`gaussian_weights=True`: an 11x11 Gaussian window with sigma 1.5, K1 = 0.01, K2 = 0.03, L = 255,
sample covariances (N / (N - 1)), reflected borders, the 5-pixel border left out of the mean, and
the mean taken over the R, G and B channels. PSNR is over all RGB values with peak 255; identical
frames give +inf.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

SSIM_SIGMA = 1.5
SSIM_WINDOW = 11
_C1 = (0.01 * 255) ** 2
_C2 = (0.03 * 255) ** 2


def _check_pair(a: np.ndarray, b: np.ndarray) -> None:
    if a.shape != b.shape:
        raise ValueError(f"frames differ in shape: {a.shape} vs {b.shape}; resize one to the other first")
    if a.ndim not in (2, 3):
        raise ValueError(f"expected an image [H, W] or [H, W, C], got shape {a.shape}")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two uint8 images (peak 255); +inf when identical."""
    _check_pair(a, b)
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(255.0**2 / mse)


def _blur(image: np.ndarray) -> np.ndarray:
    return cv2.GaussianBlur(image, (SSIM_WINDOW, SSIM_WINDOW), SSIM_SIGMA, borderType=cv2.BORDER_REFLECT)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Structural similarity of two uint8 images (Gaussian window, mean over channels); 1.0 = identical."""
    _check_pair(a, b)
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    if x.ndim == 2:
        x, y = x[..., None], y[..., None]
    n = SSIM_WINDOW * SSIM_WINDOW
    unbias = n / (n - 1)  # sample covariance, as scikit-image uses
    values = []
    for channel in range(x.shape[2]):
        xc, yc = x[..., channel], y[..., channel]
        mu_x, mu_y = _blur(xc), _blur(yc)
        var_x = unbias * (_blur(xc * xc) - mu_x * mu_x)
        var_y = unbias * (_blur(yc * yc) - mu_y * mu_y)
        cov = unbias * (_blur(xc * yc) - mu_x * mu_y)
        ssim_map = ((2 * mu_x * mu_y + _C1) * (2 * cov + _C2)) / (
            (mu_x * mu_x + mu_y * mu_y + _C1) * (var_x + var_y + _C2)
        )
        pad = (SSIM_WINDOW - 1) // 2
        inner = ssim_map[pad:-pad, pad:-pad] if min(ssim_map.shape) > 2 * pad else ssim_map
        values.append(float(inner.mean()))
    return float(np.mean(values))


def resize_to(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize an RGB frame to (height, width): area averaging when shrinking, bilinear when growing."""
    if frame.shape[:2] == (height, width):
        return frame
    shrinking = height * width < frame.shape[0] * frame.shape[1]
    interpolation = cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR
    return cv2.resize(frame, (width, height), interpolation=interpolation)
