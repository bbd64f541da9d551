"""Pinhole intrinsics from a USD-style lens: focal length, apertures, aperture offsets, resolution.

No pxr here, so HDF5 readers (which store the lens as numbers) share the formula with
`camera.py`. Focal length and apertures only enter as ratios, so their unit (tenths of a stage
unit, i.e. millimetres on a centimetre stage) does not matter.

    fx = fy = W f / hA,   cx = W/2 - W ox / hA,   cy = H/2 + W oy / hA

Square pixels from the horizontal aperture: Isaac Sim's RTX renderer fits the horizontal aperture
to the image width and takes the vertical field of view from the image's aspect ratio; the
vertical aperture does not change the picture (Isaac Lab 2.x's `Camera._update_intrinsic_matrices`
sets f_y = f_x for this reason, and Isaac Lab 3.x spawns cameras with vA = hA H / W). So a
36 x 24 mm aperture rendered at 832 x 480 has fx = fy = 832 f / 36; the vertical aperture only
triggers a warning when its aspect differs from the image's (`NonSquarePixelWarning`).

A positive horizontal offset moves the film window right (+X), so the optical axis lands left
of the image centre; a positive vertical offset moves it up (+Y in USD, -y in the image). Offsets
are in the same film units as the apertures, so both use the one pixel size W / hA.
"""

from __future__ import annotations

import warnings

import numpy as np

# How far fx/fy may differ from 1 before we warn: the LingBot examples themselves differ by 4e-4.
SQUARE_PIXEL_TOLERANCE = 1e-3


class CameraError(ValueError):
    """A camera cannot be turned into a pinhole pose + intrinsics (names the camera and the fix)."""


class LensError(CameraError):
    """A lens value cannot describe a pinhole camera (non-positive focal length or aperture)."""


class NonSquarePixelWarning(UserWarning):
    """The apertures' aspect ratio differs from the render resolution's (the vertical one is ignored)."""


def pinhole_intrinsics(
    focal_length: np.ndarray | float,
    horizontal_aperture: np.ndarray | float,
    vertical_aperture: np.ndarray | float,
    width: int,
    height: int,
    horizontal_offset: np.ndarray | float = 0.0,
    vertical_offset: np.ndarray | float = 0.0,
    where: str = "camera",
) -> np.ndarray:
    """(fx, fy, cx, cy) in pixels of a width x height image; arrays of lens values give [N, 4]."""
    f, h_ap, v_ap, h_off, v_off = np.broadcast_arrays(
        *(
            np.asarray(v, dtype=np.float64)
            for v in (
                focal_length,
                horizontal_aperture,
                vertical_aperture,
                horizontal_offset,
                vertical_offset,
            )
        )
    )
    if width < 1 or height < 1:
        raise LensError(f"{where}: render resolution must be positive (got {width}x{height})")
    for name, value in (("focal length", f), ("horizontal aperture", h_ap), ("vertical aperture", v_ap)):
        if not np.all(np.isfinite(value)) or np.any(value <= 0):
            first = np.ravel(value)[:4].tolist()
            raise LensError(f"{where}: {name} must be a positive number (got {first}...)")
    if not (np.all(np.isfinite(h_off)) and np.all(np.isfinite(v_off))):
        raise LensError(f"{where}: aperture offsets must be finite")
    pixels_per_unit = width / h_ap  # one pixel size for both axes: square pixels
    fx = f * pixels_per_unit
    fy = fx.copy()
    cx = width / 2 - h_off * pixels_per_unit
    cy = height / 2 + v_off * pixels_per_unit
    mismatch = np.max(np.abs((v_ap / h_ap) / (height / width) - 1))
    if mismatch > SQUARE_PIXEL_TOLERANCE:
        h0, v0 = float(np.ravel(h_ap)[0]), float(np.ravel(v_ap)[0])
        warnings.warn(
            f"{where}: apertures {h0:g} x {v0:g} have aspect {v0 / h0:.4f} but the image is {width}x{height} "
            f"({height / width:.4f}). Isaac Sim renders square pixels from the horizontal aperture, so the "
            f"vertical aperture is ignored (the image sees {h0 * height / width:g} of it vertically); set "
            f"the vertical aperture to {h0 * height / width:g} to make the stage say what is rendered.",
            NonSquarePixelWarning,
            stacklevel=2,
        )
    return np.stack([fx, fy, cx, cy], axis=-1)
