"""The provenance record says how a rollout's matmuls really ran: the path (exact | fp8) and the
float type beside it, so a CPU float32 run is not recorded as "bf16"."""

from __future__ import annotations

import shutil

from contracts.provenance import make_record, read_record, summary_rows
from contracts.settings import load_settings
from tests.conftest import REPO
from worldgen.pipelines.loader import load_pipeline
from worldgen.rollout import generate_episode


def test_a_cpu_rollout_records_the_exact_path_in_float32(tmp_path):
    episode = shutil.copytree(REPO / "data" / "sample_room", tmp_path / "ep")
    pipe = load_pipeline("tiny", device="cpu", compute="bf16", text_cache_dir=tmp_path / "cache")  # old name
    settings = load_settings(preset="tiny").replace(steps=1, frame_num=5, size="48*80")
    out = generate_episode(pipe, episode, settings, tmp_path / "rollout.mp4", producer="generate")
    record, note = read_record(out)
    assert note is None
    assert record["compute"]["compute"] == "exact" and record["compute"]["dtype"] == "float32"
    assert record["compute"]["self_attention"] is None  # said only for fp8 jobs
    row = dict(summary_rows(record))["compute"]
    assert row.startswith("exact in float32 on cpu") and "bf16" not in row
    # a job's own compute is what the record states (here the old spelling, as an old client sends it)
    again = generate_episode(pipe, episode, settings.replace(compute="bf16"), tmp_path / "again.mp4")
    assert read_record(again)[0]["compute"]["compute"] == "exact"


def _record(compute: dict) -> dict:
    return make_record(
        producer="worker",
        model={"family": "lingbot-world", "variant": "base", "weights": "real", "random_weights": False, "name": "x"},
        checkpoint={"path": "/ckpt", "layout": "nf4"},
        compute=compute,
        settings={"size": "480*832", "frame_num": 81, "steps": 70, "shift": 10.0, "guide_scale": [5, 5], "seed": 1},
        output={},
        timings={},
    )


def test_the_report_row_names_path_dtype_and_device():
    fp8 = _record(
        {"device": "cuda:0", "device_name": "NVIDIA H100", "dtype": "bfloat16", "compute": "fp8", "attention": "sdpa"}
    )
    assert dict(summary_rows(fp8))["compute"] == "fp8 (approximate) in bfloat16 on cuda:0 (NVIDIA H100); attention sdpa"
    # a record written before the path was named: its "bf16" meant the exact path, whatever the dtype
    old = _record({"device": "cpu", "dtype": "float32", "compute": "bf16"})
    assert dict(summary_rows(old))["compute"] == "exact in float32 on cpu"


def test_fp8_with_a_dtype_it_cannot_take_is_refused_not_recorded():
    """Only bf16 calls take the FP8 GEMM: fp8 with --dtype fp32 would run exact under an fp8 record."""
    import pytest
    import torch

    from worldgen.errors import InputError

    with pytest.raises(InputError, match="computes in float32: use --dtype bf16 with fp8, or --compute exact"):
        load_pipeline("tiny", device="cpu", dtype=torch.float32, compute="fp8")


def test_an_fp8_record_says_whether_self_attention_ran_in_fp8():
    from worldgen.rollout import fp8_self_attention

    assert fp8_self_attention("cpu") == "bf16 (FP8 attention needs an NVIDIA GPU, not cpu)"
    assert fp8_self_attention("cpu", "fast") == fp8_self_attention("cpu")  # Fast: the same kernel, through its cache
    record = _record(
        {
            "device": "cuda:0",
            "dtype": "bfloat16",
            "compute": "fp8",
            "attention": "flash",
            "self_attention": "fp8 (cuDNN sdpa_fp8, per-tensor scales)",
        }  # fmt: skip
    )
    assert dict(summary_rows(record))["compute"] == (
        "fp8 (approximate) in bfloat16 on cuda:0; attention flash, self_attention fp8 (cuDNN sdpa_fp8, per-tensor scales)"
    )
