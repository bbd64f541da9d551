"""What a request will really generate, worked out before any model loads.

The reference adjusts a request in three places: the frame count is rounded down to 4n+1, then cut
to what the poses cover, and the frame size follows the image's aspect under the `size` pixel budget
(rounded down to multiples of 16, so `480*832` with a 480*832 image gives 464*832). `resolve_request`
applies those rules to the settings, the image size and the pose count (numpy only, no torch), so
`generate` can fail on bad input in a second and say in one line per change what it will do instead
of what was asked ("81 frames asked, 33 poses: generating 33"). The pipeline applies the same rules
(`worldgen.pipelines.camera.frames_for_poses`, `worldgen.pipelines.base.latent_size` are these functions),
and so does the server's door (`bridge.server.request_handling`): defined here, in the bottom layer, once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contracts.errors import InputError
from contracts.model_families import V1_FAST
from contracts.model_frame import format_size
from contracts.settings import GenerationSettings

VAE_STRIDE = (4, 8, 8)  # temporal, height, width
PATCH = (1, 2, 2)  # the DiT's patch: latent sizes are multiples of 2
MIN_FRAMES = 5  # 2 latent frames: the shortest video with any motion
# latent frames per Fast chunk: v1 Fast's, the smallest of the causal-fast families (contracts.model_families), so the
# door refuses no length some family can make; a LingBot-World 2.0 worker (4-frame chunks) names its own minimum
FAST_CHUNK_FRAMES = V1_FAST.chunk_frames
FAST_MIN_FRAMES = (FAST_CHUNK_FRAMES - 1) * VAE_STRIDE[0] + 1  # 9: the Fast model makes whole chunks only


def min_frames(model: str) -> int:
    """The fewest frames (4n+1) a job of `model` makes: one whole chunk for fast, 2 latent frames else."""
    return FAST_MIN_FRAMES if model == "fast" else MIN_FRAMES


def frames_4n1(frame_num: int) -> int:
    """`frame_num` rounded down to 4n+1 (what the VAE's temporal stride needs)."""
    if frame_num < 1:
        raise InputError(f"frame_num is {frame_num}; it must be 4n+1 >= 1 (e.g. 81)")
    return (frame_num - 1) // VAE_STRIDE[0] * VAE_STRIDE[0] + 1


def frames_covered(frame_num: int, num_poses: int) -> int:
    """Frames generated for `frame_num` asked and `num_poses` poses: 4n+1, at most what the poses cover."""
    return min(frames_4n1(frame_num), frames_4n1(num_poses))


def latent_size(image_hw: tuple[int, int], max_area: int) -> tuple[int, int]:
    """(lat_h, lat_w) for an image of (h0, w0) and a pixel budget, as the reference computes it."""
    h0, w0 = image_hw
    aspect = h0 / w0
    lat_h = round(np.sqrt(max_area * aspect) // VAE_STRIDE[1] // PATCH[1] * PATCH[1])
    lat_w = round(np.sqrt(max_area / aspect) // VAE_STRIDE[2] // PATCH[2] * PATCH[2])
    if lat_h < PATCH[1] or lat_w < PATCH[2]:
        raise InputError(
            f"size: max_area {max_area} is too small for a {format_size(h0, w0)} image (H*W); "
            f"use at least {smallest_size(image_hw)}"
        )
    return lat_h, lat_w


def smallest_size(image_hw: tuple[int, int]) -> str:
    """The smallest "H*W" size (sides multiples of 16, the image's orientation) that `latent_size`
    accepts for an image of (h0, w0): what to suggest when a size is too small."""
    h0, w0 = image_hw
    side = VAE_STRIDE[1] * PATCH[1]  # 16 pixels: one latent patch
    long = side * max(1, -(-max(h0, w0) // min(h0, w0)))  # the aspect, rounded up to whole patches
    while True:
        height, width = (long, side) if h0 > w0 else (side, long)
        lat_h = np.sqrt(height * width * h0 / w0) // VAE_STRIDE[1] // PATCH[1] * PATCH[1]
        lat_w = np.sqrt(height * width * w0 / h0) // VAE_STRIDE[2] // PATCH[2] * PATCH[2]
        if lat_h >= PATCH[1] and lat_w >= PATCH[2]:
            return f"{height}*{width}"
        long += side  # a rounding short of a whole patch: one more


@dataclass(frozen=True)
class ResolvedRequest:
    """What will be generated: frames, frame size, and one sentence per change to the request."""

    frames: int
    height: int
    width: int
    adjustments: tuple[str, ...]


def resolve_request(settings: GenerationSettings, image_hw: tuple[int, int], num_poses: int | None) -> ResolvedRequest:
    """Apply the reference's frame and size rules; raise InputError when nothing sensible is left."""
    adjustments = []
    asked = settings.frame_num
    frames = frames_4n1(asked)
    if frames != asked:
        adjustments.append(f"{asked} frames asked, not 4n+1: generating {frames}")
    if num_poses is not None:
        covered = frames_4n1(num_poses)
        if covered < frames:
            adjustments.append(f"{frames} frames asked, {num_poses} poses: generating {covered}")
            frames = covered
    least = min_frames(settings.model)
    if frames < least:
        why = f" (model fast makes whole chunks of {FAST_CHUNK_FRAMES} latent frames)" if least != MIN_FRAMES else ""
        raise InputError(f"frame_num {asked} is too small: use at least {least} frames (4n+1){why}")
    lat_h, lat_w = latent_size(image_hw, settings.max_area)
    height, width = lat_h * VAE_STRIDE[1], lat_w * VAE_STRIDE[2]
    h0, w0 = image_hw
    size_h, size_w = settings.height_width
    if (height, width) not in ((size_h, size_w), (size_w, size_h)):
        adjustments.append(
            # one convention in this message: every size is H*W, as `size` itself is written
            f"size {settings.size} with a {format_size(h0, w0)} image (H*W): generating {format_size(height, width)} "
            f"(the image's aspect in at most {size_h * size_w} pixels, sides multiples of 16)"
        )
    return ResolvedRequest(frames, height, width, tuple(adjustments))
