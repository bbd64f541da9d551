"""The episode / action folder format (docs/episode-format.md): one reader, one writer, one validator.

An action folder is LingBot-World's own layout: `poses.npy` [N, 4, 4] camera-to-world (OpenCV axes,
metres), `intrinsics.npy` [N, 4] fx, fy, cx, cy in pixels of the model frame (480x832), `image.jpg`
(or .png) and `prompt.txt`. An episode folder adds `episode.json` (what the sim knew) and optional
sim frames. Every package reads, writes and checks these files through this module, so a rule
(the rigid-transform tolerance, the shapes, the messages) is stated once, here.

Errors are `EpisodeError` (a ValueError) naming the file or field and the fix. numpy only; Pillow
is imported lazily for the first-frame image (it is a core dependency of the Isaac side too).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contracts import atomic
from contracts.model_frame import MODEL_HEIGHT, MODEL_WIDTH, to_model_intrinsics

SCHEMA = "lingbot-isaac/episode"
SCHEMA_VERSION = 1
EPISODE_FPS = 16.0  # the frame rate recorded episodes are resampled to (the model's)
JPEG_QUALITY = 95
IMAGE_NAMES = ("image.jpg", "image.jpeg", "image.png")  # the first frame, looked for in this order
POSES_FILE, INTRINSICS_FILE, PROMPT_FILE, META_FILE = "poses.npy", "intrinsics.npy", "prompt.txt", "episode.json"
SIM_VIDEO = "sim.mp4"
ROLLOUT_VIDEO, ROLLOUT_INFO = "rollout.mp4", "rollout.json"  # a generated rollout, beside its episode
SIM_FRAMES_DIR = "frames"
JPEG_MAGIC = b"\xff\xd8\xff"  # how image bytes say what they are
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# --- the validation rules, stated once -----------------------------------------------------------
RIGID_TOLERANCE = 1e-6  # max |last row - [0, 0, 0, 1]| of a camera-to-world matrix
ROTATION_TOLERANCE = 1e-3  # max |R^T R - I|: float32 poses of long trajectories drift a little
MIN_POSES = 1  # the format's minimum (a still camera); readers accept any N >= 1
GENERATE_MIN_POSES = 5  # what generation needs: 5 frames = 2 latent frames, the shortest motion
# |translation| bound (any unit): the engine resamples in float64 and then works in float32 (differences,
# rotations, norms whose squares must stay below 3.4e38, division by the scale); 1e9 leaves every step
# finite with room, and is a million km in metres (a path beyond it is a unit mistake, not a scene)
MAX_TRANSLATION = 1e9
# |fx, fy, cx, cy| bound, pixels of the model frame: the engine divides by them in float32 (a float64 1e300 is inf
# there); 1e9 px is a focal length no lens has (a value beyond it is a unit mistake)
MAX_INTRINSIC = 1e9
MAX_IMAGE_PIXELS = 8192 * 8192  # a first frame is decoded whole to be checked; the model uses <= 832*480

POSES_FIX = "poses must be [N, 4, 4] float camera-to-world matrices (OpenCV axes: x right, y down, z forward)"
INTRINSICS_FIX = (
    f"intrinsics must be [N, 4] (or one row [4]) float fx, fy, cx, cy in pixels of a {MODEL_HEIGHT}x{MODEL_WIDTH} "
    f"frame (rescale x by {MODEL_WIDTH}/W and y by {MODEL_HEIGHT}/H)"
)
LAYOUT = "an episode folder holds poses.npy, intrinsics.npy, image.jpg (or image.png) and prompt.txt"


class EpisodeError(ValueError):
    """An episode folder (or what should go into one) is invalid; the message names file and fix."""


# --- the validator -------------------------------------------------------------------------------


def _numbers(array: Any, where: str, fix: str) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.kind not in "fiu":
        raise EpisodeError(f"{where} has dtype {array.dtype}, not a number type; {fix}")
    return array


def check_poses(poses: Any, where: str = "poses", min_poses: int = MIN_POSES, why: str = "") -> np.ndarray:
    """Validate [N, 4, 4] rigid camera-to-world matrices; return them as float64 (a copy).

    `min_poses`: MIN_POSES for the format, GENERATE_MIN_POSES where a video is generated; `why`
    is appended to the too-few message.
    """
    poses = _numbers(poses, where, POSES_FIX)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4):
        raise EpisodeError(f"{where} has shape {list(poses.shape)}; {POSES_FIX}")
    count = poses.shape[0]
    if count < min_poses:
        raise EpisodeError(f"{where} has {count} poses; at least {min_poses} are needed{why}")
    poses = poses.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(poses).all(axis=(1, 2)))
    if bad.size:
        raise EpisodeError(f"{where}: pose {bad[0]} has NaN or infinite values; {POSES_FIX}")
    bad = np.flatnonzero(np.abs(poses[:, :3, 3]).max(axis=1) > MAX_TRANSLATION)
    if bad.size:
        raise EpisodeError(
            f"{where}: pose {bad[0]} has a translation of {np.abs(poses[bad[0], :3, 3]).max():.3g}, beyond "
            f"+-{MAX_TRANSLATION:g} (what float32 camera maths survives); express the path in metres or "
            "centimetres, or re-centre it near the origin"
        )
    bad = np.flatnonzero(np.abs(poses[:, 3] - [0, 0, 0, 1]).max(axis=1) > RIGID_TOLERANCE)
    if bad.size:
        raise EpisodeError(
            f"{where}: pose {bad[0]} has last row {poses[bad[0], 3].tolist()}, need [0, 0, 0, 1] "
            f"(within {RIGID_TOLERANCE:g}); {POSES_FIX}"
        )
    rotation = poses[:, :3, :3]
    error = np.abs(np.einsum("nji,njk->nik", rotation, rotation) - np.eye(3)).max(axis=(1, 2))
    bad = np.flatnonzero(error > ROTATION_TOLERANCE)
    if bad.size:
        raise EpisodeError(
            f"{where}: the rotation of pose {bad[0]} is not a proper rotation: not orthonormal "
            f"(max |R^T R - I| = {error[bad[0]]:.2g} > {ROTATION_TOLERANCE:g}); "
            "remove scale or shear from the camera pose (the upper-left 3x3 must be a pure rotation)"
        )
    bad = np.flatnonzero(np.linalg.det(rotation) < 0)
    if bad.size:
        raise EpisodeError(
            f"{where}: the rotation of pose {bad[0]} is not a proper rotation: a reflection (det < 0); "
            "convert the poses to right-handed OpenCV axes (x right, y down, z forward)"
        )
    return poses


def check_intrinsics(intrinsics: Any, count: int, where: str = "intrinsics") -> np.ndarray:
    """Validate intrinsics for `count` poses; return them as float64 [R, 4] with R = count or 1.

    The one shape rule: one row per pose ([N, 4]) or one row for all ([4] or [1, 4]; the model
    uses row 0 only). Use `per_pose` for [N, 4].
    """
    intrinsics = _numbers(intrinsics, where, INTRINSICS_FIX).astype(np.float64)
    if intrinsics.shape == (4,):
        intrinsics = intrinsics[None, :]
    if intrinsics.ndim != 2 or intrinsics.shape[1] != 4:
        raise EpisodeError(f"{where} has shape {list(intrinsics.shape)}, not [{count}, 4]; {INTRINSICS_FIX}")
    if intrinsics.shape[0] not in (1, count):
        raise EpisodeError(
            f"{where} has {intrinsics.shape[0]} rows but there are {count} poses; need shape [{count}, 4] "
            "(one row per pose) or a single row"
        )
    bad = np.flatnonzero(~np.isfinite(intrinsics).all(axis=1))
    if bad.size:
        raise EpisodeError(f"{where}: row {bad[0]} has NaN or infinite values; {INTRINSICS_FIX}")
    bad = np.flatnonzero(np.abs(intrinsics).max(axis=1) > MAX_INTRINSIC)
    if bad.size:
        raise EpisodeError(
            f"{where}: row {bad[0]} has {intrinsics[bad[0]].tolist()}, beyond +-{MAX_INTRINSIC:g} pixels (what float32 "
            f"camera maths survives); {INTRINSICS_FIX}"
        )
    bad = np.flatnonzero((intrinsics[:, :2] <= 0).any(axis=1))
    if bad.size:
        raise EpisodeError(
            f"{where}: row {bad[0]} has focal lengths {intrinsics[bad[0], :2].tolist()}; fx, fy must be > 0 "
            f"(pixels of a {MODEL_HEIGHT}x{MODEL_WIDTH} frame)"
        )
    return intrinsics


def per_pose(intrinsics: np.ndarray, count: int) -> np.ndarray:
    """Checked [R, 4] intrinsics -> [count, 4] (a single row repeated)."""
    return np.repeat(intrinsics, count, axis=0) if len(intrinsics) == 1 else intrinsics


def check_action(
    poses: Any,
    intrinsics: Any,
    where: str = "",
    min_poses: int = MIN_POSES,
    poses_name: str = "poses",
    intrinsics_name: str = "intrinsics",
) -> tuple[np.ndarray, np.ndarray]:
    """Validate poses and intrinsics together -> (poses [N, 4, 4], intrinsics [R, 4]), float64.

    Messages read "{where}: {poses_name} ..." (or "{poses_name} ..." without `where`)."""
    prefix = f"{where}: " if where else ""
    why = " (a video of F frames uses F poses, F = 4n+1)" if min_poses >= GENERATE_MIN_POSES else ""
    poses = check_poses(poses, prefix + poses_name, min_poses, why)
    return poses, check_intrinsics(intrinsics, len(poses), prefix + intrinsics_name)


def check_prompt(prompt: Any, where: str = "prompt") -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise EpisodeError(f"{where}: must be a non-empty text describing the scene and the motion")
    return prompt.strip()


def image_format(data: bytes, where: str = "image") -> str:
    """'jpeg' or 'png' from the magic bytes; EpisodeError for anything else."""
    if data.startswith(JPEG_MAGIC):
        return "jpeg"
    if data.startswith(PNG_MAGIC):
        return "png"
    raise EpisodeError(f"{where} must be JPEG or PNG bytes (image.jpg / image.png of the episode)")


def image_hw(data: bytes, where: str = "image") -> tuple[int, int]:
    """(height, width) of JPEG or PNG bytes, decoded whole (a header or the magic bytes alone pass a
    sniff and fail in the worker); EpisodeError for bytes Pillow cannot decode or too many pixels."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise EpisodeError(
                    f"{where}: {width}x{height} pixels is above {MAX_IMAGE_PIXELS} (8192x8192); send the "
                    "first frame at the render size (the model uses at most 832x480)"
                )
            img.load()
    except EpisodeError:
        raise
    except Exception as exc:  # whatever Pillow raises for these bytes (broken data, truncation, bomb) is theirs
        reason = str(exc).split(" (")[0][:200]  # Pillow's words, never a path (the bytes have none)
        raise EpisodeError(f"{where}: not a readable JPEG or PNG ({type(exc).__name__}: {reason}); "
                           "send a whole image.jpg or image.png") from None  # fmt: skip
    return height, width


