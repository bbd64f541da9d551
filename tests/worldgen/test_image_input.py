"""Every image mode users hand us becomes 8-bit RGB (never "got 1 channels")."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from worldgen.errors import InputError
from worldgen.pipelines.image_input import load_image


@pytest.mark.parametrize("mode", ["L", "LA", "P", "RGBA", "CMYK", "I;16", "I", "F", "1"])
def test_modes_become_rgb(tmp_path, mode):
    base = Image.fromarray(np.linspace(0, 255, 64 * 48, dtype=np.float64).reshape(48, 64).astype(np.uint8))
    img = Image.fromarray(np.asarray(base, dtype=np.uint16) * 257) if mode == "I;16" else base.convert(mode)
    rgb = load_image(img)
    assert rgb.mode == "RGB" and rgb.size == (64, 48)
    a = np.asarray(rgb)
    assert a[..., 0].max() > 200 and a[..., 0].min() < 60  # the gradient survived (no all-black 16-bit)


def test_rgba_alpha_composited_over_white():
    img = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert (np.asarray(load_image(img)) == 255).all()


def test_arrays_hwc_chw_float():
    a = np.random.default_rng(0).random((3, 8, 10)).astype(np.float32)
    assert load_image(a).size == (10, 8)
    assert load_image((a.transpose(1, 2, 0) * 255).astype(np.uint8)).mode == "RGB"


def test_unreadable_file_is_named(tmp_path):
    bad = tmp_path / "image.jpg"
    bad.write_text("not an image")
    with pytest.raises(InputError, match="image.jpg"):
        load_image(bad)
    with pytest.raises(InputError, match="not found"):
        load_image(tmp_path / "missing.png")
