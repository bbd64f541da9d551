"""Episode folders: what the Isaac side records and the server generates from.

numpy + Pillow only. The layout (`docs/episode-format.md`) is LingBot-World's own action layout
(`poses.npy`, `intrinsics.npy`, `image.jpg`, `prompt.txt`) plus `episode.json` with what the sim
knew (source resolution and intrinsics, fps, metersPerUnit, camera prim, sim times, ids,
generation settings) and optional sim frames (`sim.mp4` or `frames/`) for comparison.

Writes are atomic: the folder is built under a temporary name beside the target and renamed
into place, so a reader never sees half an episode. Reads validate everything and name the
file and field that is wrong.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

SCHEMA = "lingbot-isaac/episode"
SCHEMA_VERSION = 1
LINGBOT_HEIGHT, LINGBOT_WIDTH = 480, 832  # intrinsics.npy is always expressed for this frame
JPEG_QUALITY = 95
ROTATION_TOLERANCE = 1e-3  # float32 poses of long trajectories drift a little from orthonormal
IMAGE_NAMES = ("image.jpg", "image.png")
SIM_VIDEO = "sim.mp4"
SIM_FRAMES_DIR = "frames"


class EpisodeError(ValueError):
    """An episode folder (or what should go into one) is invalid; the message names file and fix."""


@dataclass
class EpisodeMeta:
    """What `episode.json` records besides the LingBot files. `source_resolution` is (H, W)."""

    source_resolution: tuple[int, int]
    fps: float = 16.0
    meters_per_unit: float = 1.0
    camera_prim: str | None = None
    sim_times: list[float] | None = None  # seconds of sim time of each episode frame
    scene_id: str | None = None
    robot_id: str | None = None
    source: str | None = None  # where the trajectory came from (file, recorder, ...)
    generation: dict[str, Any] | None = None  # GenerationSettings.to_dict() to ask for; None: defaults
    source_intrinsics: list[float] | None = None  # frame 0, pixels of source_resolution (set by writer)
    sim_frames: str | None = None  # "sim.mp4", "frames" or None (set by writer)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self, frame_count: int) -> dict[str, Any]:
        data = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "frame_count": frame_count}
        data["lingbot_resolution"] = [LINGBOT_HEIGHT, LINGBOT_WIDTH]
        data.update(asdict(self))
        data["source_resolution"] = list(self.source_resolution)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str) -> EpisodeMeta:
        if data.get("schema") != SCHEMA:
            raise EpisodeError(f"{where}: 'schema' must be {SCHEMA!r} (got {data.get('schema')!r})")
        version = data.get("schema_version")
        if not isinstance(version, int) or version < 1:
            raise EpisodeError(f"{where}: 'schema_version' must be a positive integer (got {version!r})")
        if version > SCHEMA_VERSION:
            raise EpisodeError(
                f"{where}: schema_version {version} is newer than this lingbot-isaac reads "
                f"({SCHEMA_VERSION}); upgrade lingbot-isaac"
            )
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        resolution = kwargs.get("source_resolution")
        valid = isinstance(resolution, list) and len(resolution) == 2
        if not (valid and all(isinstance(v, int) and v > 0 for v in resolution)):
            raise EpisodeError(f"{where}: 'source_resolution' must be [height, width] (got {resolution!r})")
        kwargs["source_resolution"] = (resolution[0], resolution[1])
        return cls(**kwargs)


@dataclass
class Episode:
    """An episode folder, read and validated. Poses/intrinsics are float32 as stored."""

    path: Path
    poses: np.ndarray  # [N, 4, 4] OpenCV camera-to-world, metres
    intrinsics: np.ndarray  # [N, 4] fx, fy, cx, cy for a 480x832 frame
    image_path: Path
    prompt: str
    meta: EpisodeMeta | None  # None for plain LingBot folders (no episode.json)

    @property
    def frame_count(self) -> int:
        return int(self.poses.shape[0])

    def image(self) -> np.ndarray:
        """The first frame, uint8 RGB [H, W, 3]."""
        with Image.open(self.image_path) as img:
            return np.asarray(img.convert("RGB"))

    @property
    def sim_frames_path(self) -> Path | None:
        """`sim.mp4` or the `frames/` folder when the episode carries sim frames."""
        for name in (SIM_VIDEO, SIM_FRAMES_DIR):
            if (self.path / name).exists():
                return self.path / name
        return None

    def sim_frame_files(self) -> list[Path]:
        """The image files of `frames/` in order (empty when there is no frames folder)."""
        folder = self.path / SIM_FRAMES_DIR
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def lingbot_intrinsics(intrinsics: np.ndarray, height: int, width: int) -> np.ndarray:
    """Rescale fx, fy, cx, cy from pixels of a height x width image to the 480x832 frame."""
    scale = np.array([LINGBOT_WIDTH / width, LINGBOT_HEIGHT / height] * 2)
    return np.asarray(intrinsics, dtype=np.float64) * scale


def source_intrinsics(intrinsics: np.ndarray, height: int, width: int) -> np.ndarray:
    """Inverse of `lingbot_intrinsics`: from the 480x832 frame back to height x width pixels."""
    scale = np.array([width / LINGBOT_WIDTH, height / LINGBOT_HEIGHT] * 2)
    return np.asarray(intrinsics, dtype=np.float64) * scale


def check_poses(poses: np.ndarray, where: str = "poses") -> np.ndarray:
    """Validate [N, 4, 4] rigid camera-to-world matrices; return them as float64."""
    poses = np.asarray(poses)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or poses.shape[0] < 1:
        raise EpisodeError(f"{where}: need camera-to-world matrices of shape [N, 4, 4] (got {poses.shape})")
    poses = poses.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(poses).all(axis=(1, 2)))
    if bad.size:
        raise EpisodeError(f"{where}: frame {bad[0]} has a non-finite value")
    bottom = np.abs(poses[:, 3] - [0, 0, 0, 1]).max(axis=1)
    bad = np.flatnonzero(bottom > 1e-6)
    if bad.size:
        row = poses[bad[0], 3].tolist()
        raise EpisodeError(f"{where}: frame {bad[0]} last row is {row}, need [0, 0, 0, 1]")
    rot = poses[:, :3, :3]
    error = np.abs(rot @ rot.transpose(0, 2, 1) - np.eye(3)).max(axis=(1, 2))
    bad = np.flatnonzero((error > ROTATION_TOLERANCE) | (np.linalg.det(rot) < 0))
    if bad.size:
        raise EpisodeError(
            f"{where}: frame {bad[0]} rotation is not a proper rotation (orthonormality error "
            f"{error[bad[0]]:.2e}); remove scale/shear/mirroring from the camera pose"
        )
    return poses


def check_intrinsics(intrinsics: np.ndarray, count: int, where: str = "intrinsics") -> np.ndarray:
    """Validate [N, 4] (or [4], broadcast) positive-focal intrinsics; return [count, 4] float64."""
    intrinsics = np.asarray(intrinsics, dtype=np.float64)
    if intrinsics.shape == (4,):
        intrinsics = np.tile(intrinsics, (count, 1))
    if intrinsics.shape != (count, 4):
        raise EpisodeError(
            f"{where}: need fx, fy, cx, cy of shape [{count}, 4] or [4] (got {intrinsics.shape})"
        )
    if not np.all(np.isfinite(intrinsics)):
        raise EpisodeError(f"{where}: values must be finite")
    if np.any(intrinsics[:, :2] <= 0):
        raise EpisodeError(f"{where}: focal lengths fx, fy must be > 0")
    return intrinsics


def _image_rgb(image: np.ndarray | Image.Image | bytes | os.PathLike | str) -> Image.Image:
    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as img:
                return img.convert("RGB")
        except (OSError, ValueError) as exc:
            raise EpisodeError(f"{image}: not a readable image ({exc})") from None
    if isinstance(image, bytes):
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


def _write_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


def write_episode(
    directory: os.PathLike | str,
    poses: np.ndarray,
    intrinsics: np.ndarray,
    image: np.ndarray | Image.Image | bytes | os.PathLike | str,
    prompt: str,
    meta: EpisodeMeta,
    sim_frames: np.ndarray | Sequence[np.ndarray] | os.PathLike | str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an episode folder atomically and return its path.

    `poses`: [N, 4, 4] OpenCV camera-to-world in metres. `intrinsics`: [N, 4] or [4] fx, fy, cx, cy
    in pixels of `meta.source_resolution` (H, W): they are rescaled to the 480x832 convention for
    `intrinsics.npy` and frame 0 is kept as-is in `episode.json`. `image`: the first frame at the
    source resolution (array, PIL image, encoded bytes or a file). `sim_frames`: optional frames
    [N, H, W, 3] uint8 (written to `frames/` as JPEG), or a path to an .mp4 (copied to `sim.mp4`)
    or to a folder of images (copied to `frames/`).
    """
    directory = Path(directory)
    poses = check_poses(poses)
    count = poses.shape[0]
    intrinsics = check_intrinsics(intrinsics, count)
    if not isinstance(prompt, str) or not prompt.strip():
        raise EpisodeError("prompt: must be a non-empty text describing the scene and the motion")
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
    staging.mkdir()
    try:
        _write_npy(staging / "poses.npy", poses.astype(np.float32))
        lingbot = lingbot_intrinsics(intrinsics, height, width)
        _write_npy(staging / "intrinsics.npy", lingbot.astype(np.float32))
        picture.save(staging / "image.jpg", quality=JPEG_QUALITY, subsampling=0)  # 4:4:4: keep chroma
        (staging / "prompt.txt").write_text(prompt.strip() + "\n", encoding="utf-8")
        meta.sim_frames = _write_sim_frames(staging, sim_frames, count, (height, width))
        (staging / "episode.json").write_text(
            json.dumps(meta.to_json(count), indent=1) + "\n", encoding="utf-8"
        )
        _swap_into_place(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _write_sim_frames(staging: Path, sim_frames, count: int, resolution: tuple[int, int]) -> str | None:
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


def _swap_into_place(staging: Path, directory: Path) -> None:
    """Rename the finished staging folder to `directory`, replacing an old one."""
    if not directory.exists():
        os.replace(staging, directory)
        return
    old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(directory, old)
    try:
        os.replace(staging, directory)
    except BaseException:
        os.replace(old, directory)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise EpisodeError(
            f"{path}: missing (an episode folder needs poses.npy, intrinsics.npy, image.jpg, prompt.txt)"
        )
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise EpisodeError(f"{path}: not a readable .npy array ({exc})") from None


def read_episode(directory: os.PathLike | str) -> Episode:
    """Read and validate an episode folder (ours, or a plain LingBot-World example folder)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise EpisodeError(f"{directory}: not a folder (expected an episode folder)")
    poses = _load_npy(directory / "poses.npy")
    check_poses(poses, where=str(directory / "poses.npy"))
    count = poses.shape[0]
    intrinsics = _load_npy(directory / "intrinsics.npy")
    check_intrinsics(intrinsics, count, where=str(directory / "intrinsics.npy"))
    if intrinsics.ndim == 1:
        where = directory / "intrinsics.npy"
        raise EpisodeError(f"{where}: need shape [{count}, 4] (got {intrinsics.shape})")
    image_path = next((directory / n for n in IMAGE_NAMES if (directory / n).is_file()), None)
    if image_path is None:
        raise EpisodeError(f"{directory}: missing image.jpg (or image.png), the first frame")
    prompt_path = directory / "prompt.txt"
    if not prompt_path.is_file():
        raise EpisodeError(f"{prompt_path}: missing (the text prompt)")
    prompt = prompt_path.read_text(encoding="utf-8").strip()
    if not prompt:
        raise EpisodeError(f"{prompt_path}: empty; write a prompt describing the scene and the motion")

    meta = None
    meta_path = directory / "episode.json"
    if meta_path.is_file():
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise EpisodeError(f"{meta_path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise EpisodeError(f"{meta_path}: must hold a JSON object")
        meta = EpisodeMeta.from_json(data, str(meta_path))
        if data.get("frame_count") != count:
            stored = data.get("frame_count")
            raise EpisodeError(f"{meta_path}: frame_count {stored} but poses.npy has {count}")
        if meta.sim_times is not None and len(meta.sim_times) != count:
            raise EpisodeError(f"{meta_path}: sim_times has {len(meta.sim_times)} entries for {count} poses")
        with Image.open(image_path) as img:
            size = img.size
        if size != (meta.source_resolution[1], meta.source_resolution[0]):
            raise EpisodeError(
                f"{image_path}: is {size[0]}x{size[1]} but {meta_path.name} says source_resolution "
                f"{meta.source_resolution[1]}x{meta.source_resolution[0]} (W x H)"
            )
    return Episode(
        path=directory, poses=poses, intrinsics=intrinsics, image_path=image_path, prompt=prompt, meta=meta
    )


def is_episode_dir(path: os.PathLike | str) -> bool:
    """Cheap check: does the folder look like an episode (poses.npy and intrinsics.npy)?"""
    path = Path(path)
    return path.is_dir() and (path / "poses.npy").is_file() and (path / "intrinsics.npy").is_file()
