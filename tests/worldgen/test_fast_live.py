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
from worldgen.pipelines.fast_live import LiveCamera, largest_step, live_chunk_camera, live_frames, poses_needed

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


def live_camera_chunks(poses: np.ndarray, frame_num: int, scale: float | None = None) -> list[torch.Tensor]:
    """The chunks a LiveCamera makes as the poses arrive (each chunk sees only the poses held by then)."""
    frames = live_frames(frame_num)
    camera = LiveCamera(lambda need: poses[:need], K, frames, H, W, translation_scale=scale)
    return [camera(c) for c in range(frames.latent_frames // 3)]


def test_a_path_that_speeds_up_keeps_its_first_chunks_scale_in_every_chunk():
    frame_num = 33
    poses = path(frame_num, lambda t: t**2)  # accelerating: the batch job's own scale comes from the last chunk
    frames = live_frames(frame_num)
    first = largest_step(poses, frames, 0)
    assert largest_step(poses, frames, 2) > 2 * first  # the fastest step comes late
    live = live_camera_chunks(poses, frame_num)
    # every chunk at the job's one scale: the batch camera of the same poses given that scale, bit for bit
    held = fast_camera(poses, K, frames, H, W, translation_scale=first)
    for c, chunk in enumerate(live):
        assert torch.equal(chunk, held[:, :, 3 * c : 3 * c + 3]), f"chunk {c}"
    assert not torch.equal(live[0], batch_chunks(poses, frame_num)[0])  # the batch job's own scale differs
    # the late, faster steps are rendered faster than the first chunk's: above 1 (ray origins: channels 0-2)
    assert float(live[2][0, :3].abs().max()) > 1.5


@pytest.mark.parametrize("scale", [0.01, 0.05, 3.0])
def test_live_and_batch_given_the_same_scale_make_the_same_camera(scale):
    for speed in (np.sqrt, lambda t: t**2):
        poses = path(33, speed)
        live = live_camera_chunks(poses, 33, scale)
        batch = fast_camera(poses, K, live_frames(33), H, W, translation_scale=scale)
        assert torch.equal(torch.cat(live, dim=2), batch)


def test_a_path_standing_still_first_takes_its_scale_from_the_first_chunk_that_moves():
    poses = path(33, lambda t: t**2)
    poses[:9] = poses[0]  # still for chunk 0 (poses 0-8), then accelerating
    frames = live_frames(33)
    assert float(largest_step(poses, frames, 0)) == 0.0
    camera = LiveCamera(lambda need: poses[:need], K, frames, H, W)
    chunks = [camera(c) for c in range(3)]
    assert float(camera.scale) == float(largest_step(poses, frames, 1))  # chunk 1 moves first: its scale, held
    held = fast_camera(poses, K, frames, H, W, translation_scale=camera.scale)
    assert torch.equal(torch.cat(chunks, dim=2), held)


def test_a_chunk_without_its_poses_is_refused():
    frames = live_frames(33)
    with pytest.raises(InputError, match="chunk 1 needs 21 poses"):
        live_chunk_camera(path(20, np.sqrt), K, frames, 1, H, W)


@pytest.mark.parametrize("ready_after", [0, 2, None])
def test_a_live_jobs_conditioning_stops_encoding_ahead_once_chunk_0s_poses_are_there(ready_after):
    """`ChunkConditioning(whole_first=True, ready=LiveCamera.ready)`: chunk 0 encodes its own frames, then more of
    them, a chunk's at a time, only until `ready(0)` says chunk 0's poses are all there; chunk 1 encodes the rest.
    Every chunk's y is the whole-at-chunk-0 one's, bit for bit (the same pushes in the same order). The tiny
    LingBot-World 2.0 model on the CPU, 49 frames: 13 for chunk 0, then 3 pushes of 16."""
    from worldgen.pipelines.fast_conditioning import ChunkConditioning
    from worldgen.pipelines.loader import load_pipeline
    from worldgen.runtime.metering import LapClock

    pipe = load_pipeline("tiny-v2", device="cpu", model="fast")
    image = torch.rand(3, 1, 32, 48, generator=torch.Generator().manual_seed(0)) * 2 - 1  # prepare_image's [3, 1, H, W]
    clock, quiet = LapClock(pipe.device), lambda *a: None

    def conditioning(**live) -> ChunkConditioning:
        return ChunkConditioning(pipe, image, 49, 4, clock, quiet, whole_first=True, **live)

    whole = conditioning()
    want = [whole(c) for c in range(4)]
    assert whole.video.encoder is None and whole.encoded == 49  # every frame at chunk 0
    asked: list[int] = []

    def ready(chunk: int) -> bool:
        asked.append(chunk)
        return ready_after is not None and len(asked) > ready_after

    live = conditioning(ready=ready)
    assert torch.equal(live(0), want[0])
    if ready_after is None:  # the poses never came while it encoded: every frame, as without `ready`
        assert live.video.encoder is None and live.encoded == 49 and asked == [0, 0, 0]
    else:  # chunk 0's own 13 frames, then one push of 16 for each time the poses were not there yet
        assert live.video.encoder is not None and live.encoded == 13 + 16 * ready_after and set(asked) == {0}
    assert torch.equal(live(1), want[1]) and live.video.encoder is None and live.encoded == 49
    assert all(torch.equal(live(c), want[c]) for c in (2, 3))


def test_a_live_camera_says_whether_a_chunks_poses_are_there_without_waiting():
    frames = live_frames(33)
    need = poses_needed(frames, 0)
    for held, ready in ((need, True), (need - 1, False)):
        camera = LiveCamera(lambda count: pytest.fail("ready() waited"), K, frames, H, W, held=lambda h=held: h)
        assert camera.ready(0) is ready and not camera.ready(1)
    assert not LiveCamera(lambda count: None, K, frames, H, W).ready(0)  # nothing says how many: not ready
