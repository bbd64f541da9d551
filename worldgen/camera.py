"""Camera actions (LingBot `poses.npy` + `intrinsics.npy`) and the Plücker camera conditioning.

An action is N camera-to-world 4x4 matrices (OpenCV axes: x right, y down, z forward; any unit)
and intrinsics `fx, fy, cx, cy` in pixels of a 480x832 (h x w) frame, one row per pose or a single
row; only row 0 is used. `load_action` / `validate_action` check all of it and raise
`InputError` naming the file or field and the fix.

`camera_conditioning` turns an action into what the DiT consumes, as the reference does:
1. take the first F poses and resample them to the latent frame rate (indices
   linspace(0, F-1, (F-1)//4 + 1)): linear translation, slerp rotation, in float64 with scipy
   (`interp1d`, `Rotation`, `Slerp`, exactly the reference's calls), then cast to float32;
2. in float32 torch: relative to the first pose, then frame-to-frame, translations divided by the
   largest translation norm. The reference does these in float32 and example 02 has translations
   in the thousands, so float64 here would differ from it by up to 3e-2 -- the float32 torch ops
   are kept on purpose, in the reference's order;
3. Plücker rays [o, d] per pixel centre with the intrinsics scaled from 480x832 to (height, width),
   each 8x8 pixel block folded into channels: [1, 6*8*8 = 384, lat_f, height/8, width/8] with
   channel order (c, row in block, column in block).
Needs no model; the result is float32 on the CPU (cast and move it where the DiT runs).
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.interpolate import interp1d
from scipy.spatial.transform import Rotation, Slerp

from worldgen.errors import InputError

# The frame the intrinsics are expressed in (LingBot's training resolution).
INTRINSICS_HEIGHT = 480
INTRINSICS_WIDTH = 832
MIN_POSES = 5  # 5 frames = 2 latent frames, the shortest video with any camera motion
PATCH = 8  # VAE spatial stride: one latent pixel per 8x8 block of Plücker rays
TEMPORAL_STRIDE = 4  # VAE temporal stride: frame counts are 4n+1
ROTATION_TOLERANCE = 1e-3  # max |R^T R - I| accepted (float32 poses written by tools are ~1e-6)

_POSES_FIX = "poses must be [N,4,4] float camera-to-world matrices (OpenCV axes: x right, y down, z forward)"
_INTRINSICS_FIX = (
    "intrinsics must be [N,4] (or [4]) float fx, fy, cx, cy in pixels of a 480x832 frame "
    "(rescale x by 832/W and y by 480/H)"
)


@dataclass(frozen=True)
class CameraCondition:
    """The camera conditioning of one rollout (all float32, CPU)."""

    frame_num: int  # video frames F actually generated (4n+1, at most what the poses cover)
    relative_poses: torch.Tensor  # [lat_f, 4, 4]: resampled, frame-to-frame, translations normalised
    K: torch.Tensor  # [4]: fx, fy, cx, cy in pixels of the (height, width) frame
    plucker: torch.Tensor  # [1, 384, lat_f, height/8, width/8]


# --- input files and their validation -------------------------------------------------------------


def load_action(action_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate `poses.npy` and `intrinsics.npy` of an action folder.

    Returns (poses [N,4,4] float32, intrinsics [N,4] or [1,4] float32).
    """
    action_dir = Path(action_dir)
    poses = _load_npy(action_dir / "poses.npy", "[N,4,4] camera-to-world matrices")
    intrinsics = _load_npy(action_dir / "intrinsics.npy", "[N,4] fx, fy, cx, cy for a 480x832 frame")
    return validate_action(
        poses, intrinsics, source=str(action_dir), poses_name="poses.npy", intrinsics_name="intrinsics.npy"
    )


def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise InputError(
            f"{path}: file not found; the action folder needs {path.name} with {what} (save it with numpy.save)"
        )
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as error:
        raise InputError(
            f"{path}: not a readable .npy array ({error}); write {what} with "
            "numpy.save(path, array.astype(numpy.float32))"
        ) from error
    if not isinstance(array, np.ndarray):  # an .npz archive renamed to .npy
        array.close()
        raise InputError(f"{path}: holds an .npz archive, not one array; write {what} with numpy.save")
    return array


