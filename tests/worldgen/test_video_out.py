"""worldgen.video_out: a generated video tensor to uint8 frames, a few frames at a time."""

from __future__ import annotations

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
