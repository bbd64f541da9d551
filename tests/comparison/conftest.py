"""Rendered test scenes, made once per session (rendering is the slow part)."""

from __future__ import annotations

import numpy as np
import pytest

from comparison.reconstruction import ReconstructionConfig
from tests.comparison.scene import camera_path, render_frames

FRAMES = 17
# the whole-clip reconstruction in the report tests: two trials (to show their spread), fewer features
SMALL_SFM = ReconstructionConfig(trials=2, max_features=1024)
HEIGHT, WIDTH = 240, 416  # half of 480 x 832: the intrinsics are rescaled, as for any frame size


@pytest.fixture(scope="session")
def commanded_poses() -> np.ndarray:
    return camera_path(FRAMES)


@pytest.fixture(scope="session")
def rendered(commanded_poses) -> np.ndarray:
    """Frames along the commanded poses: what a perfect world model would produce."""
    return render_frames(commanded_poses, HEIGHT, WIDTH)


@pytest.fixture(scope="session")
def rendered_mirrored() -> np.ndarray:
    """Frames along a path that pans the other way: a rollout that ignored the camera command."""
    return render_frames(camera_path(FRAMES, pan=-1.0), HEIGHT, WIDTH)


@pytest.fixture(scope="session")
def report_case(tmp_path_factory, commanded_poses, rendered):
    """An episode with sim.mp4, a "rollout" at another size and length, and its report (tiny model).

    The rollout is the rendered clip shrunk to 320x176, with mild noise and 4 extra frames: a
    world model that followed the camera well, so the numbers must come out good.
    """
    import cv2

    from comparison.report import compare_episode
    from comparison.video_io import write_video
    from tests.comparison.scene import write_episode

    root = tmp_path_factory.mktemp("report_case")
    episode = write_episode(root / "room_walk", commanded_poses, rendered)
    rng = np.random.default_rng(7)
    small = [cv2.resize(frame, (320, 176), interpolation=cv2.INTER_AREA) for frame in rendered]
    rollout = np.stack(small + small[-1:] * 4).astype(np.float64)
    rollout += rng.normal(0, 3, rollout.shape)
    rollout_mp4 = write_video(root / "rollout.mp4", np.clip(rollout, 0, 255).astype(np.uint8))
    settings = {"size": "176*320", "frame_num": FRAMES + 4, "steps": 4, "seed": 0}
    html_path = compare_episode(
        episode, rollout_mp4, root / "report", model="tiny", settings=settings, timings={"generate_s": 1.5},
        reconstruction=SMALL_SFM,
    )  # fmt: skip
    return {"root": root, "episode": episode, "rollout": rollout_mp4, "html": html_path}
