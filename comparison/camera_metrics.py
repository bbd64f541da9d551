"""Camera-control metrics of a reconstructed camera path against the commanded one.

The numbers the field reports for camera-controlled video (definitions and sources in
docs/comparison.md, "Whole-clip camera fidelity"), over the frames J the reconstruction registered:

- the Sim(3) fit: scale s, rotation R, translation t minimising sum_j |c_cmd_j - (s R c_est_j + t)|^2
  over the camera centres (Umeyama 1991). `pycolmap.estimate_sim3d` computes it (COLMAP's
  `EstimateSim3d`, Eigen's Umeyama): pycolmap is already needed for the reconstruction. evo 1.38
  (the usual tool, whose Umeyama, APE and RPE the measurements in
  /work/shared/docs/camera-metrics-notes.md agree with to 1e-9) would pull matplotlib, pandas,
  seaborn, rosbags and 16 more packages into the `compare` extra for four formulas; the tests check
  the fit and the metrics on exact geometry instead;
- RotErr (CameraCtrl, He et al. 2024): sum over j of the angle between the estimated and commanded
  rotations relative to the first registered frame, the angle of R_rel_est^T R_rel_cmd in degrees, from its
  quaternion in float64 (`comparison.rotation_angle`: arccos of the trace reads errors below ~0.02 degree
  as 0); relative rotations do not depend on the reconstruction's frame, so no fit is involved (as CamI2V
  defines it: a mirrored path shows in TransErr and the anchored error, not here);
- TransErr (CameraCtrl): sum over j of |c_cmd_j - c_aligned_j|, camera centres after the fit, in the
  poses' units (metres);
- CamMC (MotionCtrl, Wang et al. 2024; CamI2V): sum over j of the Frobenius norm of
  [R | c]_aligned_j - [R | c]_cmd_j, camera-to-world 3 x 4: centres after the fit, rotations relative
  to the first frame (as RotErr) placed at its commanded rotation;
- APE (Sturm et al. 2012's ATE, as `evo_ape --align --correct_scale` reports it): the RMSE of
  |c_cmd_j - c_aligned_j|;
- RPE (Sturm et al. 2012, one-frame steps): for consecutive registered frames, the error of the
  relative motion E = (P_j^-1 P_j+1)^-1 (A_j^-1 A_j+1), A the aligned poses as for CamMC: RMSE of its translation, mean of its angle.

Sums grow with the frame count: each sum is given with its per-frame mean (sum / |J|), and sums are
compared only at equal frame counts. Poses are OpenCV camera-to-world [4, 4].
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from comparison.rotation_angle import rotation_angle_deg

TRANSLATION_EPS = 1e-3  # a commanded path whose centres stay within this many metres does not translate


@dataclass(frozen=True)
class Similarity:
    """x_target = scale * rotation @ x_source + translation."""

    scale: float
    rotation: np.ndarray  # [3, 3]
    translation: np.ndarray  # [3]

    def apply_points(self, points: np.ndarray) -> np.ndarray:
        return self.scale * points @ self.rotation.T + self.translation

    def apply_poses(self, c2w: np.ndarray) -> np.ndarray:
        """Camera-to-world poses [N, 4, 4] moved into the target frame (scale moves centres only)."""
        out = np.array(c2w, np.float64, copy=True)
        out[:, :3, :3] = self.rotation @ out[:, :3, :3]
        out[:, :3, 3] = self.apply_points(out[:, :3, 3])
        return out


def fit_similarity(source: np.ndarray, target: np.ndarray) -> Similarity | None:
    """Umeyama's Sim(3) from points `source` [N, 3] to `target` [N, 3]; None where it is undefined
    (fewer than 3 points, or the points do not spread)."""
    import pycolmap

    source, target = np.asarray(source, np.float64), np.asarray(target, np.float64)
    if len(source) < 3:
        return None
    if np.ptp(source, axis=0).max() < 1e-12 or np.ptp(target, axis=0).max() < 1e-12:
        return None
    fit = pycolmap.estimate_sim3d(source, target)
    if fit is None:
        return None
    return Similarity(float(fit.scale), np.asarray(fit.rotation.matrix()), np.asarray(fit.translation))


def relative_rotation_errors_deg(estimated: np.ndarray, commanded: np.ndarray) -> np.ndarray:
    """Per frame, the angle between the rotations relative to frame 0 of both paths [N, 4, 4] (float64)."""
    estimated, commanded = np.asarray(estimated, np.float64), np.asarray(commanded, np.float64)
    rel_est = estimated[0, :3, :3].T @ estimated[:, :3, :3]
    rel_cmd = commanded[0, :3, :3].T @ commanded[:, :3, :3]
    return rotation_angle_deg(np.swapaxes(rel_est, -1, -2) @ rel_cmd)


@dataclass
class PathErrors:
    """The metrics of one reconstructed path against the commanded poses of the same frames."""

    frames: list[int]  # the registered frame indices J
    rotation_errors_deg: list[float]  # per frame in J, relative to the first of J
    translation_errors: list[float] | None  # per frame in J, after the fit (None: undefined)
    rot_err_deg: float  # RotErr: the sum
    trans_err: float | None  # TransErr: the sum
    cam_mc: float | None  # CamMC: the sum
    ape_rmse: float | None
    rpe_translation_rmse: float | None
    rpe_rotation_deg_mean: float | None
    fit_scale: float | None  # the Sim(3) fit's scale (reconstruction -> commanded)
    undefined_reason: str | None  # why the translation metrics are None

    def per_frame_means(self) -> dict[str, float | None]:
        n = len(self.frames)
        return {
            "rot_err_deg_per_frame": self.rot_err_deg / n if n else None,
            "trans_err_per_frame": None if self.trans_err is None or not n else self.trans_err / n,
            "cam_mc_per_frame": None if self.cam_mc is None or not n else self.cam_mc / n,
        }

    def to_dict(self) -> dict:
        return {**asdict(self), **self.per_frame_means()}


def path_errors(estimated: np.ndarray, commanded: np.ndarray, frames: list[int]) -> PathErrors:
    """Fit `estimated` [N, 4, 4] (any frame and scale) to `commanded` [N, 4, 4] (the same frames, in
    order; `frames` their indices) and measure it."""
    estimated, commanded = np.asarray(estimated, np.float64), np.asarray(commanded, np.float64)
    rotation_errors = relative_rotation_errors_deg(estimated, commanded)
    result = PathErrors(
        frames=list(frames),
        rotation_errors_deg=rotation_errors.tolist(),
        translation_errors=None,
        rot_err_deg=float(rotation_errors.sum()),
        trans_err=None,
        cam_mc=None,
        ape_rmse=None,
        rpe_translation_rmse=None,
        rpe_rotation_deg_mean=None,
        fit_scale=None,
        undefined_reason=None,
    )
    centres = commanded[:, :3, 3]
    if np.linalg.norm(centres - centres[0], axis=1).max() < TRANSLATION_EPS:
        result.undefined_reason = "the commanded camera does not translate: no scale or position to compare"
        return result
    fit = fit_similarity(estimated[:, :3, 3], centres)
    if fit is None:
        result.undefined_reason = "fewer than 3 registered frames, or their centres do not spread: no Sim(3) fit"
        return result
    aligned = fit.apply_poses(estimated)
    # Rotations as RotErr sees them: relative to the first frame, placed at its commanded rotation. The
    # fit's rotation comes from the centres alone, which leave a turn about a straight path free.
    aligned[:, :3, :3] = commanded[0, :3, :3] @ estimated[0, :3, :3].T @ estimated[:, :3, :3]
    distances = np.linalg.norm(aligned[:, :3, 3] - centres, axis=1)
    result.translation_errors = distances.tolist()
    result.trans_err = float(distances.sum())
    result.cam_mc = float(np.linalg.norm(aligned[:, :3, :] - commanded[:, :3, :], axis=(1, 2)).sum())
    result.ape_rmse = float(math.sqrt(np.mean(distances**2)))
    result.fit_scale = fit.scale
    steps = [i for i in range(len(frames) - 1) if frames[i + 1] == frames[i] + 1]
    if steps:
        errors = [
            np.linalg.inv(np.linalg.inv(commanded[i]) @ commanded[i + 1]) @ (np.linalg.inv(aligned[i]) @ aligned[i + 1])
            for i in steps
        ]
        result.rpe_translation_rmse = float(math.sqrt(np.mean([np.sum(e[:3, 3] ** 2) for e in errors])))
        result.rpe_rotation_deg_mean = float(np.mean(rotation_angle_deg(np.stack([e[:3, :3] for e in errors]))))
    return result


def anchored_errors(
    anchored: np.ndarray, commanded: np.ndarray
) -> tuple[list[float], float, float | None]:  # fmt: skip
    """A path already in the commanded frame (the rollout read through the sim's fit): per-frame
    centre distances, their sum, and the scale of the commanded path onto it (how far the camera
    moved per metre commanded; None where the command does not translate)."""
    anchored, commanded = np.asarray(anchored, np.float64), np.asarray(commanded, np.float64)
    distances = np.linalg.norm(anchored[:, :3, 3] - commanded[:, :3, 3], axis=1)
    fit = fit_similarity(commanded[:, :3, 3], anchored[:, :3, 3])
    return distances.tolist(), float(distances.sum()), None if fit is None else fit.scale