# --- reading ---------------------------------------------------------------------------------------


def load_npy(path: Path, what: str) -> np.ndarray:
    """One array of an action folder; `what` says what it should hold (for the messages)."""
    if not path.is_file():
        raise EpisodeError(f"{path}: missing (file not found); {LAYOUT}; {path.name} holds {what} (numpy.save)")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise EpisodeError(
            f"{path}: not a readable .npy array ({exc}); write {what} with numpy.save(path, array.astype(numpy.float32))"
        ) from None
    if not isinstance(array, np.ndarray):  # an .npz archive renamed to .npy
        array.close()
        raise EpisodeError(f"{path}: holds an .npz archive, not one array; write {what} with numpy.save")
    return array


def load_action(folder: str | os.PathLike, min_poses: int = MIN_POSES) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate `poses.npy` and `intrinsics.npy` -> (poses [N, 4, 4], intrinsics [R, 4]) float64."""
    folder = Path(folder)
    poses_path, intrinsics_path = folder / POSES_FILE, folder / INTRINSICS_FILE
    poses = load_npy(poses_path, "[N, 4, 4] camera-to-world matrices")
    intrinsics = load_npy(intrinsics_path, f"[N, 4] fx, fy, cx, cy for a {MODEL_HEIGHT}x{MODEL_WIDTH} frame")
    why = " (a video of F frames uses F poses, F = 4n+1)" if min_poses >= GENERATE_MIN_POSES else ""
    poses = check_poses(poses, str(poses_path), min_poses, why)
    return poses, check_intrinsics(intrinsics, len(poses), str(intrinsics_path))


def find_image(folder: str | os.PathLike) -> Path:
    folder = Path(folder)
    for name in IMAGE_NAMES:
        if (folder / name).is_file():
            return folder / name
    raise EpisodeError(f"{folder}: no first-frame image (looked for {', '.join(IMAGE_NAMES)}); {LAYOUT}")


def read_prompt(folder: str | os.PathLike) -> str:
    path = Path(folder) / PROMPT_FILE
    if not path.is_file():
        raise EpisodeError(f"{path}: missing; write the scene description there (the text prompt)")
    prompt = path.read_text(encoding="utf-8").strip()
    if not prompt:
        raise EpisodeError(f"{path}: empty; write a prompt describing the scene and the motion")
    return prompt


@dataclass
class EpisodeMeta:
    """What `episode.json` records besides the LingBot files. `source_resolution` is (H, W)."""

    source_resolution: tuple[int, int]
    fps: float = EPISODE_FPS
    meters_per_unit: float = 1.0
    camera_prim: str | None = None
    sim_times: list[float] | None = None  # seconds of sim time of each episode frame
    scene_id: str | None = None
    robot_id: str | None = None
    source: str | None = None  # where the trajectory came from (file, recorder, ...)
    generation: dict[str, Any] | None = None  # a partial GenerationSettings dict to ask for; None: defaults
    source_intrinsics: list[float] | None = None  # frame 0, pixels of source_resolution (set by writer)
    sim_frames: str | None = None  # "sim.mp4", "frames" or None (set by writer)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self, frame_count: int) -> dict[str, Any]:
        data = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "frame_count": frame_count}
        data["lingbot_resolution"] = [MODEL_HEIGHT, MODEL_WIDTH]
        data.update(asdict(self))
        data["source_resolution"] = list(self.source_resolution)
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> EpisodeMeta:
        """Parse `episode.json`. Keys this version does not know are kept out (a newer minor
        writer may add fields; `schema_version` guards incompatible changes)."""
        if not isinstance(data, dict):
            raise EpisodeError(f"{where}: must hold a JSON object")
        if data.get("schema") != SCHEMA:
            raise EpisodeError(f"{where}: 'schema' must be {SCHEMA!r} (got {data.get('schema')!r})")
        version = data.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise EpisodeError(f"{where}: 'schema_version' must be a positive integer (got {version!r})")
        if version > SCHEMA_VERSION:
            raise EpisodeError(
                f"{where}: schema_version {version} is newer than this lingbot-isaac reads "
                f"({SCHEMA_VERSION}); upgrade lingbot-isaac"
            )
        kwargs = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        resolution = kwargs.get("source_resolution")
        valid = isinstance(resolution, list) and len(resolution) == 2
        if not (valid and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in resolution)):
            raise EpisodeError(f"{where}: 'source_resolution' must be [height, width] (got {resolution!r})")
        kwargs["source_resolution"] = (resolution[0], resolution[1])
        if kwargs.get("sim_frames") not in (None, SIM_VIDEO, SIM_FRAMES_DIR, SIM_FRAMES_DIR + "/"):
            raise EpisodeError(
                f'{where}: sim_frames is {kwargs["sim_frames"]!r}; expected "{SIM_VIDEO}", "{SIM_FRAMES_DIR}" or null'
            )
        generation = kwargs.get("generation")
        if generation is not None and not isinstance(generation, dict):
            raise EpisodeError(f"{where}: 'generation' must be an object of generation settings or null")
        return cls(**kwargs)


@dataclass
class Episode:
    """An episode folder, read and validated."""

    path: Path
    poses: np.ndarray  # [N, 4, 4] OpenCV camera-to-world, metres (as stored, float32 usually)
    intrinsics: np.ndarray  # [N, 4] fx, fy, cx, cy for the 480x832 model frame (as stored)
    image_path: Path
    prompt: str
    meta: EpisodeMeta | None  # None for plain LingBot folders (no episode.json)

    @property
    def frame_count(self) -> int:
        return int(self.poses.shape[0])

    def image(self) -> np.ndarray:
        """The first frame, uint8 RGB [H, W, 3]."""
        from PIL import Image

        with Image.open(self.image_path) as img:
            return np.asarray(img.convert("RGB"))

    @property
    def sim_frames_path(self) -> Path | None:
        """`sim.mp4` or the `frames/` folder when the episode carries sim frames."""
        named = self.meta.sim_frames.rstrip("/") if self.meta and self.meta.sim_frames else None
        for name in (named,) if named else (SIM_VIDEO, SIM_FRAMES_DIR):
            if (self.path / name).exists():
                return self.path / name
        return None

    def sim_frame_files(self) -> list[Path]:
        """The image files of `frames/` in order (empty when there is no frames folder)."""
        folder = self.path / SIM_FRAMES_DIR
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def read_episode(directory: str | os.PathLike, min_poses: int = MIN_POSES) -> Episode:
    """Read and validate an episode folder (ours, or a plain LingBot-World example folder)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise EpisodeError(f"{directory}: not a folder; pass an episode folder ({LAYOUT})")
    poses_path = directory / POSES_FILE
    poses = load_npy(poses_path, "[N, 4, 4] camera-to-world matrices")
    check_poses(poses, str(poses_path), min_poses)
    count = poses.shape[0]
    intrinsics_path = directory / INTRINSICS_FILE
    intrinsics = load_npy(intrinsics_path, f"[N, 4] fx, fy, cx, cy for a {MODEL_HEIGHT}x{MODEL_WIDTH} frame")
    checked = check_intrinsics(intrinsics, count, str(intrinsics_path))
    if checked.shape != intrinsics.shape:  # a single row: the same for every pose
        intrinsics = per_pose(checked, count).astype(intrinsics.dtype)
    image_path = find_image(directory)
    prompt = read_prompt(directory)

    meta = read_meta(directory, count)
    if meta is not None:
        size = _image_size(image_path)
        if size != (meta.source_resolution[1], meta.source_resolution[0]):
            raise EpisodeError(
                f"{image_path}: is {size[0]}x{size[1]} but {META_FILE} says source_resolution "
                f"{meta.source_resolution[1]}x{meta.source_resolution[0]} (W x H)"
            )
    return Episode(path=directory, poses=poses, intrinsics=intrinsics, image_path=image_path, prompt=prompt, meta=meta)


