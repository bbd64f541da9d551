"""worldgen.video_out: a generated video tensor to uint8 frames, a few frames at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldgen import video_out


def test_frames_convert_as_the_whole_video_expression_and_the_input_is_left_alone():
    video = torch.randn(3, 2 * video_out.FRAMES_AT_ONCE + 3, 6, 10, generator=torch.Generator().manual_seed(0))
    before = video.clone()
    whole = ((video.clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()
    got = video_out.to_uint8_frames(video)
    assert got.shape == whole.shape and got.flags["C_CONTIGUOUS"]
    assert (got == whole).all()
    assert torch.equal(video, before)  # converted in place only in its own temporaries
    assert (video_out.to_uint8_frames(video.bfloat16()) == video_out.to_uint8_frames(video.bfloat16().float())).all()


@pytest.mark.cuda
def test_frames_made_on_the_gpu_are_the_cpus_bytes():
    """A causal rollout makes the mp4's frames on the GPU as it copies them (`mp4_frames`): the same bytes as on the
    CPU, the halves between two levels included (rounded to even on both)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    video = torch.randn(3, 2 * video_out.FRAMES_AT_ONCE + 1, 16, 24, generator=torch.Generator().manual_seed(1))
    video[:, 0] = (torch.arange(16 * 24 * 3).reshape(3, 16, 24) % 256) / 127.5 - 1.0 + 0.5 / 127.5  # x.5 levels
    for dtype in (torch.float32, torch.bfloat16):
        on_gpu = video_out.mp4_frames(video.to(dtype).cuda())  # made there, copied frame by frame to the host
        assert on_gpu.is_pinned() and on_gpu.dtype == torch.uint8 and on_gpu.is_contiguous()
        assert np.array_equal(on_gpu.numpy(), video_out.to_uint8_frames(video.to(dtype)))
    assert video_out.mp4_frames(on_gpu) is on_gpu  # frames already so are left as they are
