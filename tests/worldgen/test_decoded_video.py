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
