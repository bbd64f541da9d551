"""The live rule of a Fast rollout (`worldgen.pipelines.fast_live`): which poses each chunk waits for,
and its camera against the batch job's (`fast_conditioning.fast_camera`), on paths where they must agree and one
where they must not. Pure numbers: no model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from worldgen.errors import InputError
from worldgen.pipelines.fast_conditioning import fast_camera
from worldgen.pipelines.fast_live import live_chunk_camera, live_frames, poses_needed

H, W = 48, 80
K = np.float32([[502.0, 502.0, 416.0, 240.0]])


def path(count: int, speed) -> np.ndarray:
    """A camera turning slowly while it moves forward along +z, `speed(t)` its position at t in [0, 1]."""
    t = np.linspace(0, 1, count)
    poses = np.tile(np.eye(4), (count, 1, 1))
    poses[:, :3, :3] = Rotation.from_euler("y", 20 * t[:, None], degrees=True).as_matrix()
    poses[:, 2, 3] = speed(t)
    poses[:, 0, 3] = 0.1 * np.sin(3 * t)
    return poses.astype(np.float32)


def batch_chunks(poses: np.ndarray, frame_num: int) -> list[torch.Tensor]:
    frames = live_frames(frame_num)
    plucker = fast_camera(poses, K, frames, H, W)
    return [plucker[:, :, 3 * c : 3 * c + 3] for c in range(frames.latent_frames // 3)]


@pytest.mark.filterwarnings("ignore:frame_num 41")  # 41 frames are not whole chunks: 33 are made (said once)
@pytest.mark.parametrize(("frame_num", "needed"), [(33, [9, 21, 33]), (57, [9, 21, 33, 45, 57]), (41, [11, 26, 41])])
def test_each_chunk_waits_for_the_poses_up_to_its_last_latent_frame(frame_num, needed):
    frames = live_frames(frame_num)
    assert [poses_needed(frames, c) for c in range(frames.latent_frames // 3)] == needed


@pytest.mark.filterwarnings("ignore:frame_num 41")
@pytest.mark.parametrize("frame_num", [33, 57, 41])
def test_a_path_at_its_top_speed_first_gets_the_batch_jobs_camera_bit_for_bit(frame_num):
    poses = path(frame_num, np.sqrt)  # decelerating: its largest latent step is in chunk 0
    frames = live_frames(frame_num)
    for c, batch in enumerate(batch_chunks(poses, frame_num)):
        held = poses[: poses_needed(frames, c)]  # only what the live job holds by then
        assert torch.equal(live_chunk_camera(held, K, frames, c, H, W), batch), f"chunk {c}"


def test_a_path_that_speeds_up_is_scaled_by_the_steps_seen_so_far_not_the_whole_paths():
    frame_num = 33
    poses = path(frame_num, lambda t: t**2)  # accelerating: the batch job's scale comes from the last chunk
    frames = live_frames(frame_num)
    batch = batch_chunks(poses, frame_num)
    live = [live_chunk_camera(poses[: poses_needed(frames, c)], K, frames, c, H, W) for c in range(3)]
    assert torch.equal(live[2], batch[2])  # the last chunk has seen the whole path
    assert not torch.equal(live[0], batch[0])  # chunk 0 cannot know the later, larger steps
    # the live rule never normalises past 1 (ray origins are the poses' positions: channels 0-2)
    assert all(float(chunk[0, :3].abs().max()) <= 1.0 + 1e-6 for chunk in live)


def test_a_chunk_without_its_poses_is_refused():
    frames = live_frames(33)
    with pytest.raises(InputError, match="chunk 1 needs 21 poses"):
        live_chunk_camera(path(20, np.sqrt), K, frames, 1, H, W)
