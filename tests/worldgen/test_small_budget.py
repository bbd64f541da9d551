"""LingBot-World 2.0's 1.3B under an 8 GiB VRAM budget (beside Isaac Sim on a 24 GB card): the plan holds the
reference's window, decodes in bf16 with its tiles' caches parked in host memory (fewer of them under fp8 and int8,
whose 8-bit block weights replace the bf16 ones), and its arithmetic adds up."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from contracts.model_families import V2_FAST
from contracts.settings import load_settings
from worldgen.models.dit_config import DiTConfig
from worldgen.pipelines.fast_plan import FastOptions, StreamVAE, resident_dit_gib, stream_vae_cuts
from worldgen.runtime.memory import GiB, activation_gib

ONE_3B = {"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30}  # Wan2.1-1.3B: its config.json
ONE_3B_GIB = 3.18  # its bf16 weights with the camera layers: 1,709,502,016 parameters (counted on the meta device)


def _plan_1_3b(budget_gib: float | None, compute: str):
    """A FastPipeline with the 1.3B's full-size config under a budget: planning only, no model loaded."""
    from worldgen.models.dit_config import DiTConfig
    from worldgen.pipelines.fast import FastPipeline
    from worldgen.runtime.memory import plan_memory
    from worldgen.runtime.residency import ModelSlot

    plan = plan_memory(
        torch.device("cuda"), budget_gib, expert_gib=ONE_3B_GIB, checkpoint_kind="bf16", gpu_total_gib=24.0,
        width=ONE_3B["dim"],
    )  # fmt: skip
    unloaded = []
    vae = ModelSlot("VAE", lambda: None)
    vae.unload = lambda: unloaded.append(True)  # the VAE loaded in the other dtype is dropped (none here)
    empty = ModelSlot("none", lambda: None)
    pipe = FastPipeline(
        dit=empty, dit_config=DiTConfig(**ONE_3B), dtype=torch.bfloat16, tokenizer=None, text_encoder=empty, vae=vae,
        device=torch.device("cuda"), text_len=512, name="1.3B", plan=plan, family=V2_FAST, compute=compute,
        vae_dtype=torch.bfloat16 if compute in ("fp8", "int8") else torch.float32,
    )  # fmt: skip
    return pipe, unloaded


# the DiT through the chunk loop: exact's bf16 weights; fp8's and int8's blocks in 8 bits (1.56 GiB less)
LOOP_DIT_GIB = {"exact": ONE_3B_GIB, "fp8": 1.623, "int8": 1.623}
# the decoder's cut: exact's 6 tiles, a 2 x 3 grid of 264x320 pixels (2.2 GiB of caches, 5 tiles' 1.86 GiB parked;
# near-square tiles of the largest area that fit were 8 and 2.35 GiB parked); with the room fp8/int8 free, 2
# full-height strips of 464x448 (1.8 GiB of caches, one strip's 0.92 GiB parked: the fewest tiles, closest to the
# reference); no cut keeps every tile's caches on the device beside the reference's 18-frame window
# (`test_a_shorter_window_keeps_every_tiles_caches_on_the_device`)
TILES = {"exact": (6, 1.86), "fp8": (2, 0.92), "int8": (2, 0.92)}


def test_fp8_and_int8_count_the_1_3b_blocks_at_one_byte_a_weight():
    cfg = DiTConfig(**ONE_3B)
    block_linears = 30 * (12 * 1536 * 1536 + 2 * 1536 * 8960)  # q k v o twice, 4 camera layers; the feed-forward
    scales = 30 * (12 * 1536 + 8960 + 1536) * 4  # a float32 scale per output channel
    saved = (block_linears - scales) / GiB  # 2 bytes a weight down to 1
    for compute in ("fp8", "int8"):
        assert resident_dit_gib(ONE_3B_GIB, "bf16", compute, cfg, torch.bfloat16, 6032) == pytest.approx(
            ONE_3B_GIB - saved
        )
        assert resident_dit_gib(ONE_3B_GIB, "nf4", compute, cfg, torch.bfloat16, 6032) == ONE_3B_GIB  # NF4 kept
        assert resident_dit_gib(ONE_3B_GIB, "bf16", compute, cfg, torch.bfloat16, 200) == ONE_3B_GIB  # no 8-bit GEMM
    assert resident_dit_gib(ONE_3B_GIB, "bf16", "exact", cfg, torch.bfloat16, 6032) == ONE_3B_GIB
    assert LOOP_DIT_GIB["fp8"] == pytest.approx(ONE_3B_GIB - saved, abs=1e-3)


