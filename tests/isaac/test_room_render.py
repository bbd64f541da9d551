"""The sample "sim" renderer: deterministic, pinhole-exact, and rich enough for feature matching."""

from __future__ import annotations

import numpy as np
import pytest

from tests import room_render
from tests.room_render import BOXES, cast_rays, look_at, render_room

H, W = 480, 832
K = (500.0, 510.0, 410.0, 236.0)  # fx != fy and an off-centre principal point on purpose


def project(c2w: np.ndarray, point: np.ndarray, k=K) -> np.ndarray:
    w2c = np.linalg.inv(c2w)
    x, y, z = w2c[:3, :3] @ point + w2c[:3, 3]
    fx, fy, cx, cy = k
    return np.array([fx * x / z + cx, fy * y / z + cy])


def test_shape_dtype_and_determinism():
    c2w = look_at((0.2, -0.5, 1.4), (1.0, 3.0, 1.0))
    first = render_room(c2w, K, H, W)
    assert first.shape == (H, W, 3) and first.dtype == np.uint8
    assert first.std() > 30, "the image should be richly textured, not flat"
    room_render._scene.cache_clear()  # textures are rebuilt from the seed: same bytes
    again = render_room(c2w.copy(), K, H, W)
    assert np.array_equal(first, again)
    small = render_room(c2w, (100.0, 100.0, 40.0, 30.0), 60, 80)
    assert small.shape == (60, 80, 3)


def test_camera_motion_changes_the_image():
    base = render_room(look_at((0, 0, 1.4), (0, 3, 1.2)), K, H, W)
    moved = render_room(look_at((0.1, 0, 1.4), (0.1, 3, 1.2)), K, H, W)
    turned = render_room(look_at((0, 0, 1.4), (0.5, 3, 1.2)), K, H, W)
    assert np.mean(base != moved) > 0.3
    assert np.mean(base != turned) > 0.3


def test_hit_points_reproject_to_pixel_centres():
    c2w = look_at((-0.3, 0.4, 1.2), (2.0, -3.0, 0.4))
    points, surface = cast_rays(c2w, K, H, W)
    for v, u in [(0, 0), (100, 700), (240, 416), (479, 831), (300, 50)]:
        assert np.allclose(project(c2w, points[v, u]), (u + 0.5, v + 0.5), atol=1e-6)
    # Every hit lies inside the room (walls included) and surface ids are valid.
    assert np.all(points >= room_render.ROOM_MIN - 1e-9) and np.all(points <= room_render.ROOM_MAX + 1e-9)
    assert surface.min() >= 0 and surface.max() < 6 + 6 * len(BOXES)


def test_box_corner_projects_where_the_pinhole_model_says():
    bmin, bmax = (np.array(c) for c in BOXES[2])  # the tall cabinet at y ~ 3
    corner = np.array([bmax[0], bmin[1], bmax[2]])  # top, front, right corner as seen from y = 0
    # From below the top and left of the right side, only the front face is visible: the corner
    # is the top-right corner of the cabinet's silhouette.
    c2w = look_at((0.0, 0.0, 1.2), corner)
    u, v = project(c2w, corner)
    assert abs(u - K[2]) < 1 and abs(v - K[3]) < 1
    _, surface = cast_rays(c2w, K, H, W)
    u, v = int(u), int(v)
    box_faces = set(range(6 + 6 * 2, 6 + 6 * 3))
    # Below-left of the corner is the cabinet; above and right of it is the room behind.
    assert surface[v + 3, u - 3] in box_faces
    assert surface[v - 3, u + 3] not in box_faces
    assert surface[v - 3, u - 3] not in box_faces
    assert surface[v + 3, u + 3] not in box_faces


def test_translation_parallel_to_a_wall_shifts_the_image_exactly():
    # Looking straight at the back wall (y = 4) from 3 m away, without boxes in view: moving the
    # camera by dx shifts the image by fx * dx / depth pixels.
    depth = room_render.ROOM_MAX[1] - 1.0
    eye = np.array([0.0, 1.0, 2.2])
    c2w = look_at(eye, eye + [0, 1, 0])
    k = (300.0, 300.0, 80.0, 60.0)
    shift_px = 12
    moved = c2w.copy()
    moved[0, 3] += shift_px * depth / k[0]
    a = render_room(c2w, k, 120, 160)
    b = render_room(moved, k, 120, 160)
    _, surface = cast_rays(c2w, k, 120, 160)
    assert np.all(surface == 3), "the view must see only the back wall for this test"
    diff = np.abs(a[:, shift_px:].astype(int) - b[:, :-shift_px].astype(int))
    assert diff.max() <= 1
    assert np.abs(a[:, shift_px:].astype(int) - b[:, shift_px:].astype(int)).mean() > 10


def test_bad_cameras_are_refused():
    with pytest.raises(ValueError, match="outside the room"):
        render_room(look_at((0, 5, 1), (0, 0, 1)), K, 10, 10)
    bmin, bmax = (np.array(c) for c in BOXES[0])
    with pytest.raises(ValueError, match="inside the box"):
        render_room(look_at((bmin + bmax) / 2, (0, 0, 1)), K, 10, 10)
    with pytest.raises(ValueError, match="4x4"):
        render_room(np.eye(3), K, 10, 10)


def test_feature_matching_recovers_the_relative_pose():
    cv2 = pytest.importorskip("cv2")
    c2w_a = look_at((0.0, -0.5, 1.5), (0.5, 3.0, 1.0))
    c2w_b = look_at((0.25, -0.3, 1.45), (0.9, 3.0, 1.0))
    a = cv2.cvtColor(render_room(c2w_a, K, H, W), cv2.COLOR_RGB2GRAY)
    b = cv2.cvtColor(render_room(c2w_b, K, H, W), cv2.COLOR_RGB2GRAY)
    orb = cv2.ORB_create(3000)
    ka, da = orb.detectAndCompute(a, None)
    kb, db = orb.detectAndCompute(b, None)
    assert len(ka) > 1000 and len(kb) > 1000
    matches = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True).match(da, db)
    assert len(matches) > 300
    pa = np.float64([ka[m.queryIdx].pt for m in matches])
    pb = np.float64([kb[m.trainIdx].pt for m in matches])
    camera = np.array([[K[0], 0, K[2]], [0, K[1], K[3]], [0, 0, 1]])
    # OpenCV's essential matrix wants one focal length; the 2% fx/fy difference is absorbed by RANSAC.
    e, inliers = cv2.findEssentialMat(pa, pb, camera, cv2.RANSAC, 0.999, 1.0)
    _, rot, trans, _ = cv2.recoverPose(e, pa, pb, camera, mask=inliers)
    true = np.linalg.inv(c2w_b) @ c2w_a  # a -> b in camera coordinates
    angle = np.degrees(np.arccos(np.clip((np.trace(rot.T @ true[:3, :3]) - 1) / 2, -1, 1)))
    direction = true[:3, 3] / np.linalg.norm(true[:3, 3])
    assert angle < 1.0
    assert float(trans.ravel() @ direction) > 0.98
