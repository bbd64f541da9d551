"""PSNR and SSIM against their definitions and an independent scipy implementation of SSIM."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter

from comparison.metrics import psnr, resize_to, ssim


def textured(seed: int = 0, shape=(60, 80, 3)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = rng.uniform(0, 255, shape)
    return np.clip(gaussian_filter(image, sigma=(2, 2, 0)) * 2 - 128, 0, 255).astype(np.uint8)


def ssim_reference(a: np.ndarray, b: np.ndarray) -> float:
    """Wang et al. 2004 written with scipy.ndimage, as scikit-image does (gaussian_weights=True)."""
    c1, c2, pad = (0.01 * 255) ** 2, (0.03 * 255) ** 2, 5
    values = []
    for ch in range(a.shape[2]):
        x, y = a[..., ch].astype(np.float64), b[..., ch].astype(np.float64)

        def blur(img):
            return gaussian_filter(img, sigma=1.5, truncate=3.5, mode="reflect")

        mx, my = blur(x), blur(y)
        unbias = 121 / 120
        vx, vy = unbias * (blur(x * x) - mx * mx), unbias * (blur(y * y) - my * my)
        cxy = unbias * (blur(x * y) - mx * my)
        s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
        values.append(s[pad:-pad, pad:-pad].mean())
    return float(np.mean(values))


def test_identical_images():
    image = textured()
    assert psnr(image, image) == math.inf
    assert ssim(image, image) == pytest.approx(1.0, abs=1e-12)


def test_psnr_of_a_known_error():
    image = np.full((10, 10, 3), 100, np.uint8)
    # every value off by 10 -> MSE 100 -> 10 log10(255^2 / 100)
    assert psnr(image, image + 10) == pytest.approx(10 * math.log10(255**2 / 100))


def test_ssim_matches_an_independent_implementation():
    a = textured(0)
    rng = np.random.default_rng(1)
    b = np.clip(a.astype(int) + rng.integers(-40, 40, a.shape), 0, 255).astype(np.uint8)
    assert ssim(a, b) == pytest.approx(ssim_reference(a, b), abs=1e-9)
    assert 0.2 < ssim(a, b) < 0.9


def test_metrics_fall_as_the_image_degrades():
    a = textured(0)
    rng = np.random.default_rng(2)
    noisy = [np.clip(a + rng.normal(0, s, a.shape), 0, 255).astype(np.uint8) for s in (2, 10, 40)]
    ssims = [ssim(a, n) for n in noisy]
    psnrs = [psnr(a, n) for n in noisy]
    assert ssims == sorted(ssims, reverse=True) and psnrs == sorted(psnrs, reverse=True)
    assert ssims[0] > 0.95
    assert ssim(a, textured(5)) < 0.3, "unrelated images are dissimilar"


def test_shape_mismatch_is_refused_and_resize_fixes_it():
    a, b = textured(0), textured(1, shape=(30, 40, 3))
    with pytest.raises(ValueError, match="differ in shape"):
        psnr(a, b)
    assert resize_to(b, 60, 80).shape == a.shape
    assert resize_to(a, 60, 80) is a