@pytest.mark.parametrize("compute", ["exact", "fp8", "int8"])
def test_the_1_3b_at_464x832_fits_8_gib_with_the_reference_window(compute):
    long = load_settings(preset="v2-fast-long")  # the reference's long video: 480*832, 18 latent frames, sink 6
    assert (long.size, long.attention_frames, long.sink_frames) == ("480*832", 18, 6)
    options = FastOptions.from_settings(long, 29 * 52, V2_FAST)
    pipe, unloaded = _plan_1_3b(8.0, compute)
    for latent_frames in (20, 88):  # 81 and 361 frames asked: 77 and 349 made
        spec = pipe.plan_job(latent_frames, 58, 104, options)
        # the reference's window, whole: 18 latent frames with its 6-frame sink, in FP8
        assert (spec.capacity_tokens, spec.sink_frames, spec.storage, spec.rolling) == (18 * 1508, 6, "fp8", True)
        cut = pipe.vae_cut
        assert cut.parked and pipe.vae_dtype == torch.bfloat16 and cut.tiles == TILES[compute][0]
        assert cut.host_gib == pytest.approx(TILES[compute][1], abs=0.01)
        assert pipe.dit_gib(4 * 1508) == pytest.approx(LOOP_DIT_GIB[compute], abs=1e-3)
        assert pipe.plan.stream_text_encoder and not pipe.plan.keep_text_encoder  # umT5 never resident on the GPU
        assert not pipe.stream_encode  # every frame encoded first
        # a decode beside the next chunk's forwards (its push counted beside their activations): room for it with
        # fp8's and int8's 8-bit blocks and two 464x448 strips, none with exact's bf16 DiT
        assert pipe.graph_room == (compute != "exact")
        # the loop's arithmetic, every part: under the 7.4 usable GiB (the budget less the CUDA context), and so
        # the peak allocated under 8 GiB
        cfg = pipe.dit_config
        kv = spec.planned_bytes(cfg.num_layers, cfg.num_heads, cfg.head_dim, torch.bfloat16) / GiB
        cross = 2 * 30 * 512 * 1536 * 2 / GiB
        act = activation_gib(4 * 1508, 1536)
        decoder = cut.decode_cache_gib + cut.decode_push_gib
        loop = LOOP_DIT_GIB[compute] + cross + 0.25 + kv + max(act, decoder) + 0.5
        assert loop <= pipe.plan.usable_gib == pytest.approx(7.4)
        assert 2.3 < kv < 2.6 and decoder < (0.9 if compute == "exact" else 2.2)
        # chunk 0's first forward beside the bf16 DiT (one not loaded when the job was planned makes its 8-bit
        # weights there, one Linear at a time) and a one-chunk cache: that fits too
        assert ONE_3B_GIB + cross + 0.25 + kv * 4 / 18 + act + 0.5 <= 7.4
        # the encode before the loop (a tile and 16 frames at a time): the DiT (bf16 here: not loaded when planned),
        # tiles whose peak in the VAE's dtype (bf16: half the float32 figures) fits the rest, whatever the video's
        # length: two strips, not the five 92k-pixel tiles of the float32 figures and the whole video counted
        # (Session 31's, 1.5-1.7 s of the first chunk)
        tile = pipe.encode_tile_pixels  # two 464x448 strips: as many as the largest tile that fits, less overlap
        assert tile == 464 * 448 and ONE_3B_GIB + 0.25 + 0.5 + 5 * tile / 386_048 <= 7.4
        plan = pipe.describe_plan()
        assert "18 latent frames" in plan and "6-frame attention sink" in plan
        assert f"{TILES[compute][0]} spatial tiles" in plan and "caches parked in host memory" in plan
        assert (f"blocks hold {compute} weights in place of bf16 ones: 1.6 GiB" in plan) == (compute != "exact")
    # a batch job (`generate`: nobody takes the chunks as they come) decodes after the loop, the same tiles parked,
    # the loop's room (what the decoder leaves) holding blocks' camera modulation
    spec = pipe.plan_job(88, 58, 104, options, streamed=False)
    assert spec.capacity_tokens == 18 * 1508 and pipe.vae_cut.parked and pipe.decode_after_loop
    assert not pipe.camera_until_decode  # exact: some blocks; fp8/int8, with their 1.6 GiB more: all 30
    assert 0 < pipe.camera_blocks < 30 if compute == "exact" else pipe.camera_blocks == 30
    notes = " ".join(pipe.plan.notes)
    assert ("the VAE decodes in bf16 (the reference: float32)" in notes) == (compute == "exact")
    assert unloaded == ([True] if compute == "exact" else [])  # a float32 VAE would reload in bf16: once
    assert ("fp8 weights in place of bf16 ones" in notes) == (compute == "fp8")
    # with room the float32 VAE of exact comes back (no parked cut): 16 GiB as measured in session 27
    roomy, _ = _plan_1_3b(16.0, compute)
    roomy.plan_job(88, 58, 104, options)
    assert not roomy.vae_cut.parked
    assert roomy.vae_dtype == (torch.float32 if compute == "exact" else torch.bfloat16)


