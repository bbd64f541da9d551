"""contracts.engine_options: one spelling, one "no budget" value, strict parsing, JSON round trip."""

from __future__ import annotations

import pytest

from contracts.engine_options import EngineOptions, EngineOptionsError


def test_round_trip_through_json():
    options = EngineOptions(
        ckpt="/ckpt",
        devices=("cuda:0", "cuda:1"),
        dtype="bf16",
        compute="fp8",
        attention="sdpa",
        vram_budget_gb=24,
        t5_on_cpu=True,
    )
    again = EngineOptions.from_json(options.to_json())
    assert again == options and again.vram_budget_gb == 24.0 and again.device == "cuda:0"


def test_defaults_mean_the_engines_choice():
    options = EngineOptions()
    assert options.vram_budget_gb is None and options.dtype is None and options.compute is None
    assert options.devices == ("cpu",)


@pytest.mark.parametrize(
    "data,words",
    [
        ({"vram_budget": 24}, "unknown option(s) ['vram_budget']"),
        ({"dtype": "bfloat16"}, "dtype must be one of"),
        ({"compute": "int4"}, "compute must be one of"),
        ({"attention": "xformers"}, "attention must be one of"),
        ({"vram_budget_gb": 0.0}, "for no budget"),
        ({"vram_budget_gb": True}, "vram_budget_gb"),
        ({"vram_budget_gb": float("nan")}, "vram_budget_gb"),
        ({"devices": ["gpu0"]}, "device 'gpu0' must be one of auto (CUDA where there is a GPU, else the CPU), cpu"),
        ({"devices": ["auto", "cuda:1"]}, "device 'auto' must be one of"),  # a two-GPU rollout names its GPUs
        ({"devices": []}, "devices must be a list"),
        ({"t5_on_cpu": "yes"}, "t5_on_cpu must be true or false"),
        ({"ckpt": ""}, "ckpt"),
    ],
)
def test_bad_options_name_the_option(data, words):
    with pytest.raises(EngineOptionsError) as info:
        EngineOptions.from_dict(data, where="server.toml [worker]")
    assert words in str(info.value) and "server.toml [worker]" in str(info.value)


def test_a_single_device_string_is_a_list_of_one():
    assert EngineOptions(devices="cuda").devices == ("cuda",)


def test_bad_json_is_named():
    with pytest.raises(EngineOptionsError, match="not valid JSON"):
        EngineOptions.from_json("{", where="--options")


def test_compute_names_the_path_and_bf16_still_means_exact():
    """One vocabulary (exact | fp8 | int8, and auto where the card decides) for the engine options, the job
    settings and the CLIs; the old spelling "bf16" is accepted everywhere and stored as the name it stands for."""
    from contracts.engine_options import COMPUTE_CHOICES, COMPUTES
    from contracts.settings import GenerationSettings, SettingsError

    assert COMPUTES == ("exact", "fp8", "int8") and set(COMPUTE_CHOICES) == {"exact", "fp8", "int8", "auto", "bf16"}
    assert EngineOptions(compute="bf16").compute == "exact"
    assert EngineOptions.from_dict({"compute": "exact"}).compute == "exact"
    assert GenerationSettings.from_dict({"compute": "bf16"}).compute == "exact"
    assert GenerationSettings(compute="fp8").to_dict()["compute"] == "fp8"
    with pytest.raises(
        SettingsError, match="compute must be one of null, 'exact', 'fp8', 'int8' \\('bf16' = 'exact'\\)"
    ):
        GenerationSettings.from_dict({"compute": "fp32"})
    with pytest.raises(SettingsError, match="compute must be one of"):
        GenerationSettings.from_dict({"compute": ["exact"]})  # not a name at all: refused, not a crash
