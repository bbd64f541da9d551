"""USD camera prims -> OpenCV poses and pinhole intrinsics, on real stages built with usd-core."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pxr = pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
from pxr import Gf, Usd, UsdGeom  # noqa: E402

from lingbot_isaac.camera import (  # noqa: E402
    CameraError,
    camera_intrinsics,
    camera_pose,
    numpy_to_gf,
    opencv_to_usd_local_to_world,
    sample_camera,
    set_camera_intrinsics,
)
from lingbot_isaac.lens import NonSquarePixelWarning  # noqa: E402


def new_stage(meters_per_unit: float = 1.0) -> Usd.Stage:
    stage = Usd.Stage.CreateInMemory()
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, meters_per_unit)
    return stage


def rot_x(deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def rot_y(deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def rot_z(deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def test_identity_camera_looks_down_minus_z():
    stage = new_stage()
    camera = UsdGeom.Camera.Define(stage, "/Cam")
    pose = camera_pose(camera.GetPrim())
    # USD camera: forward -Z, up +Y. OpenCV: forward +Z, down +Y.
    assert np.array_equal(pose, np.diag([1.0, -1.0, -1.0, 1.0]))


def test_translate_and_rotate_give_the_exact_opencv_pose():
    stage = new_stage()
    camera = UsdGeom.Camera.Define(stage, "/Cam")
    camera.AddTranslateOp().Set(Gf.Vec3d(1, 2, 3))
    camera.AddRotateYOp().Set(90.0)
    pose = camera_pose(camera.GetPrim())
    # Turned +90 deg about +Y: the lens (-Z) now faces -X, right (+X) faces -Z, up stays +Y.
    expected = np.eye(4)
    expected[:3, 0] = [0, 0, -1]  # OpenCV x: right
    expected[:3, 1] = [0, -1, 0]  # OpenCV y: down
    expected[:3, 2] = [-1, 0, 0]  # OpenCV z: forward
    expected[:3, 3] = [1, 2, 3]
    np.testing.assert_allclose(pose, expected, atol=1e-12)


def test_centimetre_stage_with_rotated_and_scaled_parents():
    stage = new_stage(meters_per_unit=0.01)
    parent = UsdGeom.Xform.Define(stage, "/Robot")
    parent.AddTranslateOp().Set(Gf.Vec3d(100, -50, 20))
    parent.AddRotateZOp().Set(90.0)
    parent.AddScaleOp().Set(Gf.Vec3f(2, 2, 2))
    mount = UsdGeom.Xform.Define(stage, "/Robot/Mount")
    mount.AddRotateXOp().Set(30.0)
    mount.AddScaleOp().Set(Gf.Vec3f(0.5, 0.5, 0.5))
    camera = UsdGeom.Camera.Define(stage, "/Robot/Mount/Cam")
    camera.AddTranslateOp().Set(Gf.Vec3d(10, 0, 5))
    camera.AddRotateYOp().Set(-20.0)

    # Column-vector composition, written out independently of Gf.
    rotation = rot_z(90) @ rot_x(30) @ rot_y(-20)
    position_cm = np.array([100, -50, 20]) + rot_z(90) @ (2 * (rot_x(30) @ (0.5 * np.array([10, 0, 5]))))
    expected = np.eye(4)
    expected[:3, :3] = rotation @ np.diag([1, -1, -1])
    expected[:3, 3] = position_cm * 0.01
    np.testing.assert_allclose(camera_pose(camera.GetPrim()), expected, atol=1e-9)


def test_non_uniform_scale_and_mirroring_are_refused():
    stage = new_stage()
    parent = UsdGeom.Xform.Define(stage, "/P")
    parent.AddScaleOp().Set(Gf.Vec3f(1, 2, 1))
    camera = UsdGeom.Camera.Define(stage, "/P/Cam")
    with pytest.raises(CameraError, match="non-uniform scale"):
        camera_pose(camera.GetPrim())
    mirror = UsdGeom.Camera.Define(stage, "/Mirror")
    mirror.AddScaleOp().Set(Gf.Vec3f(-1, -1, -1))
    with pytest.raises(CameraError, match="mirrors"):
        camera_pose(mirror.GetPrim())


def gf_pixel(camera: UsdGeom.Camera, point_world: np.ndarray, width: int, height: int) -> np.ndarray:
    """Where USD's own frustum, fitted to the image as Isaac renders it, puts a world point, in pixels.

    Isaac's renderer fits the horizontal aperture to the image width and takes the vertical extent
    from the image's aspect (what CameraUtil's MatchHorizontally conform does; usd-core lacks
    CameraUtil, so the frustum's NDC y, film position and offset alike over the vertical aperture,
    is rescaled to the conformed aperture in double precision). NDC -> pixel with y down.
    """
    gf_camera = camera.GetCamera(Usd.TimeCode.Default())
    view = gf_camera.frustum.ComputeViewMatrix()
    projection = gf_camera.frustum.ComputeProjectionMatrix()
    ndc = (view * projection).Transform(Gf.Vec3d(*point_world))
    conformed = gf_camera.horizontalAperture * height / width
    ndc_y = ndc[1] * gf_camera.verticalAperture / conformed
    return np.array([(ndc[0] + 1) / 2 * width, (1 - ndc_y) / 2 * height])


def opencv_pixel(pose: np.ndarray, k: np.ndarray, point_world: np.ndarray) -> np.ndarray:
    w2c = np.linalg.inv(pose)
    x, y, z = w2c[:3, :3] @ point_world + w2c[:3, 3]
    return np.array([k[0] * x / z + k[2], k[1] * y / z + k[3]])


@pytest.mark.parametrize("width,height", [(832, 480), (640, 480), (1280, 720), (500, 900)])
def test_intrinsics_with_offsets_match_usd_projection(width, height):
    stage = new_stage(meters_per_unit=0.01)
    camera = UsdGeom.Camera.Define(stage, "/Cam")
    camera.AddTranslateOp().Set(Gf.Vec3d(30, -20, 150))
    camera.AddRotateXYZOp().Set(Gf.Vec3f(70, 5, -30))
    h_ap = 36.0
    camera.GetFocalLengthAttr().Set(18.0)
    camera.GetHorizontalApertureAttr().Set(h_ap)
    camera.GetVerticalApertureAttr().Set(h_ap * height / width)  # square pixels
    camera.GetHorizontalApertureOffsetAttr().Set(2.5)
    camera.GetVerticalApertureOffsetAttr().Set(-1.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonSquarePixelWarning)
        k = camera_intrinsics(camera.GetPrim(), width, height)
    v_ap = h_ap * height / width
    np.testing.assert_allclose(
        k,
        [
            width * 18 / h_ap,
            height * 18 / v_ap,
            width / 2 - width * 2.5 / h_ap,
            height / 2 + height * -1.25 / v_ap,
        ],
        rtol=1e-6,  # USD stores apertures as float32
    )
    pose = camera_pose(camera.GetPrim())
    local = UsdGeom.Xformable(camera).ComputeLocalToWorldTransform(Usd.TimeCode.Default())
    rng = np.random.default_rng(0)
    for _ in range(5):
        # A point in front of the camera, in stage units; our pose is in metres.
        in_camera = np.array([*rng.uniform(-40, 40, 2), -rng.uniform(50, 300)])
        world_cm = np.array(local.Transform(Gf.Vec3d(*in_camera)))
        np.testing.assert_allclose(
            opencv_pixel(pose, k, world_cm * 0.01), gf_pixel(camera, world_cm, width, height), atol=1e-6
        )


def test_36x24_aperture_rendered_at_832x480_gets_isaacs_square_pixels():
    stage = new_stage(meters_per_unit=0.01)
    camera = UsdGeom.Camera.Define(stage, "/Cam")
    camera.AddTranslateOp().Set(Gf.Vec3d(10, 40, 120))
    camera.AddRotateXYZOp().Set(Gf.Vec3f(75, 0, 20))
    camera.GetFocalLengthAttr().Set(24.0)
    camera.GetHorizontalApertureAttr().Set(36.0)
    camera.GetVerticalApertureAttr().Set(24.0)  # 3:2 film on a 832x480 (26:15) render
    with pytest.warns(NonSquarePixelWarning, match="vertical aperture is ignored"):
        k = camera_intrinsics(camera.GetPrim(), 832, 480)
    np.testing.assert_allclose(k, [832 * 24 / 36, 832 * 24 / 36, 416, 240])
    assert k[0] == k[1]  # fx = fy (the vertical aperture would have said 480 * 24 / 24 = 480: 13.5% off)
    # The same K that Isaac Lab 2.x's Camera reports: f_x = W f / hA, f_y = f_x, c at the centre.
    pose = camera_pose(camera.GetPrim())
    local = UsdGeom.Xformable(camera).ComputeLocalToWorldTransform(Usd.TimeCode.Default())
    for in_camera in ([30.0, 20.0, -200.0], [-50.0, -25.0, -150.0]):
        world_cm = np.array(local.Transform(Gf.Vec3d(*in_camera)))
        np.testing.assert_allclose(
            opencv_pixel(pose, k, world_cm * 0.01), gf_pixel(camera, world_cm, 832, 480), atol=1e-6
        )


def test_non_pinhole_cameras_are_refused():
    stage = new_stage()
    ortho = UsdGeom.Camera.Define(stage, "/Ortho")
    ortho.GetProjectionAttr().Set(UsdGeom.Tokens.orthographic)
    with pytest.raises(CameraError, match="perspective"):
        camera_intrinsics(ortho.GetPrim(), 832, 480)
    fisheye = UsdGeom.Camera.Define(stage, "/Fisheye")
    from pxr import Sdf

    fisheye.GetPrim().CreateAttribute("cameraProjectionType", Sdf.ValueTypeNames.Token).Set("fisheyePolynomial")
    with pytest.raises(CameraError, match="cameraProjectionType"):
        camera_intrinsics(fisheye.GetPrim(), 832, 480)
    distorted = UsdGeom.Camera.Define(stage, "/Distorted")
    distorted.GetPrim().AddAppliedSchema("OmniLensDistortionFthetaAPI")
    with pytest.raises(CameraError, match="lens distortion"):
        camera_intrinsics(distorted.GetPrim(), 832, 480)
    xform = UsdGeom.Xform.Define(stage, "/NotACamera")
    with pytest.raises(CameraError, match="not a Camera"):
        camera_pose(xform.GetPrim())
    with pytest.raises(CameraError, match="cameras there"):
        sample_camera(stage, "/Missing", 832, 480)


def test_sample_camera_reads_authored_time_samples():
    stage = new_stage(meters_per_unit=0.01)
    stage.SetTimeCodesPerSecond(60)
    parent = UsdGeom.Xform.Define(stage, "/Rig")
    move = parent.AddTranslateOp()
    for code in (0, 30, 60):
        move.Set(Gf.Vec3d(code, 0, 100), code)
    camera = UsdGeom.Camera.Define(stage, "/Rig/Cam")
    camera.GetFocalLengthAttr().Set(20.0, 0)
    camera.GetFocalLengthAttr().Set(30.0, 45)  # a zoom, sampled on the camera itself
    camera.GetVerticalApertureAttr().Set(20.955 * 480 / 832)
    track = sample_camera(stage, "/Rig/Cam", 832, 480)
    assert track.time_codes.tolist() == [0, 30, 45, 60]
    np.testing.assert_allclose(track.times, [0, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(track.poses[:, 0, 3], [0, 0.3, 0.45, 0.6])
    np.testing.assert_allclose(track.poses[:, 2, 3], 1.0)
    assert track.intrinsics[0, 0] == pytest.approx(832 * 20 / 20.955)
    assert track.intrinsics[2, 0] == pytest.approx(832 * 30 / 20.955)
    assert track.meters_per_unit == 0.01 and track.resolution == (480, 832)


def test_opencv_pose_authoring_round_trips():
    stage = new_stage(meters_per_unit=0.01)
    camera = UsdGeom.Camera.Define(stage, "/Cam")
    pose = np.eye(4)
    pose[:3, :3] = rot_z(33) @ rot_x(-110) @ rot_y(12)
    pose[:3, 3] = [1.5, -2.25, 0.75]
    camera.AddTransformOp().Set(numpy_to_gf(opencv_to_usd_local_to_world(pose, 0.01)))
    np.testing.assert_allclose(camera_pose(camera.GetPrim()), pose, atol=1e-12)
    set_camera_intrinsics(camera, (600.0, 600.0, 400.0, 250.0), 832, 480)
    np.testing.assert_allclose(camera_intrinsics(camera.GetPrim(), 832, 480), [600, 600, 400, 250], atol=1e-9)