@pytest.mark.parametrize("compute", ["exact", "fp8"])
def test_a_shorter_window_keeps_every_tiles_caches_on_the_device(compute):
    """A 14-frame window (`--attention-frames 14`) under fp8 leaves room for every tile's caches on the device, in
    bf16 (3 tiles): nothing parked, nothing in host memory; exact's bf16 DiT still parks them (4 tiles)."""
    long = dataclasses.replace(load_settings(preset="v2-fast-long"), attention_frames=14)
    pipe, _ = _plan_1_3b(8.0, compute)
    spec = pipe.plan_job(88, 58, 104, FastOptions.from_settings(long, 29 * 52, V2_FAST))
    cut = pipe.vae_cut
    assert spec.capacity_tokens == 14 * 1508 and cut.bf16 and pipe.vae_dtype == torch.bfloat16
    assert (cut.parked, cut.tiles) == ((True, 4) if compute == "exact" else (False, 3))
    plan = pipe.describe_plan()
    assert ("every tile's caches on the device (2.0 GiB), none parked" in plan) == (compute == "fp8")
    assert ("parked in host memory" in plan) == (compute == "exact")
    if compute == "fp8":  # the loop's arithmetic with every tile's caches on the device
        kv = spec.planned_bytes(30, 12, 128, torch.bfloat16) / GiB
        cross, act = 2 * 30 * 512 * 1536 * 2 / GiB, activation_gib(4 * 1508, 1536)
        decoder = cut.decode_cache_gib + cut.decode_push_gib
        assert cut.host_gib == 0.0 and LOOP_DIT_GIB[compute] + cross + 0.25 + kv + max(act, decoder) + 0.5 <= 7.4


def test_a_parked_cut_counts_one_tiles_caches_in_bf16_on_the_device_and_the_others_in_host_memory():
    whole = StreamVAE.cut(464, 832, None)
    parked = StreamVAE.cut(464, 832, None, parked=True)
    assert parked.decode_cache_gib == pytest.approx(whole.decode_cache_gib / 2)  # one tile (the whole frame), bf16
    assert parked.host_gib == 0.0 and parked.bf16_saving_gib == 0.0  # no other tile to park
    eight = next(c for c in stream_vae_cuts(464, 832, parked=True) if c.tiles == 8)
    unparked = next(c for c in stream_vae_cuts(464, 832) if c.tile_pixels == eight.tile_pixels)
    assert eight.decode_cache_gib == pytest.approx(unparked.decode_cache_gib / 2 / 8)  # one of 8 equal tiles
    assert eight.host_gib == pytest.approx(unparked.decode_cache_gib / 2 * 7 / 8)  # the other 7
    assert eight.decode_push_gib == pytest.approx(unparked.decode_push_gib / 2)


