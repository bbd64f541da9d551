"""The causal models' chunk decodes beside the next chunk's forwards (`worldgen.pipelines.decode_overlap`): on by
default, one switch to turn it off, the same frames either way, and the record says whether it ran."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldgen.pipelines import decode_overlap


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False), ("no", False)])
def test_the_overlap_is_on_unless_its_one_switch_turns_it_off(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(decode_overlap.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(decode_overlap.ENV_SWITCH, value)
    assert decode_overlap.enabled_by_environment() is on
    from tests.worldgen.test_fast import _full_size_plan

    assert _full_size_plan(24).overlap_decode is on  # the pipeline's default follows the switch


def _generate(pipe, example, settings, **kwargs):
    return pipe.generate(
        example / "image.jpg", "a room", np.load(example / "poses.npy"), np.load(example / "intrinsics.npy"),
        settings, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_decode_overlap_gives_the_same_frames_and_the_record_says_whether_it_ran(
    lingbot_examples, device, monkeypatch
):
    """On CUDA chunks 1.. decode on a second stream: the same decoder, pushes and order, so the same frames bit
    for bit as decoding after each chunk's forwards; on the CPU there is no second stream (and the record says so)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the second stream)")
    from contracts.settings import GenerationSettings
    from worldgen.pipelines.loader import load_pipeline
    from worldgen.pipelines.request import resolve_request
    from worldgen.rollout import rollout_record

    pipe = load_pipeline("tiny", device=device, model="fast")
    example = lingbot_examples / "00"
    settings = GenerationSettings(size="32*48", frame_num=33, seed=3)  # 3 chunks: two decode beside a forward
    seen, priorities = [], []

    def on_chunk(i: int, _n: int, _frames: torch.Tensor) -> None:
        seen.append(i)
        if device == "cuda":  # the stream the loop runs on while the decodes run beside it
            priorities.append(torch.cuda.current_stream().priority)

    pipe.overlap_decode = True
    overlapped = _generate(pipe, example, settings, on_chunk=on_chunk)
    assert pipe.decode_overlapped is (device == "cuda") and seen == [0, 1, 2]
    if device == "cuda":  # a batch job's loop kernels go first (`loop_first`); the caller's stream is given back after
        side_priority = torch.cuda.Stream().priority
        assert len(priorities) == 3 and all(p < side_priority for p in priorities)
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
    record = rollout_record(
        pipe, settings, resolve_request(settings, (480, 832), 33), producer="generate", phases=[],
        video_shape=tuple(overlapped.shape[1:]),
    )  # fmt: skip
    assert record["compute"]["decode_overlap"] is (device == "cuda")
    if device == "cuda":
        assert sum(t["overlap"] for t in pipe.chunk_timings) > 0  # GPU seconds of decodes that ran beside forwards
    pipe.overlap_decode = False
    priorities.clear()
    serial = _generate(pipe, example, settings, on_chunk=on_chunk)
    assert not pipe.decode_overlapped
    assert all(p == torch.cuda.Stream().priority for p in priorities)  # no decode beside it: the caller's stream
    assert torch.equal(overlapped, serial)
    # a live job hands each chunk out before it waits for the next chunk's poses: every chunk, in order
    pipe.overlap_decode = True
    from worldgen.pipelines.fast_conditioning import fast_camera
    from worldgen.pipelines.fast_plan import FastOptions, fast_frames

    poses, intrinsics = np.load(example / "poses.npy"), np.load(example / "intrinsics.npy")
    n = FastOptions().chunk_frames
    plucker = fast_camera(poses, intrinsics, fast_frames(33, len(poses), n), *serial.shape[2:])
    handed = []

    def camera(c: int) -> torch.Tensor:
        handed.append(("camera", c))
        return plucker[:, :, c * n : (c + 1) * n]

    beside = []
    if device == "cuda":  # decodes launched beside the loop (the same decode, observed)
        launch = decode_overlap.PendingDecode.__init__

        def observed(self, decoder, latent, stream):
            beside.append(stream)
            launch(self, decoder, latent, stream)

        monkeypatch.setattr(decode_overlap.PendingDecode, "__init__", observed)
    live = pipe.generate(
        example / "image.jpg", "a room", None, None, settings, camera=camera,
        on_chunk=lambda i, _n, _frames: handed.append(("chunk", i)),
    )  # fmt: skip
    assert torch.equal(live, serial)
    # a live job decodes each chunk at once, alone on the GPU, even where the overlap is on: its pixels are what the
    # user waits for (beside the cache refresh they went out 0.08 s later: docs/benchmarks.md, "Session 34")
    assert beside == [] and not pipe.decode_overlapped
    # chunk c's frames are out before chunk c + 1's camera is asked for
    assert handed.index(("chunk", 0)) < handed.index(("camera", 1))
    assert handed.index(("chunk", 1)) < handed.index(("camera", 2))
