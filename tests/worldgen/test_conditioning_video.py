"""The conditioning video (an image, then black frames) pushed through the VAE (`conditioning_video.ImageThenBlack`):
the latents of encoding the whole video at once, bit for bit, with the black tail past the encoder's settling
filled in without the VAE. The Wan2.1 VAE's own depth (narrower, on the CPU): settled by frame 117."""

from __future__ import annotations

import dataclasses

import torch

from worldgen.models.vae import WanVAE
from worldgen.models.vae_config import WAN21_VAE
from worldgen.models.vae_tiling import StreamingEncoder, encode_tiled
from worldgen.pipelines.conditioning_video import ImageThenBlack, encode_conditioning

FRAMES = 161


def narrow_vae(seed: int) -> WanVAE:
    """The Wan2.1 VAE's layers and depth at 8 channels instead of 96, random weights."""
    torch.manual_seed(seed)
    vae = WanVAE(dataclasses.replace(WAN21_VAE, dim=8)).eval()
    for p in vae.parameters():
        p.data.normal_(0, 0.3)
    return vae


def conditioning(image: torch.Tensor, frames: int) -> torch.Tensor:
    video = torch.zeros(1, 3, frames, *image.shape[-2:])
    video[0, :, :1] = image
    return video


def test_the_black_tail_is_filled_in_once_the_encoder_settles_with_the_whole_videos_numbers():
    g = torch.Generator().manual_seed(1)
    for seed, tile in ((0, None), (1, 16 * 24)):  # whole frames; two tiles of a 16 x 40 frame
        vae = narrow_vae(seed)
        image = torch.rand(3, 1, 16, 40, generator=g) * 2 - 1
        with torch.no_grad():
            want = encode_tiled(vae, conditioning(image, FRAMES), tile)
            video = ImageThenBlack(vae, image, tile, torch.device("cpu"))
            pushes = [1] + [16] * 10
            got = torch.cat([video.push(count) for count in pushes], dim=2)
        assert got.shape == want.shape == (1, 16, 41, 2, 5)
        assert torch.equal(got, want)  # bit for bit, the repeated frames included
        # settled at the first push that left the caches as they were: at the latest the first push past frame 116,
        # where the image has left every cached frame whatever the weights (sooner where its trace rounds away)
        assert video.settled and video.encoder is None and video.frames_encoded <= 1 + 16 * 8
        tail = want[:, :, 29:]
        assert torch.equal(tail, want[:, :, 29:30].expand_as(tail)) and not torch.equal(want[:, :, 1], want[:, :, 2])


def test_a_push_that_changes_the_caches_is_not_still():
    vae = narrow_vae(2)
    encoder = StreamingEncoder(vae, None)
    image = conditioning(torch.rand(3, 1, 16, 16) * 2 - 1, 1)
    with torch.no_grad():
        encoder.push(image)
        assert not encoder.still  # every cache made
        encoder.push(torch.zeros(1, 3, 4, 16, 16))
        assert not encoder.still  # the image still in the cached frames
        encoder.push(torch.rand(1, 3, 4, 16, 16))
        assert not encoder.still


def test_the_whole_conditioning_one_tile_after_the_other_is_encode_tileds():
    """`Pipeline.condition`'s encode: each tile's conditioning pushed through its own stream, one tile at a time,
    the black tail past its settling filled in; the numbers of `encode_tiled` of the whole video."""
    vae = narrow_vae(3)
    image = torch.rand(3, 1, 16, 40, generator=torch.Generator().manual_seed(4)) * 2 - 1
    for tile in (None, 16 * 24):
        with torch.no_grad():
            want = encode_tiled(vae, conditioning(image, FRAMES), tile)
            got = encode_conditioning(vae, image, FRAMES, tile, torch.device("cpu"))
        assert got.shape == want.shape == (1, 16, 41, 2, 5) and torch.equal(got, want)
