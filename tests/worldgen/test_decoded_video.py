"""A caller that only writes the mp4 (`generate`, the worker) gets a causal rollout's chunks kept as the mp4's uint8
frames: the same frames the float32 video gives, a quarter of its memory (a 349-frame video at 464x832: 1.67 GB)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from worldgen.pipelines.decoded_video import DecodedVideo
from worldgen.video_out import frames_shape, mp4_frames, to_uint8_frames


def test_chunks_kept_as_mp4_frames_are_the_float_videos_frames():
    torch.manual_seed(0)
    pieces = [torch.rand(3, f, 8, 12) * 2.2 - 1.1 for f in (9, 12, 12)]  # beyond [-1, 1] too: clamped alike
    floats, kept = DecodedVideo(33), DecodedVideo(33, frames_first=True)
    for i, piece in enumerate(pieces):
        floats.put(i, piece)
        kept.put(i, mp4_frames(piece))
    kept.put(1, mp4_frames(pieces[1]))  # a chunk put again (decoded after the loop): in its place
    video = kept.video()
    assert video.dtype == torch.uint8 and tuple(video.shape) == (33, 8, 12, 3)
    assert np.array_equal(video.numpy(), to_uint8_frames(floats.video()))
    assert frames_shape(video) == frames_shape(floats.video()) == (33, 8, 12)
    short = DecodedVideo(33, frames_first=True)  # a live job that ended after its first chunk
    short.put(0, mp4_frames(pieces[0]))
    assert tuple(short.video().shape) == (9, 8, 12, 3) and short.video().is_contiguous()


def test_a_tiny_fast_rollout_kept_as_mp4_frames_writes_the_same_frames(lingbot_examples):
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.loader import load_pipeline
    from worldgen.rollout import mp4_only

    pipe = load_pipeline("tiny", device="cpu", model="fast")
    example = lingbot_examples / "00"
    settings = GenerationSettings(size="32*48", frame_num=21, seed=3)
    args = ("a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"), settings)
    chunks = []
    kept = pipe.generate(example / "image.jpg", *args, on_chunk=lambda i, n, f: chunks.append(f), **mp4_only(pipe))
    video = pipe.generate(example / "image.jpg", *args)
    assert np.array_equal(kept.numpy(), to_uint8_frames(video))
    # the chunks handed out (to the chunk files) are as kept: made before the copy to the host, not again after it
    assert all(c.dtype == torch.uint8 and c.shape[-1] == 3 for c in chunks) and torch.equal(torch.cat(chunks), kept)


class _FailingCopy(torch.Tensor):
    """A chunk whose copy into the video fails (a full disk's swap, say), noting the thread it failed in."""

    threads: list[threading.Thread] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            cls.threads.append(threading.current_thread())
            raise ValueError("no room for chunk")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_writes_on_a_thread_of_their_own_give_the_same_video_and_raise_in_the_callers_thread():
    """A GPU job's copies run beside the chunk loop (`background`): the same frames in the same places, a chunk put
    again in its place; `video` waits for them; a write that fails is raised in the caller's thread."""
    torch.manual_seed(1)
    pieces = [torch.rand(3, f, 8, 12) * 2 - 1 for f in (9, 12, 12)]
    for keep in (None, mp4_frames):
        kept = [piece if keep is None else keep(piece) for piece in pieces]
        first = keep is not None
        here, beside = DecodedVideo(33, frames_first=first), DecodedVideo(33, frames_first=first, background=True)
        for i, piece in enumerate(kept):
            here.put(i, piece)
            beside.put(i, piece)
        assert len(beside) == 3  # counted as put, written or not
        beside.put(1, kept[1] * 0)  # put again: its place, after the first write of it
        here.put(1, kept[1] * 0)
        assert torch.equal(beside.video(), here.video())
    broken = DecodedVideo(33, background=True)
    broken.put(0, pieces[0].as_subclass(_FailingCopy))
    with pytest.raises(ValueError, match="no room"):
        broken.flush()
    assert _FailingCopy.threads and _FailingCopy.threads[0] is not threading.current_thread()
    broken.put(1, pieces[1].as_subclass(_FailingCopy))  # the next put raises it too, if it failed by then
    with pytest.raises(ValueError, match="no room"):
        broken.video()


def test_a_sink_takes_each_chunk_once_in_order_and_nothing_is_held():
    """`sink` (an mp4 written as the chunks come): each chunk goes there once, in order, on the writer's thread for a
    GPU job; one put again (`ChunkDecodes.finish`'s decode after an out-of-memory one: the same frames) goes nowhere;
    the video keeps the frames' size and none of them; a sink that fails is raised in the caller's thread."""
    torch.manual_seed(2)
    kept = [mp4_frames(torch.rand(3, f, 8, 12) * 2 - 1) for f in (9, 12, 12)]
    for background in (False, True):
        sunk, threads = [], []

        def sink(piece: torch.Tensor, sunk=sunk, threads=threads) -> None:
            sunk.append(piece)
            threads.append(threading.current_thread())

        video = DecodedVideo(33, frames_first=True, background=background, sink=sink)
        for i, piece in enumerate(kept):
            video.put(i, piece)
        video.put(1, kept[1])
        held = video.video()
        assert [p.data_ptr() for p in sunk] == [p.data_ptr() for p in kept]
        assert tuple(held.shape) == (0, 8, 12, 3) and held.dtype == torch.uint8 and len(video) == 3
        assert all((t is threading.current_thread()) != background for t in threads)

    def full(piece: torch.Tensor) -> None:
        raise OSError("no space left for the mp4")

    broken = DecodedVideo(33, frames_first=True, background=True, sink=full)
    broken.put(0, kept[0])
    with pytest.raises(OSError, match="no space"):
        broken.video()


def test_a_tiny_fast_episode_streams_its_mp4_chunk_by_chunk_to_the_frames_of_the_whole_video(tmp_path):
    """`generate_episode` on a causal pipeline sends each chunk to the mp4 as it comes (`mp4_only` with a stream:
    nothing held): the file decodes to the frames of the video written at once, its record beside it first; a job
    that fails leaves neither."""
    import shutil

    from contracts.provenance import read_record
    from contracts.settings import GenerationSettings
    from contracts.video import read_mp4, write_mp4
    from tests.conftest import REPO
    from worldgen.pipelines.loader import load_pipeline
    from worldgen.rollout import generate_episode, mp4_only

    episode = shutil.copytree(REPO / "data" / "sample_room", tmp_path / "ep")
    pipe = load_pipeline("tiny", device="cpu", model="fast")
    settings = GenerationSettings(model="fast", size="32*48", frame_num=21, seed=3)
    streamed = generate_episode(pipe, episode, settings, tmp_path / "streamed.mp4")
    whole = pipe.generate(episode / "image.jpg", (episode / "prompt.txt").read_text().strip(), *_action(episode),
                          settings, **mp4_only(pipe))  # fmt: skip
    at_once = write_mp4(tmp_path / "at_once.mp4", whole.numpy(), fps=settings.fps)
    assert np.array_equal(read_mp4(streamed)[0], read_mp4(at_once)[0])
    record, _ = read_record(streamed)
    assert record["settings"]["frame_num"] == whole.shape[0] == 21  # the frames made, as the record says
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("streamed")) == [
        "streamed.json", "streamed.mp4"
    ]  # fmt: skip

    def broken(*args, **kwargs):  # the job fails after its chunks began going to the mp4
        for _ in range(2):
            kwargs["sink"](torch.zeros(4, 32, 48, 3, dtype=torch.uint8))
        raise RuntimeError("the GPU fell off the bus")

    pipe.generate = broken
    with pytest.raises(RuntimeError, match="fell off"):
        generate_episode(pipe, episode, settings, tmp_path / "failed.mp4")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("failed")]


def _action(episode):
    from worldgen.pipelines.camera import load_action

    return load_action(episode)
