"""Camera-trajectory fidelity: does the video move the camera the way the poses commanded?

For a pair of frames (i, j) we estimate the relative camera motion from the pixels alone, with the
known intrinsics: SIFT features (ORB when this OpenCV has no SIFT) matched with FLANN, Lowe's ratio
test, the essential matrix by RANSAC (`cv2.findEssentialMat`) and the cheirality check
(`cv2.recoverPose`). The RANSAC flavour is OpenCV's USAC_ACCURATE (RANSAC with local optimisation
of the model on its inliers) when this OpenCV has it: on rendered frames it is about five times
more accurate than plain `cv2.RANSAC`, whose answer is fitted to a minimal sample only.
Points are first normalised with each frame's own K, so the two frames may have different
intrinsics. The estimate is compared with the commanded relative motion from the poses:

- rotation error: the angle of R_est^T R_cmd, in degrees;
- translation-direction error: the angle between the unit translation vectors, in degrees (an
  essential matrix knows translation only up to scale). It is None, not a number, when the
  commanded translation is about zero (below `translation_eps` times the trajectory's extent,
  the largest distance of any camera centre from the first): the direction is then undefined.

Pairs are consecutive (i, i+1) and first-to-k (0, k). A pair where estimation fails (too few
features, matches or inliers, or no essential matrix) is kept in the results with status "failed"
and the reason, never dropped. Conventions: poses are OpenCV camera-to-world [4, 4] (x right,
y down, z forward); the relative motion (R, t) maps camera-i coordinates to camera-j coordinates,
x_j = R x_i + t, which is what `cv2.recoverPose` returns.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import cv2
import numpy as np

from comparison.rotation_angle import rotation_angle_deg as angles_deg
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH


@dataclass(frozen=True)
class EstimatorConfig:
    """Settings of the essential-matrix estimator (all reported with the results)."""

    max_features: int = 2000
    ratio: float = 0.8  # Lowe's ratio test
    ransac_threshold_px: float = 0.5  # max distance to the epipolar line, in pixels
    ransac_confidence: float = 0.999
    ransac_method: str = "USAC_ACCURATE"  # or "RANSAC" (plain, no local optimisation)
    min_matches: int = 15
    min_inliers: int = 15
    seed: int = 0  # OpenCV's RNG (FLANN trees, RANSAC samples)
    translation_eps: float = 1e-3  # fraction of the trajectory extent below which t is "about zero"


@dataclass
class PairResult:
    """One frame pair: what was commanded, what was estimated, and how far apart they are."""

    kind: str  # "consecutive" or "first_to_k"
    i: int
    j: int
    status: str  # "ok" or "failed"
    reason: str | None
    matches: int
    inliers: int
    commanded_rotation_deg: float
    commanded_translation: float  # norm, in the poses' units
    estimated_rotation_deg: float | None
    rotation_error_deg: float | None
    translation_error_deg: float | None  # None when failed or the commanded translation is ~0


@dataclass
class TrajectoryResult:
    """Every pair of one video, plus the estimator's settings and the feature type used."""

    feature: str
    frame_size: tuple[int, int]  # (height, width) the estimator saw
    config: EstimatorConfig
    consecutive: list[PairResult] = field(default_factory=list)
    first_to_k: list[PairResult] = field(default_factory=list)

    def summary(self) -> dict:
        return {"consecutive": summarize(self.consecutive), "first_to_k": summarize(self.first_to_k)}

    def to_dict(self) -> dict:
        return {
            "feature": self.feature,
            "frame_size": list(self.frame_size),
            "config": asdict(self.config),
            "summary": self.summary(),
            "consecutive": [asdict(pair) for pair in self.consecutive],
            "first_to_k": [asdict(pair) for pair in self.first_to_k],
        }


def intrinsics_matrix(fx_fy_cx_cy: np.ndarray, height: int, width: int) -> np.ndarray:
    """K [3, 3] for a (height, width) frame from fx, fy, cx, cy given for a 480 x 832 frame."""
    fx, fy, cx, cy = (float(v) for v in fx_fy_cx_cy)
    sx, sy = width / MODEL_WIDTH, height / MODEL_HEIGHT  # intrinsics are for the model frame
    return np.array([[fx * sx, 0.0, cx * sx], [0.0, fy * sy, cy * sy], [0.0, 0.0, 1.0]])


