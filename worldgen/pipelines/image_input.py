"""Turn whatever image a user hands us into RGB: grayscale, palette, RGBA, 16-bit, float arrays.

The seeds of this project died on "got 1 channels"; here every mode becomes 8-bit RGB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from worldgen.errors import InputError


def _array_to_image(array: np.ndarray, source: str) -> Image.Image:
    a = np.asarray(array)
    if a.ndim == 3 and a.shape[0] in (1, 3, 4) and a.shape[-1] not in (1, 3, 4):
        a = np.moveaxis(a, 0, -1)  # CHW -> HWC
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)):
        raise InputError(f"{source}: image array of shape {a.shape} is not HxW, HxWx3 or HxWx4")
    if not np.isfinite(a).all():
        raise InputError(f"{source}: image array has NaN or infinite values")
    if a.dtype == np.uint16:
        a = (a >> 8).astype(np.uint8)
    elif a.dtype.kind == "f":
        a = np.clip(a * 255.0 if a.max() <= 1.0 else a, 0, 255).round().astype(np.uint8)
    elif a.dtype != np.uint8:
        a = np.clip(a, 0, 255).astype(np.uint8)
    return Image.fromarray(a)


def to_rgb(image: Image.Image, source: str = "image") -> Image.Image:
    """Any PIL mode -> 8-bit RGB (alpha composited over white, 16-bit scaled, palettes expanded)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or a.max() > 255 else 255.0
        image = Image.fromarray(np.clip(a / peak * 255.0, 0, 255).round().astype(np.uint8))
    elif image.mode == "F":
        return to_rgb(_array_to_image(np.asarray(image), source), source)
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image.convert("RGBA"))
    return image.convert("RGB")


def load_image(image: str | Path | Image.Image | np.ndarray) -> Image.Image:
    """A path, PIL image or numpy array -> PIL RGB image."""
    if isinstance(image, Image.Image):
        return to_rgb(image)
    if isinstance(image, np.ndarray):
        return to_rgb(_array_to_image(image, "image array"))
    path = Path(image)
    try:
        with Image.open(path) as img:
            img.load()
            return to_rgb(img, str(path))
    except FileNotFoundError:
        raise InputError(f"{path}: image file not found") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"{path}: not a readable image ({exc}); use a JPEG or PNG") from None