def read_meta(directory: str | os.PathLike, count: int) -> EpisodeMeta | None:
    """`episode.json` of a folder whose poses.npy has `count` rows, checked against the folder;
    None when the folder has none (a plain LingBot-World example folder)."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        return None
    try:
        data = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EpisodeError(f"{meta_path}: not valid JSON ({exc})") from None
    meta = EpisodeMeta.from_json(data, str(meta_path))
    if data.get("frame_count") != count:
        raise EpisodeError(f"{meta_path}: frame_count {data.get('frame_count')} but poses.npy has {count}")
    if meta.sim_times is not None and len(meta.sim_times) != count:
        raise EpisodeError(f"{meta_path}: sim_times has {len(meta.sim_times)} entries for {count} poses")
    named = meta.sim_frames.rstrip("/") if meta.sim_frames else None
    if named == SIM_VIDEO and not (directory / SIM_VIDEO).is_file():
        raise EpisodeError(f'{meta_path}: says sim_frames "{SIM_VIDEO}" but {directory / SIM_VIDEO} is missing')
    if named == SIM_FRAMES_DIR and not (directory / SIM_FRAMES_DIR).is_dir():
        raise EpisodeError(
            f'{meta_path}: says sim_frames "{SIM_FRAMES_DIR}" but {directory / SIM_FRAMES_DIR} is missing'
        )
    return meta


def is_episode_dir(path: str | os.PathLike) -> bool:
    """Cheap check: does the folder look like an episode (poses.npy and intrinsics.npy)?"""
    path = Path(path)
    return path.is_dir() and (path / POSES_FILE).is_file() and (path / INTRINSICS_FILE).is_file()


def _image_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return img.size
    except (OSError, ValueError) as exc:
        raise EpisodeError(f"{path}: not a readable image ({exc})") from None


# --- writing ---------------------------------------------------------------------------------------


def write_rollout(folder: str | os.PathLike, video: bytes, info: dict[str, Any], client: str = "replay") -> Path:
    """`rollout.mp4` beside an episode, with its provenance record `rollout.json` (the worker's
    record plus this job: `info`, whose "provenance" is the worker's record), each written
    atomically and durably, the record first; returns the mp4's path."""
    from contracts.provenance import sidecar_path, with_job, write_record

    target = Path(folder) / ROLLOUT_VIDEO
    job = {key: value for key, value in info.items() if key not in ("provenance", "first_frame")}
    record = with_job(info.get("provenance"), {"client": client, **job})
    if record is not None:
        if info.get("first_frame"):  # which first frame the rollout started from (photo or the episode's)
            record = {**record, "inputs": {**(record.get("inputs") or {}), "first_frame": info["first_frame"]}}
        write_record(target, record)
    else:
        sidecar_path(target).unlink(missing_ok=True)  # a stale record would describe another video
        print(f"warning: the server sent no provenance record for {target}: its report cannot say "
              "what made it (an older server?)", file=sys.stderr)  # fmt: skip
    atomic.write_bytes(target, video)
    return target


def _image_rgb(image: Any):
    from PIL import Image

    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as img:
                return img.convert("RGB")
        except (OSError, ValueError) as exc:
            raise EpisodeError(f"{image}: not a readable image ({exc})") from None
    if isinstance(image, (bytes, bytearray)):
        try:
            with Image.open(io.BytesIO(image)) as img:
                return img.convert("RGB")
        except (OSError, ValueError) as exc:
            raise EpisodeError(f"image bytes are not a readable image ({exc})") from None
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[2] == 4:
        array = array[..., :3]  # RGBA from a render product annotator: drop alpha
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise EpisodeError(f"image: need uint8 RGB [H, W, 3] (got {array.dtype} {array.shape})")
    return Image.fromarray(array)


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)


