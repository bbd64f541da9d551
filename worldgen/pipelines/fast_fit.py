"""Fitting a Fast job's chunk loop into a VRAM budget: which KV cache and which VAE cut, whether the decode may run
beside the forwards, and what the loop leaves unused (`FastPipeline.plan_job` decides with these).

Functions of the pipeline (its config, compute, ranks and plan), apart from it: `worldgen.pipelines.fast` is the chunk
loop; the budget's arithmetic is its own concern (`worldgen.pipelines.fast_plan` holds the figures it adds up).
"""

from __future__ import annotations

import dataclasses

import torch

from worldgen.models.kv_cache import CacheSpec
from worldgen.pipelines.fast_plan import (
    BLOCK_GRAPH_BYTES_PER_TOKEN,
    GRAPH_POOL_BYTES_PER_TOKEN,
    LOOP_MARGIN_GIB,
    StreamVAE,
    stream_vae_cuts,
)
from worldgen.runtime.memory import VAE_WEIGHTS_GIB, GiB, activation_gib


@dataclasses.dataclass(frozen=True)
class LoopFit:
    """A budget's fit of the chunk loop: the KV cache and why, the VAE's cut, whether conditioning frames encode
    chunk by chunk (`stream_encode`), and the GiB the loop leaves unused at its tightest (`left_gib`: chunk 0's first
    forward, the streamed encode beside the decoder, and the KV cache beside a decode)."""

    spec: CacheSpec
    why: str
    cut: StreamVAE
    stream_encode: bool
    left_gib: float

    def same_video(self, other: LoopFit) -> bool:
        """The same KV cache and cut: the same numbers (what another fit may change only where it keeps them)."""
        return (self.spec, self.cut) == (other.spec, other.cut)


def fit_loop(
    pipe, usable: float, chunk_tokens: int, height: int, width: int, cache_for, block_graphs: bool = False
) -> LoopFit:
    """Under a budget: for each way to cut frames, the KV cache that fits beside the DiT, the text
    keys/values, the streamed VAE and one chunk's activations (and, with `block_graphs`, their buffers
    and pool); keep the largest cache, then the cut that also lets conditioning frames stream, then the
    fewest tiles (faster, closest to the reference). The cuts counted at float32 first; only where none fits,
    those counted at bf16, and among them the same KV cache with every tile's caches on the device before one
    with them parked. Chunk 0 (its encode and first forward) holds the bf16 DiT that fp8/int8 shrink later."""
    cfg = pipe.dit_config
    fixed, cross = pipe.loop_fixed_gib(chunk_tokens)
    first_fixed = fixed + pipe.plan.expert_gib - pipe.dit_gib(chunk_tokens)
    act = activation_gib(pipe.rank_rows(chunk_tokens), pipe.dit_config.dim)
    kept = GRAPH_POOL_BYTES_PER_TOKEN * chunk_tokens / GiB if pipe.use_chunk_graphs else act
    keeps_forward = pipe.keeps_forward_activations()
    graphs = BLOCK_GRAPH_BYTES_PER_TOKEN * pipe.rank_rows(chunk_tokens) / GiB if block_graphs else 0.0

    def beside(*pushes: float) -> float:
        """The loop's transient peak: a VAE push after the forwards (eager, one stream), or beside
        a forward's activations (kept in a graph pool, or a decode on a second stream); the blocks'
        graphs beside either."""
        return graphs + (kept + max(pushes) if keeps_forward else max(act, *pushes))

    best, refusal = None, None
    # in bf16 (every tile's caches on the device, or parked in host memory) only where no float32 cut fits a cache
    families = [stream_vae_cuts(height, width)]
    if pipe.device.type == "cuda":
        families += [stream_vae_cuts(height, width, bf16=True) + stream_vae_cuts(height, width, parked=True)]
    for cut in (cut for cuts in families for cut in cuts):
        if best is not None and cut.bf16 and not best[1].cut.bf16:
            break
        room = usable - fixed - cut.decode_cache_gib - beside(cut.decode_push_gib)
        room += VAE_WEIGHTS_GIB / 2 if cut.bf16 else 0.0  # a bf16 cut's VAE is bf16: half its weights
        if pipe.ranks > 1 and pipe.vae_dtype == torch.bfloat16:  # split forwards waited on the link eager
            room += min(graphs, cut.bf16_saving_gib)  # ("Session 36"): their graphs may take the bf16 saving
        try:
            spec, why = cache_for(room)
        except ValueError as exc:
            refusal = refusal or exc
            continue
        # streamed conditioning: the encoder's caches live through chunk 0 (a one-chunk KV cache), the rest of the
        # frames encode beside the decoder's caches
        first_kv = spec.bytes(cfg.num_layers, pipe.cache_heads, cfg.head_dim, pipe.dtype) / GiB
        first_kv *= min(1.0, chunk_tokens / spec.capacity_tokens)
        if first_fixed + first_kv + act > usable:  # chunk 0's first forward, beside the bf16 DiT
            refusal = refusal or ValueError("chunk 0's first forward does not fit beside the bf16 DiT")
            continue
        with_encoder = first_fixed + first_kv + cut.encode_cache_gib + cut.decode_cache_gib
        stream_encode = with_encoder + beside(cut.decode_push_gib, cut.encode_push_gib) <= usable
        score = (spec.capacity_tokens, stream_encode, not cut.parked, -cut.tiles)
        if best is None or score > best[0]:  # and what the loop leaves unused
            left = room - spec.planned_bytes(cfg.num_layers, pipe.cache_heads, cfg.head_dim, pipe.dtype) / GiB
            left = min(left, usable - first_fixed - first_kv - act)
            if stream_encode:
                left = min(left, usable - with_encoder - beside(cut.decode_push_gib, cut.encode_push_gib))
            best = (score, LoopFit(spec, why, cut, stream_encode, left))
    if best is None:
        smallest = min(cut.decode_cache_gib + beside(cut.decode_push_gib) for cuts in families for cut in cuts)
        raise ValueError(
            f"{refusal}. At {height}x{width} the Fast DiT ({pipe.dit_gib(chunk_tokens):.1f} GiB), its text keys/values "
            f"({cross:.1f} GiB), the VAE ({VAE_WEIGHTS_GIB:.1f} GiB) with its smallest streamed cut and one "
            f"chunk's activations ({smallest:.1f} GiB) and a {LOOP_MARGIN_GIB:g} GiB margin leave no room for "
            f"a KV cache in {usable:.1f} usable GiB"
        )
    return best[1]


def overlap_fit(pipe, usable, chunk_tokens: int, height: int, width: int, cache_for, spec, cut) -> LoopFit | None:
    """Under a budget the decode overlap (on by default: `overlap_decode`) runs where it costs the job
    nothing: on CUDA beside a bf16 VAE (`keeps_forward_activations`), in a job whose chunks decode as they come with
    no camera slab freed for each decode, and with the same KV cache and cut once a decode's push is
    counted beside a forward's activations (and the blocks' graphs, where they run)."""
    if usable is None or not pipe.overlap_decode or pipe.decode_after_loop or pipe.camera_until_decode:
        return None
    pipe.overlap_trial = True
    try:
        if not pipe.keeps_forward_activations():
            return None
        fitted = fit_loop(pipe, usable, chunk_tokens, height, width, cache_for, pipe.block_graph_room)
    except ValueError:
        return None
    finally:
        pipe.overlap_trial = False
    return fitted if (fitted.spec, fitted.cut) == (spec, cut) else None
