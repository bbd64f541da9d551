"""A real photo as the rollout's first frame (`--first-frame PHOTO`), in place of the sim's render.

The sim-to-real question: what would the real camera see along this trajectory? The photo (taken
by the real camera at the episode's start pose) is fitted to the episode's frame exactly as a sim
image of that frame is used: centre-cropped to the frame's aspect ratio, then resized to the
frame (H x W, the sim render's size, so sim frames and the comparison stay valid). Its intrinsics
go through the same crop and scale:

    fx' = fx * W / cw,  fy' = fy * H / ch,  cx' = (cx - x0) * W / cw,  cy' = (cy - y0) * H / ch

for a crop of cw x ch pixels at (x0, y0). With `--photo-intrinsics fx,fy,cx,cy` (pixels of the
photo) these replace the sim camera's for every frame (a real camera does not follow the sim's
lens animation); without them the photo is taken to show the sim camera's field of view, and the
sim's intrinsics stay. What was used is recorded in episode.json (`extra.first_frame`).

numpy + Pillow only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from contracts.episode import EpisodeError, read_episode, write_episode
from contracts.model_frame import from_model_intrinsics


def parse_intrinsics(text: str | None) -> tuple[float, float, float, float] | None:
    """'fx,fy,cx,cy' (pixels of the photo) -> four positive-focal floats, or None."""
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4 or not all(np.isfinite(values)) or values[0] <= 0 or values[1] <= 0:
        raise EpisodeError(f"--photo-intrinsics must be fx,fy,cx,cy in pixels of the photo, fx, fy > 0 (got {text!r})")
    return values  # type: ignore[return-value]


def crop_box(size: tuple[int, int], height: int, width: int) -> tuple[int, int, int, int]:
    """(x0, y0, cw, ch): the largest centred crop of a (w, h) image with the aspect of width x height."""
    w, h = size
    if w * height > h * width:  # wider than the frame: crop the sides
        cw, ch = round(h * width / height), h
    else:  # taller: crop top and bottom
        cw, ch = w, round(w * height / width)
    return (w - cw) // 2, (h - ch) // 2, cw, ch


def fit_photo(
    photo: str | os.PathLike | Image.Image,
    height: int,
    width: int,
    intrinsics: tuple[float, float, float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """(uint8 RGB [height, width, 3], intrinsics in its pixels or None, what was done)."""
    if isinstance(photo, Image.Image):
        picture, name = photo, "image"
    else:
        try:
            with Image.open(photo) as opened:
                # Phone and camera JPEGs store their orientation in EXIF: apply it as viewers do.
                picture, name = ImageOps.exif_transpose(opened).convert("RGB"), str(photo)
        except (OSError, ValueError) as exc:
            raise EpisodeError(f"--first-frame {photo}: not a readable image ({exc})") from None
    picture = picture.convert("RGB")
    x0, y0, cw, ch = crop_box(picture.size, height, width)
    fitted = picture.resize((width, height), Image.Resampling.LANCZOS, box=(x0, y0, x0 + cw, y0 + ch))
    k = None
    if intrinsics is not None:
        fx, fy, cx, cy = intrinsics
        sx, sy = width / cw, height / ch
        k = np.array([fx * sx, fy * sy, (cx - x0) * sx, (cy - y0) * sy])
    info = {
        "source": "photo",
        "path": name,
        "photo_size": list(picture.size),
        "crop": [x0, y0, cw, ch],
        "size": [width, height],
        "intrinsics": "given (--photo-intrinsics), fitted like the image" if k is not None else "the sim camera's",
    }
    return np.asarray(fitted), k, info


def with_photo(
    episode_dir: str | os.PathLike,
    photo: str | os.PathLike,
    target: str | os.PathLike,
    photo_intrinsics: tuple[float, float, float, float] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `target`: the episode of `episode_dir` with the photo as its first frame (atomically).

    `target` may be `episode_dir` itself (an episode we exported: replaced whole) or a new folder.
    """
    episode = read_episode(episode_dir)
    if episode.meta is None:
        raise EpisodeError(
            f"{episode_dir}: a plain LingBot folder (no episode.json) has no sim frame size to fit the photo to; "
            "export it with lingbot-isaac first"
        )
    height, width = episode.meta.source_resolution
    image, k, info = fit_photo(photo, height, width, photo_intrinsics)
    intrinsics = from_model_intrinsics(episode.intrinsics, height, width) if k is None else k
    meta = episode.meta
    meta.extra = {**meta.extra, "first_frame": info}
    # In place (an episode we exported) the old folder is swapped out only once the new one is
    # complete, so its sim frames are still there to copy.
    in_place = Path(target).resolve() == Path(episode_dir).resolve()
    return write_episode(
        target,
        episode.poses,
        intrinsics,
        image,
        episode.prompt,
        meta,
        sim_frames=episode.sim_frames_path,
        overwrite=overwrite or in_place,
    )


def first_frame_record(episode) -> dict[str, Any]:
    """Which first frame a rollout starts from: the photo's record, or the episode's own image."""
    recorded = (episode.meta.extra.get("first_frame") if episode.meta else None) or {}
    return recorded or {"source": "episode", "path": str(episode.image_path)}


def describe_first_frame(record: dict[str, Any]) -> str:
    if record.get("source") == "photo":
        x0, y0, cw, ch = record["crop"]
        return (
            f"photo {record['path']} ({record['photo_size'][0]}x{record['photo_size'][1]}, crop {cw}x{ch} at "
            f"{x0},{y0} -> {record['size'][0]}x{record['size'][1]}; intrinsics: {record['intrinsics']})"
        )
    return f"the episode's own image ({record.get('path')})"