def write_action(
    folder: str | os.PathLike,
    poses: Any,
    intrinsics: Any,
    image: Any,
    prompt: str,
    min_poses: int = MIN_POSES,
) -> Path:
    """Write the four LingBot files into `folder` (created; usually a staging folder the caller
    renames into place): poses/intrinsics as float32 (float64 stays float64), intrinsics already in
    model-frame pixels.

    `prompt` is written as given (checked non-empty). `image`: encoded JPEG/PNG bytes (stored as they are, as image.jpg / image.png) or anything
    `write_episode` takes (encoded as JPEG quality 95, 4:4:4). Nothing is synced here; the caller
    makes the folder durable (`atomic.replace_dir` / `atomic.fsync_tree`).
    """
    folder = Path(folder)
    checked = check_action(poses, intrinsics, min_poses=min_poses)
    check_prompt(prompt)
    folder.mkdir(parents=True, exist_ok=True)
    for name, given, array in zip((POSES_FILE, INTRINSICS_FILE), (poses, intrinsics), checked, strict=True):
        _save_npy(folder / name, array.astype(np.float64 if np.asarray(given).dtype == np.float64 else np.float32))
    if isinstance(image, (bytes, bytearray)):
        kind = image_format(bytes(image))
        (folder / ("image.jpg" if kind == "jpeg" else "image.png")).write_bytes(bytes(image))
    else:
        _image_rgb(image).save(folder / "image.jpg", quality=JPEG_QUALITY, subsampling=0)  # 4:4:4: keep chroma
    (folder / PROMPT_FILE).write_text(prompt, encoding="utf-8")  # as given, byte for byte
    return folder


