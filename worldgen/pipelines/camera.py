"""Camera actions (LingBot `poses.npy` + `intrinsics.npy`) and the Plücker camera conditioning.

An action is N camera-to-world 4x4 matrices (OpenCV axes: x right, y down, z forward; any unit)
and intrinsics `fx, fy, cx, cy` in pixels of a 480x832 (h x w) frame, one row per pose or a single
row; only row 0 is used. `load_action` / `validate_action` check all of it with the one episode
validator (`contracts.episode`) and raise `InputError` naming the file or field and the fix.

`camera_conditioning` turns an action into what the DiT consumes, as the reference does:
1. take the first F poses and resample them to the latent frame rate (indices
   linspace(0, F-1, (F-1)//4 + 1)): linear translation, slerp rotation, in float64 with scipy
   (`interp1d`, `Rotation`, `Slerp`, exactly the reference's calls), then cast to float32;
2. in float32 torch: relative to the first pose, then frame-to-frame, translations divided by the
   largest translation norm (or by the job's `translation_scale` when given: one fixed scale, the
   same for a batch and a live job, `worldgen.pipelines.fast_live`). The reference does these in float32 and example 02 has translations
   in the thousands, so float64 here would differ from it by up to 3e-2 -- the float32 torch ops
   are kept on purpose, in the reference's order;
3. Plücker rays [o, d] per pixel centre with the intrinsics scaled from 480x832 to (height, width),
   each 8x8 pixel block folded into channels: [1, 6*8*8 = 384, lat_f, height/8, width/8] with
   channel order (c, row in block, column in block).
Needs no model; the result is float32 on the CPU (cast and move it where the DiT runs).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.interpolate import interp1d
from scipy.spatial.transform import Rotation, Slerp

from contracts import episode
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH
from worldgen.errors import InputError

PATCH = 8  # VAE spatial stride: one latent pixel per 8x8 block of Plücker rays
TEMPORAL_STRIDE = 4  # VAE temporal stride: frame counts are 4n+1


@dataclass(frozen=True)
class CameraCondition:
    """The camera conditioning of one rollout (all float32, CPU)."""

    frame_num: int  # video frames F actually generated (4n+1, at most what the poses cover)
    relative_poses: torch.Tensor  # [lat_f, 4, 4]: resampled, frame-to-frame, translations normalised
    K: torch.Tensor  # [4]: fx, fy, cx, cy in pixels of the (height, width) frame
    plucker: torch.Tensor  # [1, 384, lat_f, height/8, width/8]


# --- input files and their validation -------------------------------------------------------------


def load_action(action_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate `poses.npy` and `intrinsics.npy` of an action folder (`contracts.episode`'s
    rules, at least GENERATE_MIN_POSES poses).

    Returns (poses [N,4,4] float32, intrinsics [N,4] or [1,4] float32).
    """
    try:
        poses, intrinsics = episode.load_action(action_dir, min_poses=episode.GENERATE_MIN_POSES)
    except episode.EpisodeError as exc:
        raise InputError(str(exc)) from None
    return poses.astype(np.float32), intrinsics.astype(np.float32)


def validate_action(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    source: str = "action",
    *,
    poses_name: str = "poses",
    intrinsics_name: str = "intrinsics",
) -> tuple[np.ndarray, np.ndarray]:
    """Check camera poses and intrinsics (`contracts.episode.check_action`, at least
    GENERATE_MIN_POSES poses); return them as float32 copies (intrinsics as [N,4] or [1,4]).

    Messages read "{source}: {poses_name} ..." so they name where the arrays came from; raises
    `InputError`.
    """
    try:
        poses, intrinsics = episode.check_action(
            poses,
            intrinsics,
            where=source,
            min_poses=episode.GENERATE_MIN_POSES,
            poses_name=poses_name,
            intrinsics_name=intrinsics_name,
        )
    except episode.EpisodeError as exc:
        raise InputError(str(exc)) from None
    return poses.astype(np.float32), intrinsics.astype(np.float32)