def validate_action(
    poses: np.ndarray,
    intrinsics: np.ndarray,
    source: str = "action",
    *,
    poses_name: str = "poses",
    intrinsics_name: str = "intrinsics",
) -> tuple[np.ndarray, np.ndarray]:
    """Check camera poses and intrinsics; return them as float32 (intrinsics as [N,4] or [1,4]).

    Messages read "{source}: {poses_name} ..." so they name where the arrays came from.
    Raises `InputError` on: poses not [N,4,4], fewer than 5, non-finite, last row not [0,0,0,1],
    rotation not orthonormal and right-handed; intrinsics not [N,4] or [4], non-finite,
    non-positive focal lengths, or a row count other than 1 or N.
    """
    where = f"{source}: {poses_name}"
    poses = _as_float_array(poses, where, _POSES_FIX)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4):
        raise InputError(f"{where} has shape {list(poses.shape)}; {_POSES_FIX}")
    n = poses.shape[0]
    if n < MIN_POSES:
        raise InputError(
            f"{where} has {n} poses; at least {MIN_POSES} are needed (a video of F frames uses F poses, F = 4n+1)"
        )
    bad = np.flatnonzero(~np.isfinite(poses).all(axis=(1, 2)))
    if bad.size:
        raise InputError(f"{where}: pose {bad[0]} has NaN or infinite values; {_POSES_FIX}")
    bad = np.flatnonzero(np.abs(poses[:, 3, :] - np.array([0, 0, 0, 1], np.float32)).max(axis=1) > 1e-5)
    if bad.size:
        raise InputError(
            f"{where}: pose {bad[0]} has last row {poses[bad[0], 3].tolist()}, expected [0, 0, 0, 1]; {_POSES_FIX}"
        )
    rotations = poses[:, :3, :3].astype(np.float64)
    gram_error = np.abs(np.einsum("nji,njk->nik", rotations, rotations) - np.eye(3)).max(axis=(1, 2))
    bad = np.flatnonzero(gram_error > ROTATION_TOLERANCE)
    if bad.size:
        raise InputError(
            f"{where}: the rotation of pose {bad[0]} is not orthonormal "
            f"(max |R^T R - I| = {gram_error[bad[0]]:.2g} > {ROTATION_TOLERANCE}); "
            "the upper-left 3x3 must be a pure rotation (no scale or shear)"
        )
    bad = np.flatnonzero(np.linalg.det(rotations) < 0)
    if bad.size:
        raise InputError(
            f"{where}: the rotation of pose {bad[0]} is a reflection (det < 0); "
            "convert the poses to right-handed OpenCV axes (x right, y down, z forward)"
        )

    where = f"{source}: {intrinsics_name}"
    intrinsics = _as_float_array(intrinsics, where, _INTRINSICS_FIX)
    if intrinsics.shape == (4,):
        intrinsics = intrinsics[None, :]
    if intrinsics.ndim != 2 or intrinsics.shape[1] != 4:
        raise InputError(f"{where} has shape {list(intrinsics.shape)}; {_INTRINSICS_FIX}")
    if intrinsics.shape[0] not in (1, n):
        raise InputError(
            f"{where} has {intrinsics.shape[0]} rows but {poses_name} has {n} poses; "
            "give one row per pose or a single row"
        )
    bad = np.flatnonzero(~np.isfinite(intrinsics).all(axis=1))
    if bad.size:
        raise InputError(f"{where}: row {bad[0]} has NaN or infinite values; {_INTRINSICS_FIX}")
    bad = np.flatnonzero((intrinsics[:, :2] <= 0).any(axis=1))
    if bad.size:
        raise InputError(
            f"{where}: row {bad[0]} has focal lengths fx, fy = "
            f"{intrinsics[bad[0], :2].tolist()}; they must be > 0 (pixels of a 480x832 frame)"
        )
    return poses, intrinsics


def _as_float_array(array: np.ndarray, where: str, fix: str) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind not in "fiu":
        raise InputError(f"{where} has dtype {array.dtype}, not a number type; {fix}")
    return np.array(array, dtype=np.float32)  # a copy: callers may keep mutating theirs