def commanded_relative_pose(c2w_i: np.ndarray, c2w_j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(R, t) with x_j = R x_i + t, from two camera-to-world matrices."""
    rot_i, rot_j = c2w_i[:3, :3].astype(np.float64), c2w_j[:3, :3].astype(np.float64)
    pos_i, pos_j = c2w_i[:3, 3].astype(np.float64), c2w_j[:3, 3].astype(np.float64)
    return rot_j.T @ rot_i, rot_j.T @ (pos_i - pos_j)


def rotation_angle_deg(rotation: np.ndarray) -> float:
    """The angle of a rotation matrix, in degrees (`comparison.rotation_angle`: exact for small angles)."""
    return float(angles_deg(rotation))


def rotation_error_deg(estimated: np.ndarray, commanded: np.ndarray) -> float:
    return rotation_angle_deg(estimated.T @ commanded)


def direction_error_deg(estimated: np.ndarray, commanded: np.ndarray) -> float:
    a = estimated.ravel() / np.linalg.norm(estimated)
    b = commanded.ravel() / np.linalg.norm(commanded)
    return math.degrees(math.acos(float(np.clip(a @ b, -1.0, 1.0))))


class FeatureMatcher:
    """Detects features once per frame and matches pairs with the ratio test."""

    def __init__(self, config: EstimatorConfig):
        self.config = config
        if hasattr(cv2, "SIFT_create"):
            self.feature = "SIFT"
            self._detector = cv2.SIFT_create(nfeatures=config.max_features)
            # KD-tree FLANN: 4x faster than brute force at 2000 features, same matches after the
            # ratio test on our test scenes, and deterministic (FLANN's seed is fixed).
            self._matcher = cv2.FlannBasedMatcher({"algorithm": 1, "trees": 4}, {"checks": 64})
        else:
            self.feature = "ORB"
            self._detector = cv2.ORB_create(nfeatures=config.max_features)
            self._matcher = cv2.BFMatcher(cv2.NORM_HAMMING)

    def detect(self, frame_rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Keypoint pixel positions [N, 2] and descriptors of one RGB frame."""
        gray = cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2GRAY)
        keypoints, descriptors = self._detector.detectAndCompute(gray, None)
        points = np.array([kp.pt for kp in keypoints], np.float64).reshape(-1, 2)
        return points, descriptors

    def match(self, desc_a: np.ndarray | None, desc_b: np.ndarray | None) -> list[tuple[int, int]]:
        if desc_a is None or desc_b is None or len(desc_a) < 2 or len(desc_b) < 2:
            return []
        pairs = []
        for candidates in self._matcher.knnMatch(desc_a, desc_b, k=2):
            if len(candidates) == 2 and candidates[0].distance < self.config.ratio * candidates[1].distance:
                pairs.append((candidates[0].queryIdx, candidates[0].trainIdx))
        return pairs


def _normalize(points: np.ndarray, K: np.ndarray) -> np.ndarray:
    return cv2.undistortPoints(points.reshape(-1, 1, 2), K, None).reshape(-1, 2)


def estimate_relative_pose(
    points_i: np.ndarray, points_j: np.ndarray, K_i: np.ndarray, K_j: np.ndarray, config: EstimatorConfig
) -> tuple[np.ndarray | None, np.ndarray | None, int, str | None]:
    """(R, unit t, inliers, failure reason) from matched pixel positions of frames i and j."""
    if len(points_i) < config.min_matches:
        return None, None, 0, f"too few matches ({len(points_i)} < {config.min_matches})"
    norm_i, norm_j = _normalize(points_i, K_i), _normalize(points_j, K_j)
    focal = float(np.mean([K_i[0, 0], K_i[1, 1], K_j[0, 0], K_j[1, 1]]))
    identity = np.eye(3)
    method = getattr(cv2, config.ransac_method, cv2.RANSAC)  # OpenCV < 4.5 has no USAC
    essential, mask = cv2.findEssentialMat(
        norm_i,
        norm_j,
        identity,
        method=method,
        prob=config.ransac_confidence,
        threshold=config.ransac_threshold_px / focal,
    )
    if essential is None or essential.shape != (3, 3) or mask is None:
        # Several stacked solutions or none: the geometry is degenerate for this pair.
        return None, None, 0, "no unique essential matrix (degenerate geometry)"
    inliers, rotation, translation, _ = cv2.recoverPose(essential, norm_i, norm_j, identity, mask=mask)
    if inliers < config.min_inliers:
        return None, None, int(inliers), f"too few inliers ({inliers} < {config.min_inliers})"
    return rotation, translation.ravel(), int(inliers), None


