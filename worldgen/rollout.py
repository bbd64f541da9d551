"""One rollout from an action folder (the LingBot-World example layout, or our episode folder).

The folder holds `poses.npy`, `intrinsics.npy`, `image.jpg` (or `.png`) and `prompt.txt`.
"""

from __future__ import annotations

from pathlib import Path

from contracts import episode
from contracts.settings import GenerationSettings
from worldgen.camera import load_action
from worldgen.errors import InputError
from worldgen.pipeline import Pipeline, Progress
from worldgen.video_out import write_mp4


def find_image(folder: Path) -> Path:
    try:
        return episode.find_image(folder)
    except episode.EpisodeError as exc:
        raise InputError(str(exc)) from None


def read_prompt(folder: Path) -> str:
    try:
        return episode.read_prompt(folder)
    except episode.EpisodeError as exc:
        raise InputError(f"{exc} (or pass --prompt)") from None


def generate_episode(
    pipe: Pipeline,
    episode_dir: Path | str,
    settings: GenerationSettings,
    output_path: Path | str,
    progress: Progress | None = None,
    prompt: str | None = None,
    on_chunk=None,
) -> Path:
    """Generate the rollout of an action/episode folder and write it as an mp4 (atomically).

    `on_chunk(i, n, frames [3, f, H, W])` sees each finished chunk (Fast pipelines only)."""
    folder = Path(episode_dir)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (expected poses.npy, intrinsics.npy, image.jpg, prompt.txt)")
    poses, intrinsics = load_action(folder)
    extra = {} if on_chunk is None else {"on_chunk": on_chunk}
    video = pipe.generate(
        find_image(folder), prompt or read_prompt(folder), poses, intrinsics, settings, progress=progress, **extra
    )
    if progress:
        progress("write", 0, 1)
    path = write_mp4(video, output_path, fps=settings.fps)
    if progress:
        progress("write", 1, 1)
    return path