# --- frame counts -----------------------------------------------------------------------------------


def frames_for_poses(frame_num: int, num_poses: int) -> int:
    """Video frames generated for a request of `frame_num` frames with `num_poses` poses.

    The VAE needs 4n+1 frames: another count is rounded down, with a warning. Then, as in the
    reference, the video is cut to what the poses cover: min(F, ((N-1)//4)*4 + 1).
    """
    from worldgen.request import frames_4n1, frames_covered  # the rule lives there (no torch)

    frames = frames_4n1(frame_num)
    if frames != frame_num:
        warnings.warn(f"frame_num {frame_num} is not 4n+1; using {frames} frames", stacklevel=2)
    return frames_covered(frame_num, num_poses)


# --- conditioning -------------------------------------------------------------------------------------


def camera_conditioning(
    poses: np.ndarray, intrinsics: np.ndarray, frame_num: int, height: int, width: int
) -> CameraCondition:
    """Camera conditioning of a (height x width) video of up to `frame_num` frames (see module doc)."""
    if height <= 0 or width <= 0 or height % PATCH or width % PATCH:
        raise InputError(f"video size {height}x{width} must be positive multiples of {PATCH}")
    poses, intrinsics = validate_action(poses, intrinsics, source="camera_conditioning")
    frames = frames_for_poses(frame_num, len(poses))
    latent_frames = (frames - 1) // TEMPORAL_STRIDE + 1
    c2w = resample_poses(poses[:frames], latent_frames)
    relative = relative_poses(c2w)
    K = scale_intrinsics(torch.from_numpy(intrinsics[:1]), height, width)[0]
    plucker = plucker_embedding(relative, K, height, width)
    return CameraCondition(frame_num=frames, relative_poses=relative, K=K, plucker=plucker)


def resample_poses(poses: np.ndarray, num_targets: int) -> torch.Tensor:
    """Resample [n,4,4] poses at `num_targets` evenly spaced indices of 0..n-1 -> float32 [m,4,4].

    Translation linearly (scipy interp1d), rotation by slerp (quaternions sign-aligned to their
    predecessor first, so no interpolation takes the long way round), all in float64.
    """
    n = len(poses)
    source_index = np.linspace(0, n - 1, n)
    target_index = np.linspace(0, n - 1, num_targets)
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


def relative_poses(c2w: torch.Tensor) -> torch.Tensor:
    """[m,4,4] float32 camera-to-world -> pose 0 identity, then each pose relative to the one before,
    translations divided by the largest translation norm (when it is > 0)."""
    relative = torch.matmul(_rigid_inverse(c2w[:1]), c2w)
    relative[0] = torch.eye(4, dtype=c2w.dtype)
    relative[1:] = torch.bmm(_rigid_inverse(relative[:-1]), relative[1:])
    translations = relative[:, :3, 3]
    max_norm = torch.norm(translations, dim=-1).max()
    if max_norm > 0:
        relative[:, :3, 3] = translations / max_norm
    return relative


def scale_intrinsics(intrinsics: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[k,4] fx, fy, cx, cy of the 480x832 frame -> the same for a (height, width) frame."""
    scale_x = width / INTRINSICS_WIDTH
    scale_y = height / INTRINSICS_HEIGHT
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
    directions = torch.stack([x, y, torch.ones_like(x)], dim=-1).expand(frames, -1, -1)  # [f, h*w, 3]
    directions = directions / directions.norm(dim=-1, keepdim=True)
    rays_d = directions @ c2w[:, :3, :3].transpose(-1, -2)
    rays_o = c2w[:, None, :3, 3].expand_as(rays_d)
    rays = torch.cat([rays_o, rays_d], dim=-1)  # [f, h*w, 6]

    lat_h, lat_w = height // PATCH, width // PATCH
    rays = rays.view(frames, lat_h, PATCH, lat_w, PATCH, 6)
    # -> [1, (c, row in block, column in block), f, lat_h, lat_w]
    return rays.permute(5, 2, 4, 0, 1, 3).reshape(1, 6 * PATCH * PATCH, frames, lat_h, lat_w).contiguous()