def evaluate_trajectory(
    frames: np.ndarray,
    poses: np.ndarray,
    intrinsics: np.ndarray,
    config: EstimatorConfig | None = None,
    first_to_k: bool = True,
) -> TrajectoryResult:
    """Estimate the camera motion between frames and score it against the commanded poses.

    `frames` uint8 [F, H, W, 3] RGB; `poses` [>=F, 4, 4] camera-to-world (frame k <-> pose k);
    `intrinsics` [>=F, 4] fx, fy, cx, cy for a 480 x 832 frame (rescaled here to H x W).
    """
    config = config or EstimatorConfig()
    # FLANN's KD-trees and RANSAC draw from OpenCV's global RNG: seed it so that the same frames
    # give the same numbers whatever ran before in this process.
    cv2.setRNGSeed(config.seed)
    count = len(frames)
    if len(poses) < count or len(intrinsics) < count:
        raise ValueError(f"{count} frames but only {len(poses)} poses and {len(intrinsics)} intrinsics rows")
    height, width = frames.shape[1:3]
    matcher = FeatureMatcher(config)
    features = [matcher.detect(frame) for frame in frames]
    Ks = [intrinsics_matrix(intrinsics[k], height, width) for k in range(count)]
    centres = poses[:count, :3, 3].astype(np.float64)
    extent = float(np.max(np.linalg.norm(centres - centres[0], axis=1))) if count else 0.0
    min_translation = config.translation_eps * extent

    def score(kind: str, i: int, j: int) -> PairResult:
        cmd_rot, cmd_t = commanded_relative_pose(poses[i], poses[j])
        cmd_t_norm = float(np.linalg.norm(cmd_t))
        (pts_i, desc_i), (pts_j, desc_j) = features[i], features[j]
        matches = matcher.match(desc_i, desc_j)
        index_i = np.array([a for a, _ in matches], int)
        index_j = np.array([b for _, b in matches], int)
        rotation, translation, inliers, reason = estimate_relative_pose(
            pts_i[index_i] if matches else np.zeros((0, 2)),
            pts_j[index_j] if matches else np.zeros((0, 2)),
            Ks[i],
            Ks[j],
            config,
        )
        result = PairResult(
            kind=kind,
            i=i,
            j=j,
            status="failed" if reason else "ok",
            reason=reason,
            matches=len(matches),
            inliers=inliers,
            commanded_rotation_deg=rotation_angle_deg(cmd_rot),
            commanded_translation=cmd_t_norm,
            estimated_rotation_deg=None,
            rotation_error_deg=None,
            translation_error_deg=None,
        )
        if rotation is not None:
            result.estimated_rotation_deg = rotation_angle_deg(rotation)
            result.rotation_error_deg = rotation_error_deg(rotation, cmd_rot)
            if cmd_t_norm > min_translation and cmd_t_norm > 0.0:
                result.translation_error_deg = direction_error_deg(translation, cmd_t)
        return result

    result = TrajectoryResult(feature=matcher.feature, frame_size=(height, width), config=config)
    result.consecutive = [score("consecutive", k, k + 1) for k in range(count - 1)]
    if first_to_k:
        result.first_to_k = [score("first_to_k", 0, k) for k in range(1, count)]
    return result


def _stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0, "median": None, "mean": None, "p90": None, "max": None}
    array = np.asarray(values, np.float64)
    return {
        "count": int(array.size),
        "median": float(np.median(array)),
        "mean": float(array.mean()),
        "p90": float(np.percentile(array, 90)),
        "max": float(array.max()),
    }


def summarize(pairs: list[PairResult]) -> dict:
    """Counts and median/mean/p90/max of the rotation and translation-direction errors."""
    failed = [pair for pair in pairs if pair.status != "ok"]
    return {
        "pairs": len(pairs),
        "failed": len(failed),
        "rotation_error_deg": _stats([p.rotation_error_deg for p in pairs if p.rotation_error_deg is not None]),
        "translation_error_deg": _stats(
            [p.translation_error_deg for p in pairs if p.translation_error_deg is not None]
        ),
        "translation_undefined": sum(1 for p in pairs if p.status == "ok" and p.translation_error_deg is None),
    }
