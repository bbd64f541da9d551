"""USD camera prims -> OpenCV camera-to-world poses in metres and pinhole intrinsics in pixels.

pxr + numpy only, so it runs on usd-core outside Isaac Sim. The conventions that differ between
USD and what LingBot-World expects (each a source of silent errors):

- Axes: a USD camera looks down its local -Z with +Y up and +X right; an OpenCV camera looks down
  +Z with +Y down. c2w_opencv = c2w_usd @ diag(1, -1, -1, 1).
- Matrices: Gf matrices act on row vectors (p' = p M, translation in the last row); numpy code
  here uses column vectors, so a Gf matrix enters transposed.
- Units: translations are in stage units; `metersPerUnit` (0.01 for centimetre stages) turns them
  into metres. Focal length and apertures are in tenths of a stage unit, but only their ratios
  matter, so they need no conversion.
- Scale: parents may scale the camera. A uniform scale does not change what the camera sees, so
  it is removed from the rotation; a non-uniform one would distort the frustum and is refused, and
  so is a shear (a parent's non-uniform scale above a rotation: axes of equal length, not square).
- Intrinsics: `lens.pinhole_intrinsics`, Isaac's square pixels from the horizontal aperture
  (fx = fy = W f / hA, cx = W/2 - W ox / hA, cy = H/2 + W oy / hA); a vertical aperture whose
  aspect differs from the image's is ignored, with a `NonSquarePixelWarning`.
- Time: a stage is sampled where the episode needs it (`sample_camera(..., time_codes=...)`) and
  USD evaluates every attribute there, so sparse keys on a parent's rotation give USD's arc.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from pxr import Gf, Usd, UsdGeom

from lingbot_isaac.lens import CameraError, LensError, NonSquarePixelWarning, pinhole_intrinsics

DEFAULT_TIME = Usd.TimeCode.Default()  # the unanimated value of an attribute
USD_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])  # flips camera-local y and z (its own inverse)
SCALE_TOLERANCE = 1e-5  # relative spread of axis scales (and shear); float32-authored rotations reach 5e-7
AXIS_PAIRS = ((0, 1), (0, 2), (1, 2))


@dataclass(frozen=True)
class CameraTrack:
    """A camera sampled at several time codes."""

    prim_path: str
    time_codes: np.ndarray  # [N] USD time codes
    times: np.ndarray  # [N] seconds (time code / timeCodesPerSecond)
    poses: np.ndarray  # [N, 4, 4] float64 OpenCV camera-to-world, metres
    intrinsics: np.ndarray  # [N, 4] float64 fx, fy, cx, cy in pixels of `resolution`
    resolution: tuple[int, int]  # (height, width)
    meters_per_unit: float


def gf_to_numpy(matrix: Gf.Matrix4d) -> np.ndarray:
    """A Gf (row-vector) matrix as a numpy column-vector matrix: the transpose."""
    return np.array(matrix, dtype=np.float64).T


def numpy_to_gf(matrix: np.ndarray) -> Gf.Matrix4d:
    """A numpy column-vector 4x4 matrix as a Gf (row-vector) matrix."""
    return Gf.Matrix4d(np.asarray(matrix, dtype=np.float64).T.tolist())


def usd_to_opencv_c2w(local_to_world: np.ndarray, meters_per_unit: float, prim_path: str = "camera") -> np.ndarray:
    """USD camera local-to-world (column-vector numpy, stage units) -> OpenCV c2w in metres."""
    m = np.asarray(local_to_world, dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)):
        raise CameraError(f"{prim_path}: world transform is not a finite 4x4 matrix")
    if not np.allclose(m[3], [0, 0, 0, 1], atol=1e-9):
        raise CameraError(f"{prim_path}: world transform has a projective part {m[3].tolist()}")
    linear = m[:3, :3]
    scales = np.linalg.norm(linear, axis=0)
    if np.any(scales < 1e-12):
        raise CameraError(f"{prim_path}: world transform has a zero scale on some axis")
    if np.ptp(scales) > SCALE_TOLERANCE * scales.max():
        raise CameraError(
            f"{prim_path}: non-uniform scale {scales.tolist()} on the camera or a parent distorts the "
            "frustum; give the camera (and its parents) a uniform scale"
        )
    rotation = linear / scales
    # Equal column norms are not enough: a non-uniform scale above a rotation (a parent scaled
    # (1, 1, 3) over a rotated camera) shears the axes while keeping their lengths equal.
    shear = np.abs(rotation.T @ rotation - np.eye(3)).max()
    if shear > SCALE_TOLERANCE:
        angles = np.degrees(np.arccos(np.clip([rotation[:, i] @ rotation[:, j] for i, j in AXIS_PAIRS], -1, 1)))
        raise CameraError(
            f"{prim_path}: world transform shears the camera (its axes are {', '.join(f'{a:.2f}' for a in angles)} "
            "degrees apart, not 90: a non-uniform scale on a parent above a rotation) and distorts the "
            "frustum; give the camera's parents a uniform scale"
        )
    # Float noise leaves a tiny shear (below the tolerance): project onto the nearest rotation.
    u, _, vt = np.linalg.svd(rotation)
    rotation = u @ vt
    if np.linalg.det(rotation) < 0:
        raise CameraError(f"{prim_path}: world transform mirrors the camera (negative scale); remove it")
    c2w_usd = np.eye(4)
    c2w_usd[:3, :3] = rotation
    c2w_usd[:3, 3] = m[:3, 3] * meters_per_unit
    return c2w_usd @ USD_TO_OPENCV


def opencv_to_usd_local_to_world(c2w_opencv: np.ndarray, meters_per_unit: float) -> np.ndarray:
    """Inverse of `usd_to_opencv_c2w` (no scale): for authoring a USD camera from OpenCV poses."""
    c2w = np.asarray(c2w_opencv, dtype=np.float64) @ USD_TO_OPENCV
    c2w = c2w.copy()
    c2w[:3, 3] /= meters_per_unit
    return c2w


def _camera(prim: Usd.Prim) -> UsdGeom.Camera:
    if not prim or not prim.IsValid():
        where = prim.GetPath() if prim else "that path"
        raise CameraError(f"no prim at {where}; pick an existing camera prim")
    if not prim.IsA(UsdGeom.Camera):
        raise CameraError(f"{prim.GetPath()} is a {prim.GetTypeName() or 'typeless prim'}, not a Camera")
    return UsdGeom.Camera(prim)


def check_pinhole(prim: Usd.Prim, time: Usd.TimeCode | float = DEFAULT_TIME) -> None:
    """Raise CameraError unless the camera is a plain perspective pinhole (no fisheye, no distortion)."""
    camera = _camera(prim)
    path = prim.GetPath()
    projection = camera.GetProjectionAttr().Get(time)
    if projection != UsdGeom.Tokens.perspective:
        raise CameraError(f"{path}: projection is {projection!r}; LingBot-World needs a perspective camera")
    # Isaac Sim <= 4.x fisheye models: a custom `cameraProjectionType` token on the camera.
    legacy = prim.GetAttribute("cameraProjectionType")
    if legacy and legacy.HasAuthoredValue() and legacy.Get(time) not in ("pinhole", ""):
        raise CameraError(
            f"{path}: cameraProjectionType is {legacy.Get(time)!r}; set it to 'pinhole' (fisheye "
            "projections are not pinhole cameras)"
        )
    # Isaac Sim 5+/Kit lens distortion: OmniLensDistortion*API schemas applied to the camera.
    # GetAppliedSchemas() lists only schemas registered here (usd-core has no Omni schemas), so
    # read the authored apiSchemas list op as well.
    applied = set(prim.GetAppliedSchemas())
    list_op = prim.GetMetadata("apiSchemas")
    if list_op is not None:
        applied.update(list_op.ApplyOperations([]))
    distortion = sorted(s for s in applied if s.startswith("OmniLensDistortion"))
    model = prim.GetAttribute("omni:lensdistortion:model")
    if distortion or (model and model.HasAuthoredValue()):
        raise CameraError(
            f"{path}: lens distortion {distortion or model.Get(time)} is applied; remove it (LingBot-World "
            "takes undistorted pinhole images)"
        )


def camera_pose(prim: Usd.Prim, time: Usd.TimeCode | float = DEFAULT_TIME) -> np.ndarray:
    """OpenCV camera-to-world [4, 4] in metres of a camera prim at a time code."""
    camera = _camera(prim)
    stage = prim.GetStage()
    local_to_world = gf_to_numpy(camera.ComputeLocalToWorldTransform(Usd.TimeCode(time)))
    return usd_to_opencv_c2w(local_to_world, UsdGeom.GetStageMetersPerUnit(stage), str(prim.GetPath()))


def camera_intrinsics(prim: Usd.Prim, width: int, height: int, time: Usd.TimeCode | float = DEFAULT_TIME) -> np.ndarray:
    """(fx, fy, cx, cy) in pixels of a width x height render of a pinhole camera prim."""
    check_pinhole(prim, time)
    camera = _camera(prim)
    time = Usd.TimeCode(time)
    try:
        return pinhole_intrinsics(
            camera.GetFocalLengthAttr().Get(time),
            camera.GetHorizontalApertureAttr().Get(time),
            camera.GetVerticalApertureAttr().Get(time),
            width,
            height,
            camera.GetHorizontalApertureOffsetAttr().Get(time) or 0.0,
            camera.GetVerticalApertureOffsetAttr().Get(time) or 0.0,
            where=str(prim.GetPath()),
        )
    except (LensError, TypeError) as exc:
        raise CameraError(f"{prim.GetPath()}: {exc}") from None


def set_camera_intrinsics(
    camera: UsdGeom.Camera,
    intrinsics: tuple[float, float, float, float],
    width: int,
    height: int,
    focal_length: float = 24.0,
    time: Usd.TimeCode | float = DEFAULT_TIME,
) -> None:
    """Author focalLength, apertures and offsets so that `camera_intrinsics` gives `intrinsics` back.

    Square pixels: fy must equal fx (within 1e-3) and reads back as fx.
    """
    fx, fy, cx, cy = (float(v) for v in intrinsics)
    if abs(fx / fy - 1) > 1e-3:  # the LingBot examples' own fx, fy differ by 4e-4
        raise CameraError(
            f"{camera.GetPath()}: fx {fx:g} != fy {fy:g}; Isaac renders square pixels (fx = fy), so a USD "
            "camera cannot have these intrinsics"
        )
    h_ap = width * focal_length / fx
    v_ap = h_ap * height / width  # square pixels
    time = Usd.TimeCode(time)
    camera.GetProjectionAttr().Set(UsdGeom.Tokens.perspective)
    camera.GetFocalLengthAttr().Set(focal_length, time)
    camera.GetHorizontalApertureAttr().Set(h_ap, time)
    camera.GetVerticalApertureAttr().Set(v_ap, time)
    camera.GetHorizontalApertureOffsetAttr().Set((width / 2 - cx) * h_ap / width, time)
    camera.GetVerticalApertureOffsetAttr().Set((cy - height / 2) * h_ap / width, time)


def camera_time_codes(stage: Usd.Stage, prim: Usd.Prim) -> np.ndarray:
    """Every time code at which the camera's pose or lens is authored (itself and its ancestors).

    Falls back to the stage's start..end time codes, and to the default time when nothing is animated.
    """
    _camera(prim)
    codes: set[float] = set()
    node = prim
    while node and node.GetPath() != node.GetPath().absoluteRootPath:
        for attribute in node.GetAttributes():
            name = attribute.GetName()
            if name.startswith("xformOp") or node == prim:
                codes.update(attribute.GetTimeSamples())
        node = node.GetParent()
    if codes:
        return np.array(sorted(codes), dtype=np.float64)
    if stage.HasAuthoredTimeCodeRange():
        start, end = stage.GetStartTimeCode(), stage.GetEndTimeCode()
        return np.arange(start, end + 0.5)
    return np.array([np.nan])  # not animated: one sample at the default time


def sample_camera(
    stage: Usd.Stage,
    prim_path: str,
    width: int,
    height: int,
    time_codes: np.ndarray | None = None,
) -> CameraTrack:
    """Poses and intrinsics of a camera prim at the given time codes (default: all authored ones)."""
    prim = stage.GetPrimAtPath(prim_path)
    if not prim:
        cameras = [str(p.GetPath()) for p in stage.Traverse() if p.IsA(UsdGeom.Camera)]
        raise CameraError(f"no prim at {prim_path!r} in the stage; cameras there: {cameras or 'none'}")
    codes = camera_time_codes(stage, prim) if time_codes is None else np.asarray(time_codes, dtype=np.float64)
    times = [Usd.TimeCode.Default() if np.isnan(c) else Usd.TimeCode(float(c)) for c in codes]
    poses = np.stack([camera_pose(prim, t) for t in times])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NonSquarePixelWarning)
        intrinsics = np.stack([camera_intrinsics(prim, width, height, t) for t in times])
    seen: set[str] = set()
    for warning in caught:  # one warning per track, not one per frame
        if str(warning.message) not in seen:
            seen.add(str(warning.message))
            warnings.warn(warning.message, warning.category, stacklevel=2)
    per_second = stage.GetTimeCodesPerSecond() or 24.0
    seconds = np.where(np.isnan(codes), 0.0, codes) / per_second
    return CameraTrack(
        prim_path=str(prim.GetPath()),
        time_codes=codes,
        times=seconds,
        poses=poses,
        intrinsics=intrinsics,
        resolution=(int(height), int(width)),
        meters_per_unit=float(UsdGeom.GetStageMetersPerUnit(stage)),
    )


def find_cameras(stage: Usd.Stage) -> list[str]:
    """Paths of every Camera prim on the stage (for pickers and error messages)."""
    return [str(p.GetPath()) for p in stage.Traverse() if p.IsA(UsdGeom.Camera)]
