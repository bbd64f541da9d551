"""One rollout from an action folder (the LingBot-World example layout, or our episode folder).

The folder holds `poses.npy`, `intrinsics.npy`, `image.jpg` (or `.png`) and `prompt.txt`.
"""

from __future__ import annotations

from pathlib import Path

from bridge.settings import GenerationSettings
from worldgen.camera import load_action
from worldgen.errors import InputError
from worldgen.pipeline import Pipeline, Progress
from worldgen.video_out import write_mp4

IMAGE_NAMES = ("image.jpg", "image.jpeg", "image.png")


def find_image(folder: Path) -> Path:
    for name in IMAGE_NAMES:
        if (folder / name).exists():
            return folder / name
    raise InputError(f"{folder}: no first-frame image (looked for {', '.join(IMAGE_NAMES)})")


def read_prompt(folder: Path) -> str:
    path = folder / "prompt.txt"
    if not path.exists():
        raise InputError(f"{path}: missing; write the scene description there (or pass --prompt)")
    prompt = path.read_text(encoding="utf-8").strip()
    if not prompt:
        raise InputError(f"{path}: is empty; write the scene description there (or pass --prompt)")
    return prompt


def generate_episode(
    pipe: Pipeline,
    episode_dir: Path | str,
    settings: GenerationSettings,
    output_path: Path | str,
    progress: Progress | None = None,
    prompt: str | None = None,
) -> Path:
    """Generate the rollout of an action/episode folder and write it as an mp4 (atomically)."""
    folder = Path(episode_dir)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (expected poses.npy, intrinsics.npy, image.jpg, prompt.txt)")
    poses, intrinsics = load_action(folder)
    video = pipe.generate(
        find_image(folder), prompt or read_prompt(folder), poses, intrinsics, settings, progress=progress
    )
    if progress:
        progress("write", 0, 1)
    path = write_mp4(video, output_path, fps=settings.fps)
    if progress:
        progress("write", 1, 1)
    return path
