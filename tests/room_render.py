"""A tiny deterministic ray caster: the "sim" of the sample episode.

`render_room(c2w, (fx, fy, cx, cy), height, width)` renders a box-shaped room with a few boxes
standing in it, seen by a pinhole camera with an OpenCV camera-to-world pose (x right, y down,
z forward) in metres. Everything is numpy; the same inputs give the same bytes on every machine.

Why hand-written: we need frames whose camera poses are known exactly (no renderer conventions
in between), that run anywhere without a GPU or Isaac Sim. Surfaces carry seeded procedural
textures full of corners and blobs (so ORB/SIFT find plenty of matches) and the boxes add depth
(so essential-matrix estimation is not degenerate on a single plane). Shading depends only on
the surface normal, never on the viewpoint, so one surface point has the same colour in every
frame.

World frame: metres, z up; the room spans `ROOM_MIN`..`ROOM_MAX`, the boxes are `BOXES`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

ROOM_MIN = np.array([-3.0, -4.0, 0.0])
ROOM_MAX = np.array([3.0, 4.0, 2.8])
# (min corner, max corner) of boxes standing on the floor; the middle of the room stays free
# for cameras (|x| < 1, |y| < 1.5).
BOXES: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...] = (
    ((-2.3, -3.3, 0.0), (-1.2, -2.0, 0.9)),
    ((1.0, 1.6, 0.0), (2.3, 2.6, 1.2)),
    ((-0.5, 2.7, 0.0), (0.4, 3.5, 1.7)),
    ((1.4, -2.6, 0.0), (2.3, -1.8, 0.6)),
    ((-2.5, 0.8, 0.0), (-1.7, 1.8, 1.0)),
)
TEXELS_PER_METRE = 160
SEED = 20240611
_LIGHT = np.array([0.35, -0.45, 0.82]) / np.linalg.norm([0.35, -0.45, 0.82])


@dataclass(frozen=True)
class _Scene:
    """Every surface as an axis-aligned rectangle plus its texture in one flat texel array."""

    normal_axis: np.ndarray  # [S] int: the axis the surface is perpendicular to
    u_axis: np.ndarray  # [S] int: the texture's column axis
    v_axis: np.ndarray  # [S] int: the texture's row axis
    origin: np.ndarray  # [S, 3] the rectangle's min corner (texel (0, 0))
    tex_width: np.ndarray  # [S] int
    tex_height: np.ndarray  # [S] int
    tex_offset: np.ndarray  # [S] int: where the surface's texels start in `texels`
    shade: np.ndarray  # [S] float: view-independent Lambert + ambient factor
    texels: np.ndarray  # [T, 3] uint8


def _draw_texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Coloured value noise with many rectangles and discs on top: corners and blobs at several scales."""
    # Low-frequency coloured background: bilinear upsampling of a coarse random grid.
    gh, gw = max(2, height // 40 + 2), max(2, width // 40 + 2)
    grid = rng.uniform(60, 200, size=(gh, gw, 3)).astype(np.float32)
    ys = np.linspace(0, gh - 1, height, dtype=np.float32)
    xs = np.linspace(0, gw - 1, width, dtype=np.float32)
    y0 = np.minimum(ys.astype(int), gh - 2)
    x0 = np.minimum(xs.astype(int), gw - 2)
    wy = (ys - y0)[:, None, None]
    wx = (xs - x0)[None, :, None]
    rows = grid[y0] * (1 - wy) + grid[y0 + 1] * wy  # [height, gw, 3]
    tex = rows[:, x0] * (1 - wx) + rows[:, x0 + 1] * wx
    tex = tex.astype(np.uint8)

    area_m2 = height * width / TEXELS_PER_METRE**2
    # (count per square metre, size range in texels): big panels, mid tiles, small specks.
    for per_m2, (lo, hi) in ((3, (40, 110)), (25, (10, 40)), (60, (3, 12))):
        count = max(1, int(per_m2 * area_m2))
        # Draw every random number of a layer at once (one generator call per field, not per shape).
        colours = rng.integers(0, 256, size=(count, 3)).astype(np.uint8)
        kinds = rng.integers(0, 3, size=count)
        sizes = rng.integers(lo, hi, size=(count, 2))
        ys_, xs_ = rng.integers(0, height, size=count), rng.integers(0, width, size=count)
        for colour, kind, (h, w), y, x in zip(colours, kinds, sizes, ys_, xs_, strict=True):
            if kind < 2:  # rectangle (solid or with a contrasting frame)
                tex[y : y + h, x : x + w] = colour
                if kind == 1 and h > 6 and w > 6:
                    b = max(1, min(h, w) // 5)
                    tex[y + b : y + h - b, x + b : x + w - b] = 255 - colour
            else:  # disc
                r = (h + w) / 4
                top, left = max(0, y - int(r)), max(0, x - int(r))
                patch = tex[top : y + int(r) + 1, left : x + int(r) + 1]
                yy = np.arange(top, top + patch.shape[0])[:, None]
                xx = np.arange(left, left + patch.shape[1])[None, :]
                patch[(yy - y) ** 2 + (xx - x) ** 2 <= r * r] = colour
    return tex


def _rectangles() -> list[tuple[int, float, np.ndarray, np.ndarray, float]]:
    """(normal axis, plane coordinate, min corner, max corner, normal sign) of every surface."""
    faces = []
    # Room: inward-facing walls, floor and ceiling. Surface id = 2*axis + (0 for min, 1 for max).
    for axis in range(3):
        for side, sign in ((ROOM_MIN, 1.0), (ROOM_MAX, -1.0)):
            lo, hi = ROOM_MIN.copy(), ROOM_MAX.copy()
            lo[axis] = hi[axis] = side[axis]
            faces.append((axis, side[axis], lo, hi, sign))
    # Boxes: outward-facing, surface id = 6 + 6*box + 2*axis + side.
    for bmin, bmax in BOXES:
        bmin, bmax = np.array(bmin), np.array(bmax)
        for axis in range(3):
            for side, sign in ((bmin, -1.0), (bmax, 1.0)):
                lo, hi = bmin.copy(), bmax.copy()
                lo[axis] = hi[axis] = side[axis]
                faces.append((axis, side[axis], lo, hi, sign))
    return faces


@functools.lru_cache(maxsize=1)
def _scene() -> _Scene:
    rng = np.random.default_rng(SEED)
    normal_axis, u_axis, v_axis, origin, widths, heights, offsets, shade, textures = ([] for _ in range(9))
    offset = 0
    for axis, _plane, lo, hi, sign in _rectangles():
        u, v = [a for a in range(3) if a != axis]
        w = int(np.ceil((hi[u] - lo[u]) * TEXELS_PER_METRE)) + 1
        h = int(np.ceil((hi[v] - lo[v]) * TEXELS_PER_METRE)) + 1
        tex = _draw_texture(rng, h, w)
        normal = np.zeros(3)
        normal[axis] = sign
        normal_axis.append(axis)
        u_axis.append(u)
        v_axis.append(v)
        origin.append(lo)
        widths.append(w)
        heights.append(h)
        offsets.append(offset)
        shade.append(0.55 + 0.45 * max(0.0, float(normal @ _LIGHT)))
        textures.append(tex.reshape(-1, 3))
        offset += w * h
    return _Scene(
        normal_axis=np.array(normal_axis),
        u_axis=np.array(u_axis),
        v_axis=np.array(v_axis),
        origin=np.array(origin),
        tex_width=np.array(widths),
        tex_height=np.array(heights),
        tex_offset=np.array(offsets),
        shade=np.array(shade),
        texels=np.concatenate(textures),
    )


def _check_camera(c2w: np.ndarray) -> np.ndarray:
    c2w = np.asarray(c2w, dtype=np.float64)
    if c2w.shape != (4, 4) or not np.all(np.isfinite(c2w)):
        raise ValueError(f"c2w must be a finite 4x4 camera-to-world matrix (got shape {c2w.shape})")
    eye = c2w[:3, 3]
    if np.any(eye <= ROOM_MIN) or np.any(eye >= ROOM_MAX):
        raise ValueError(f"camera position {eye.tolist()} is outside the room {ROOM_MIN}..{ROOM_MAX}")
    for bmin, bmax in BOXES:
        if np.all(eye > bmin) and np.all(eye < bmax):
            raise ValueError(f"camera position {eye.tolist()} is inside the box {bmin}..{bmax}")
    return c2w


def cast_rays(
    c2w_opencv: np.ndarray, intrinsics: tuple[float, float, float, float], height: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """World hit points [H, W, 3] and surface ids [H, W] of the rays through the pixel centres."""
    c2w = _check_camera(c2w_opencv)
    fx, fy, cx, cy = (float(v) for v in intrinsics)
    if height < 1 or width < 1 or fx <= 0 or fy <= 0:
        raise ValueError(f"need height, width >= 1 and fx, fy > 0 (got {height}x{width}, {intrinsics})")
    # Structure of arrays (one [N] array per axis): numpy reduces over a short last axis slowly.
    v, u = np.mgrid[0:height, 0:width]
    ray_x = ((u + 0.5 - cx) / fx).ravel()
    ray_y = ((v + 0.5 - cy) / fy).ravel()
    rot = c2w[:3, :3]
    dirs = [rot[k, 0] * ray_x + rot[k, 1] * ray_y + rot[k, 2] for k in range(3)]
    for d in dirs:
        # An exact zero would give 0/0 where the eye lies on a slab plane; nudge it, far below a texel.
        d[d == 0.0] = 1e-12
    eye = c2w[:3, 3]
    inv = [1.0 / d for d in dirs]

    # Leaving the room: the nearest wall each ray points at. Surface id = 2*axis + (1 if max side).
    t_hit = np.full(ray_x.shape, np.inf)
    surface = np.zeros(ray_x.shape, dtype=np.int64)
    for k in range(3):
        positive = dirs[k] > 0
        t_wall = np.where(positive, (ROOM_MAX[k] - eye[k]) * inv[k], (ROOM_MIN[k] - eye[k]) * inv[k])
        nearer = t_wall < t_hit
        t_hit = np.where(nearer, t_wall, t_hit)
        surface = np.where(nearer, 2 * k + positive, surface)

    # Entering a box (slab test); keep it if nearer. Surface id = 6 + 6*box + 2*axis + (1 if max side).
    for index, (bmin, bmax) in enumerate(BOXES):
        t_enter = np.full(ray_x.shape, -np.inf)
        t_exit = np.full(ray_x.shape, np.inf)
        enter_face = np.zeros(ray_x.shape, dtype=np.int64)
        for k in range(3):
            t1 = (bmin[k] - eye[k]) * inv[k]
            t2 = (bmax[k] - eye[k]) * inv[k]
            t_near = np.minimum(t1, t2)
            later = t_near > t_enter
            t_enter = np.where(later, t_near, t_enter)
            enter_face = np.where(later, 2 * k + (dirs[k] < 0), enter_face)
            t_exit = np.minimum(t_exit, np.maximum(t1, t2))
        hit = (t_enter <= t_exit) & (t_enter > 0) & (t_enter < t_hit)
        t_hit = np.where(hit, t_enter, t_hit)
        surface = np.where(hit, 6 + 6 * index + enter_face, surface)

    points = np.stack([eye[k] + dirs[k] * t_hit for k in range(3)], axis=-1)
    return points.reshape(height, width, 3), surface.reshape(height, width)


def render_room(
    c2w_opencv: np.ndarray, intrinsics: tuple[float, float, float, float], height: int, width: int
) -> np.ndarray:
    """Render the textured room: uint8 RGB [height, width, 3].

    `c2w_opencv` is a camera-to-world matrix with OpenCV axes in metres; `intrinsics` are
    (fx, fy, cx, cy) in pixels of this very image size. The camera must be inside the room and
    outside the boxes (ValueError otherwise).
    """
    points, surface = cast_rays(c2w_opencv, intrinsics, height, width)
    scene = _scene()
    points = points.reshape(-1, 3)
    surface = surface.reshape(-1)
    rows = np.arange(points.shape[0])
    local = points - scene.origin[surface]
    u = local[rows, scene.u_axis[surface]] * TEXELS_PER_METRE
    v = local[rows, scene.v_axis[surface]] * TEXELS_PER_METRE
    tex_w = scene.tex_width[surface]
    tex_h = scene.tex_height[surface]
    u = np.clip(u - 0.5, 0, tex_w - 1.001)
    v = np.clip(v - 0.5, 0, tex_h - 1.001)
    u0 = u.astype(np.int64)
    v0 = v.astype(np.int64)
    du = (u - u0)[:, None].astype(np.float32)
    dv = (v - v0)[:, None].astype(np.float32)
    base = scene.tex_offset[surface] + v0 * tex_w + u0
    texels = scene.texels
    c00 = texels[base].astype(np.float32)
    c01 = texels[base + 1].astype(np.float32)
    c10 = texels[base + tex_w].astype(np.float32)
    c11 = texels[base + tex_w + 1].astype(np.float32)
    colour = (c00 * (1 - du) + c01 * du) * (1 - dv) + (c10 * (1 - du) + c11 * du) * dv
    colour *= scene.shade[surface][:, None].astype(np.float32)
    return np.clip(np.rint(colour), 0, 255).astype(np.uint8).reshape(height, width, 3)


def look_at(eye: np.ndarray, target: np.ndarray, up: np.ndarray = (0.0, 0.0, 1.0)) -> np.ndarray:
    """OpenCV camera-to-world matrix of a camera at `eye` looking at `target` (world z up)."""
    eye, target, up = (np.asarray(a, dtype=np.float64) for a in (eye, target, up))
    forward = target - eye
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, up)
    if np.linalg.norm(right) < 1e-9:
        raise ValueError("look_at: the view direction is parallel to `up`")
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, down, forward, eye
    return c2w
