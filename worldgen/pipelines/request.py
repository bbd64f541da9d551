"""What a request will really generate: the reference's frame and size rules.

Their one home is `contracts.generation_request` (the server's door applies them too, without
worldgen); the engine imports them from here.
"""

from contracts.generation_request import (
    MIN_FRAMES,
    PATCH,
    VAE_STRIDE,
    ResolvedRequest,
    frames_4n1,
    frames_covered,
    latent_size,
    resolve_request,
    smallest_size,
)

__all__ = [
    "MIN_FRAMES",
    "PATCH",
    "VAE_STRIDE",
    "ResolvedRequest",
    "frames_4n1",
    "frames_covered",
    "latent_size",
    "resolve_request",
    "smallest_size",
]