def write_episode(
    directory: str | os.PathLike,
    poses: Any,
    intrinsics: Any,
    image: Any,
    prompt: str,
    meta: EpisodeMeta,
    sim_frames: np.ndarray | Sequence[np.ndarray] | os.PathLike | str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an episode folder atomically and durably; return its path.

    `poses`: [N, 4, 4] OpenCV camera-to-world in metres. `intrinsics`: [N, 4] or [4] fx, fy, cx, cy
    in pixels of `meta.source_resolution` (H, W): they are rescaled to the model frame for
    `intrinsics.npy` and frame 0 is kept as-is in `episode.json`. `image`: the first frame at the
    source resolution (array, PIL image, encoded bytes or a file). `sim_frames`: optional frames
    [N, H, W, 3] uint8 (written to `frames/` as JPEG), or a path to an .mp4 (copied to `sim.mp4`)
    or to a folder of images (copied to `frames/`).
    """
    directory = Path(directory)
    poses, intrinsics = check_action(poses, intrinsics)
    count = poses.shape[0]
    intrinsics = per_pose(intrinsics, count)
    prompt = check_prompt(prompt)
    height, width = (int(v) for v in meta.source_resolution)
    if height < 1 or width < 1:
        raise EpisodeError(f"meta.source_resolution must be positive (got {meta.source_resolution})")
    picture = _image_rgb(image)
    if picture.size != (width, height):
        raise EpisodeError(
            f"image is {picture.size[0]}x{picture.size[1]} but meta.source_resolution says {width}x{height} "
            "(W x H); record the image at the resolution the intrinsics are for"
        )
    if meta.sim_times is not None and len(meta.sim_times) != count:
        raise EpisodeError(f"meta.sim_times has {len(meta.sim_times)} entries for {count} poses")
    if directory.exists() and not overwrite:
        raise EpisodeError(f"{directory} already exists; pick another folder or pass overwrite")

    meta = EpisodeMeta(**{**asdict(meta), "source_resolution": (height, width)})
    meta.source_intrinsics = [float(v) for v in intrinsics[0]]
    meta.sim_times = None if meta.sim_times is None else [float(t) for t in meta.sim_times]
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        model_intrinsics = to_model_intrinsics(intrinsics, height, width).astype(np.float32)
        write_action(staging, poses.astype(np.float32), model_intrinsics, picture, prompt + "\n")
        meta.sim_frames = _write_sim_frames(staging, sim_frames, count, (height, width))
        (staging / META_FILE).write_text(json.dumps(meta.to_json(count), indent=1) + "\n", encoding="utf-8")
        atomic.replace_dir(staging, directory, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _write_sim_frames(staging: Path, sim_frames: Any, count: int, resolution: tuple[int, int]) -> str | None:
    if sim_frames is None:
        return None
    if isinstance(sim_frames, (str, os.PathLike)):
        source = Path(sim_frames)
        if source.is_file() and source.suffix.lower() == ".mp4":
            shutil.copyfile(source, staging / SIM_VIDEO)
            return SIM_VIDEO
        if source.is_dir():
            shutil.copytree(source, staging / SIM_FRAMES_DIR)
            return SIM_FRAMES_DIR
        raise EpisodeError(f"sim_frames: {source} is neither an .mp4 file nor a folder of images")
    frames = staging / SIM_FRAMES_DIR
    frames.mkdir()
    written = 0
    for index, frame in enumerate(sim_frames):
        picture = _image_rgb(frame)
        if picture.size != (resolution[1], resolution[0]):
            raise EpisodeError(f"sim_frames[{index}] is {picture.size} (W, H), need {resolution[::-1]}")
        picture.save(frames / f"{index:06d}.jpg", quality=JPEG_QUALITY)
        written += 1
    if written != count:
        raise EpisodeError(f"sim_frames: got {written} frames for {count} poses")
    return SIM_FRAMES_DIR