def test_the_decoders_caches_are_what_the_plan_counts_per_pixel():
    """`DECODE_CACHE_BYTES_PER_PIXEL` (measured on the H100 in float32) is the decoder's own arithmetic: 2,365
    elements a pixel, whatever the dtype; bf16 holds half the bytes (what a parked cut counts)."""
    from worldgen.models.vae import WanVAE
    from worldgen.models.vae_config import WAN21_VAE
    from worldgen.models.vae_tiling import StreamingDecoder
    from worldgen.pipelines.fast_plan import DECODE_CACHE_BYTES_PER_PIXEL

    torch.manual_seed(0)
    vae = WanVAE(WAN21_VAE).eval()
    latent = torch.randn(1, 16, 3, 4, 6)  # 32 x 48 pixels
    for dtype, bytes_per_pixel in ((torch.float32, DECODE_CACHE_BYTES_PER_PIXEL), (torch.bfloat16, 4729)):
        decoder = StreamingDecoder(vae.to(dtype), None)
        decoder.push(latent[:, :, :1])
        decoder.push(latent[:, :, 1:])  # steady: every cache holds its 2 frames
        assert decoder.cache_bytes() / (32 * 48) == pytest.approx(bytes_per_pixel, abs=2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_parked_decoder_gives_the_same_frames(device):
    """Parking each tile's caches in host memory between its turns moves them there and back exactly: the same
    frames bit for bit (on the CPU too: the same swaps, host to host)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (host memory apart from the device's)")
    from worldgen.models.vae import WanVAE
    from worldgen.models.vae_config import WAN21_VAE
    from worldgen.models.vae_tiling import StreamingDecoder

    torch.manual_seed(0)
    vae = WanVAE(dataclasses.replace(WAN21_VAE, dim=8, num_res_blocks=1)).eval().to(device)
    latent = torch.randn(1, 16, 9, 6, 10, device=device)
    plain, parked = StreamingDecoder(vae, 24 * 24, overlap=16), StreamingDecoder(vae, 24 * 24, overlap=16, park=True)
    swaps = []
    swap = parked._swap
    parked._swap = lambda *args: swaps.append(args[0]) or swap(*args)
    for a, b in ((0, 1), (1, 5), (5, 9)):
        assert torch.equal(plain.push(latent[:, :, a:b]), parked.push(latent[:, :, a:b]))
    tiles = len(parked.caches)
    assert tiles > 1  # tiles
    # a swap at every turn of the first push; after it the resident tile runs first, without one
    assert len(swaps) == tiles + 2 * (tiles - 1)
    # between calls one tile's caches stay on the device (the last to run), every other tile's are views of its
    # host blocks (pinned on CUDA): one block set a parked tile, none for the resident one
    assert parked.resident in parked.caches and set(parked.host) == set(parked.caches) - {parked.resident}
    for key, cache in parked.caches.items():
        cached = [t for t in cache.values() if isinstance(t, torch.Tensor)]
        assert cached
        if key == parked.resident:
            assert all(t.device.type == device for t in cached)
            continue
        blocks = {block.data_ptr() for block in parked.host[key].blocks}
        assert {t.untyped_storage().data_ptr() for t in cached} <= blocks  # views of the tile's packed blocks
        assert all(t.device.type == "cpu" and t.is_pinned() == (device == "cuda") for t in cached)
    assert parked.host_bytes() > 0 and not plain.host


def test_a_bf16_vae_is_counted_at_half_the_float32_peak_for_its_tiles():
    from worldgen.runtime.memory import MIN_TILE_PIXELS, vae_peak_gib, vae_tile_pixels

    pixels = 464 * 832
    assert vae_peak_gib(pixels, 2) == pytest.approx(vae_peak_gib(pixels) / 2) == pytest.approx(5.25)
    for room in (2.0, 3.4, 5.0):
        assert vae_tile_pixels(room, 2) > 2 * vae_tile_pixels(room)  # more than twice the pixels (half the weights)
        for element in (2, 4):  # the tile's peak: the room's share the margin leaves
            assert vae_peak_gib(vae_tile_pixels(room, element), element) == pytest.approx(room * 0.85, rel=1e-4)
    assert vae_tile_pixels(0.1, 2) == MIN_TILE_PIXELS


def test_the_encode_takes_the_fewest_tiles_its_largest_tile_allows():
    from worldgen.models.vae_tiling import encode_per_tile
    from worldgen.pipelines.fast_plan import fewest_tiles_pixels

    assert fewest_tiles_pixels(464, 832, 386_048) is None  # whole frames
    two = 464 * 448  # two full-height strips overlapping by 64 pixels: 448 + 448 - 64 = 832
    assert fewest_tiles_pixels(464, 832, 300_000) == fewest_tiles_pixels(464, 832, two) == two
    # below two strips: three (320 * 3 - 2 * 64 = 832); below those, the fewest tiles of the rest: a 2 x 3 grid of
    # 264x320 (264 * 2 - 64 = 464), where 100,000-pixel near-square tiles cut 8
    assert fewest_tiles_pixels(464, 832, two - 1) == 464 * 320
    assert fewest_tiles_pixels(464, 832, 100_000) == 264 * 320
    assert fewest_tiles_pixels(464, 1664, 400_000) == 464 * 600  # 3 strips: 600 * 3 - 2 * 64 = 1672 >= 1664
    tiles = []
    encode_per_tile(lambda t: tiles.append(t.shape[-2:]) or t[..., ::8, ::8], torch.zeros(1, 3, 1, 464, 832), two)
    assert tiles == [(464, 448), (464, 448)]  # the encoder's own cut: two full-height strips
