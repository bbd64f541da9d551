"""The conditioning video of an image-to-video rollout: the image, then black frames, encoded by the VAE push by
push (`StreamingEncoder`: the same latents as encoding the whole video at once, over the same tiles).

Its own module because of what a black tail allows: once a push of black frames leaves every causal cache of
the encoder as it was (`StreamingEncoder.still`), every later push of black frames gives that push's latent
frame again, bit for bit (the same numbers from the same caches), so the rest is filled in without the VAE and
its caches are freed at once. With the Wan2.1 VAE that happens by frame 117 whatever the weights (the image has
left every layer's cached frames; sooner where its trace rounds away): a 361-frame video encodes at most 129 of
its frames in 16-frame pushes, not 361 (chunk 1 of a 361-frame 1.3B rollout spent 4.9 s encoding them,
docs/benchmarks.md, "Session 31"; not yet measured with this). One home for the batch
plan's encode before the loop (`Pipeline.condition`) and the chunk loop's (`fast_conditioning.ChunkConditioning`).
"""

from __future__ import annotations

import torch

from worldgen.models.vae import WanVAE
from worldgen.models.vae_tiling import StreamingEncoder, encode_per_tile

PUSH_FRAMES = 16  # frames a push of `encode_conditioning` (after the image): a v2 chunk's, the encode's transients


class ImageThenBlack:
    """`push(count)`: the latents of the conditioning video's next `count` frames (the first push holds the image
    and 4k frames after it; later pushes 4k black frames), float32 [1, 16, t, h/8, w/8] on the CPU."""

    def __init__(self, vae: WanVAE, image: torch.Tensor, tile_pixels: int | None, device: torch.device):
        self.image, self.device = image, device  # image [3, 1, H, W] in [-1, 1]
        self.encoder: StreamingEncoder | None = StreamingEncoder(vae, tile_pixels)
        self.pushed = 0
        self.repeat: torch.Tensor | None = None  # [1, 16, 1, h, w]: every latent frame from here on
        self.frames_encoded = 0  # frames that went through the VAE (the rest repeated)

    @property
    def settled(self) -> bool:
        """Whether the rest is known without the VAE (its caches freed)."""
        return self.repeat is not None

    def push(self, count: int) -> torch.Tensor:
        first, self.pushed = self.pushed, self.pushed + count
        if self.repeat is not None:
            return self.repeat.expand(-1, -1, count // 4, -1, -1)
        video = torch.zeros(1, 3, count, *self.image.shape[-2:], device=self.device)
        if first == 0:
            video[0, :, :1] = self.image.to(self.device)
        latent = self.encoder.push(video).float().cpu()
        self.frames_encoded += count
        if first > 0 and self.encoder.still:  # black frames from the same caches: the same latent from now on
            self.repeat = latent[:, :, -1:].clone()
            self.encoder = None
        return latent

    def close(self) -> None:
        """Free the encoder's caches (no frame left to push)."""
        self.encoder = None


def encode_conditioning(
    vae: WanVAE, image: torch.Tensor, frames: int, tile_pixels: int | None, device: torch.device
) -> torch.Tensor:
    """The latents [1, 16, lat_f, h/8, w/8] (float32, CPU) of the whole conditioning video, `image` [3, 1, H, W] then
    `frames - 1` black frames, over the encoder's spatial tiles one after the other (one tile's caches on the device
    at a time, as `encode_tiled` runs; never the whole video): `encode_tiled`'s numbers, the black tail past each
    tile's settling without the VAE."""

    def one_tile(pixels: torch.Tensor) -> torch.Tensor:  # the image's tile [1, 3, 1, th, tw]
        video = ImageThenBlack(vae, pixels[0], None, device)
        pushes = [1] + [min(PUSH_FRAMES, frames - start) for start in range(1, frames, PUSH_FRAMES)]
        return torch.cat([video.push(count) for count in pushes], dim=2)

    return encode_per_tile(one_tile, image[None], tile_pixels)