def validate_camera(
    poses: np.ndarray | None, intrinsics: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """A generate call's camera: both poses and intrinsics (checked by `validate_action`), or neither
    (None, None: the model runs unconditioned on camera); one without the other is refused."""
    if (poses is None) != (intrinsics is None):
        raise InputError("camera control needs both poses.npy and intrinsics.npy (or neither)")
    return (None, None) if poses is None else validate_action(poses, intrinsics)


# --- frame counts -----------------------------------------------------------------------------------


def frames_for_poses(frame_num: int, num_poses: int) -> int:
    """Video frames generated for a request of `frame_num` frames with `num_poses` poses.

    The VAE needs 4n+1 frames: another count is rounded down, with a warning. Then, as in the
    reference, the video is cut to what the poses cover: min(F, ((N-1)//4)*4 + 1).
    """
    from worldgen.pipelines.request import frames_4n1, frames_covered  # the rule lives there (no torch)

    frames = frames_4n1(frame_num)
    if frames != frame_num:
        warnings.warn(f"frame_num {frame_num} is not 4n+1; using {frames} frames", stacklevel=2)
    return frames_covered(frame_num, num_poses)


# --- conditioning -------------------------------------------------------------------------------------


def camera_conditioning(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    frame_num: int,
    height: int,
    width: int,
    translation_scale: float | None = None,
) -> CameraCondition:
    """Camera conditioning of a (height x width) video of up to `frame_num` frames (see module doc)."""
    if height <= 0 or width <= 0 or height % PATCH or width % PATCH:
        raise InputError(f"video size {height}x{width} must be positive multiples of {PATCH}")
    poses, intrinsics = validate_action(poses, intrinsics, source="camera_conditioning")
    frames = frames_for_poses(frame_num, len(poses))
    latent_frames = (frames - 1) // TEMPORAL_STRIDE + 1
    c2w = resample_poses(poses[:frames], latent_frames)
    relative = relative_poses(c2w, translation_scale)
    K = scale_intrinsics(torch.from_numpy(intrinsics[:1]), height, width)[0]
    plucker = plucker_embedding(relative, K, height, width)
    return CameraCondition(frame_num=frames, relative_poses=relative, K=K, plucker=plucker)


def resample_poses(poses: np.ndarray, num_targets: int) -> torch.Tensor:
    """Resample [n,4,4] poses at `num_targets` evenly spaced indices of 0..n-1 -> float32 [m,4,4].

    Translation linearly (scipy interp1d), rotation by slerp (quaternions sign-aligned to their
    predecessor first, so no interpolation takes the long way round), all in float64.
    """
    n = len(poses)
    return resample_poses_at(poses, np.linspace(0, n - 1, num_targets))


def resample_poses_at(poses: np.ndarray, target_index: np.ndarray) -> torch.Tensor:
    """[n,4,4] poses sampled at fractional indices `target_index` (within 0..n-1) -> float32 [m,4,4]
    (`resample_poses`' interpolation; each target reads only the two poses around it, so a prefix of
    the poses gives the same values for the targets it covers: a live job, `fast_live`)."""
    n = len(poses)
    source_index = np.linspace(0, n - 1, n)
    num_targets = len(target_index)
    translation = interp1d(
        source_index, poses[:, :3, 3], axis=0, kind="linear", bounds_error=False, fill_value="extrapolate"
    )(target_index)
    quats = Rotation.from_matrix(poses[:, :3, :3]).as_quat()
    for i in range(1, n):
        if np.dot(quats[i], quats[i - 1]) < 0:
            quats[i] = -quats[i]
    rotation = Slerp(source_index, Rotation.from_quat(quats))(target_index).as_matrix()

    resampled = np.zeros((num_targets, 4, 4))
    resampled[:, :3, :3] = rotation
    resampled[:, :3, 3] = translation
    resampled[:, 3, 3] = 1.0
    return torch.from_numpy(resampled).float()


def _rigid_inverse(transforms: torch.Tensor) -> torch.Tensor:
    """Inverse of [B,4,4] rigid transforms: [R^T, -R^T t]."""
    rotation_t = transforms[:, :3, :3].transpose(-1, -2)
    inverse = torch.eye(4, dtype=transforms.dtype).repeat(len(transforms), 1, 1)
    inverse[:, :3, :3] = rotation_t
    inverse[:, :3, 3:] = -torch.bmm(rotation_t, transforms[:, :3, 3:])
    return inverse


def relative_poses(c2w: torch.Tensor, scale: float | torch.Tensor | None = None) -> torch.Tensor:
    """[m,4,4] float32 camera-to-world -> pose 0 identity, then each pose relative to the one before,
    translations divided by `scale` (a settings' `translation_scale`, or a live job's held scale),
    else by the largest translation norm (when it is > 0)."""
    relative = torch.matmul(_rigid_inverse(c2w[:1]), c2w)
    relative[0] = torch.eye(4, dtype=c2w.dtype)
    relative[1:] = torch.bmm(_rigid_inverse(relative[:-1]), relative[1:])
    translations = relative[:, :3, 3]
    if scale is not None:  # a float32 scalar tensor: the same division whichever path gave it
        relative[:, :3, 3] = translations / torch.as_tensor(scale, dtype=relative.dtype)
        return relative
    max_norm = torch.norm(translations, dim=-1).max()
    if max_norm > 0:
        relative[:, :3, 3] = translations / max_norm
    return relative


def scale_intrinsics(intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[k,4] fx, fy, cx, cy of the 480x832 frame -> the same for a (height, width) frame."""
    scale_x = width / MODEL_WIDTH
    scale_y = height / MODEL_HEIGHT
    fx, fy, cx, cy = intrinsics.chunk(4, dim=-1)
    return torch.cat([fx * scale_x, fy * scale_y, cx * scale_x, cy * scale_y], dim=-1)


def plucker_embedding(c2w: torch.Tensor, K: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Plücker rays [o, d] of every pixel centre, folded 8x8 -> [1, 384, f, height/8, width/8].

    o is the camera position, d the unit ray direction ((u+0.5-cx)/fx, (v+0.5-cy)/fy, 1) rotated
    into the world frame by the pose's R (this is the reference's embedding, not the moment o x d).
    """
    frames = len(c2w)
    fx, fy, cx, cy = K.reshape(4, 1)
    v, u = torch.meshgrid(torch.arange(height, dtype=c2w.dtype), torch.arange(width, dtype=c2w.dtype), indexing="ij")
    u = u.reshape(1, -1) + 0.5
    v = v.reshape(1, -1) + 0.5
    x = (u - cx) / fx
    y = (v - cy) / fy
    directions = torch.stack([x, y, torch.ones_like(x)], dim=-1)  # [1, h*w, 3]: one K, the same for every frame
    directions = directions / directions.norm(dim=-1, keepdim=True)

    lat_h, lat_w = height // PATCH, width // PATCH
    # [1, (c, row in block, column in block), f, lat_h, lat_w], written frame by frame: the whole
    # video's rays at pixel resolution, and their folded copy, were ~1 GiB at 161 frames of 464x832
    out = torch.empty(1, 6 * PATCH * PATCH, frames, lat_h, lat_w, dtype=c2w.dtype)
    for i in range(frames):
        rays_d = directions @ c2w[i, :3, :3].T
        rays = torch.cat([c2w[i, :3, 3].expand_as(rays_d), rays_d], dim=-1)  # [1, h*w, 6]: [o, d]
        out[0, :, i] = rays.view(lat_h, PATCH, lat_w, PATCH, 6).permute(4, 1, 3, 0, 2).reshape(-1, lat_h, lat_w)
    return out
