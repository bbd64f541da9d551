"""Engine options set in server.toml reach the worker's pipeline as data (issue 13).

`[worker]` -> `contracts.engine_options.EngineOptions` -> the worker protocol's first message
(`load`) -> `worldgen.pipelines.loader.load_pipeline_from_options`; asserted through the worker's own
health answer (what it was sent, and what the pipeline applied), with the real server and the
real tiny worker.
"""

from __future__ import annotations

import sys

import pytest

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from bridge.server.server_config import ConfigError, load_server_config
from contracts.engine_options import EngineOptions, EngineOptionsError
from tests.bridge.conftest import TINY, wait_for


def test_attention_t5_on_cpu_compute_and_budget_reach_the_pipeline(servers, episode):
    engine_keys = {"attention": "sdpa", "t5_on_cpu": True, "compute": "bf16", "vram_budget_gb": 12.5, "dtype": "fp32"}
    server = servers(worker=TINY, worker_keys=engine_keys)
    with Client(server.endpoint, timeout=10) as client:
        health = wait_for(lambda: (h := client.health())["ok"] and h, 180, interval=0.5, what="the tiny worker")
        reported = health["worker"]["reported"]
        sent = reported["options"]
        # compute "bf16" (the old name of the exact path, as an older server.toml says) arrives as "exact"
        assert {k: sent[k] for k in engine_keys} == {**engine_keys, "compute": "exact"}
        assert sent["ckpt"] == "tiny" and sent["devices"] == ["cpu"]
        applied = reported["pipeline"]
        assert applied["attention"] == "sdpa"
        assert applied["text_encoder_device"] == "cpu" and applied["text_encoder_streamed"] is True
        assert applied["compute"] == "exact" and applied["vram_budget_gb"] == 12.5
        assert applied["dtype"] == "float32" and health["model"]["dtype"] == "float32"
        assert applied["vae_dtype"] == "float32"  # bf16 only for the Fast model under fp8 on CUDA
        # and the pipeline so loaded generates
        assert client.submit(EpisodePayload.from_dir(episode), {"steps": 1, "size": "48*80", "frame_num": 5}).result(
            timeout=120
        )


def test_default_options_leave_each_choice_to_the_engine(servers):
    server = servers(worker=TINY)
    with Client(server.endpoint, timeout=10) as client:
        health = wait_for(lambda: (h := client.health())["ok"] and h, 180, interval=0.5, what="the tiny worker")
        applied = health["worker"]["reported"]["pipeline"]
        assert applied["attention"] in ("sdpa", "flash") and applied["vram_budget_gb"] is None
        assert applied["text_encoder_streamed"] is False and applied["dtype"] == "float32"


def test_the_worker_command_carries_no_engine_flags():
    config = load_server_config(None, {"worker.attention": "sdpa", "worker.vram_budget_gb": 8.0})
    assert config.worker.argv() == (sys.executable, "-m", "worldgen.worker")
    assert config.worker.options_for("cuda:1").to_dict() == {
        **config.worker.engine.to_dict(),
        "devices": ["cuda:1"],
    }


@pytest.mark.parametrize(
    "toml,words",
    [
        ("[worker]\nvram_budget_gb = 0.0\n", "in TOML: leave it out"),
        ('[worker]\ndtype = "bfloat16"\n', "dtype must be one of ['bf16', 'fp16', 'fp32']"),
        ('[worker]\nattention = "xformers"\n', "attention must be one of"),
        ("[worker]\nram_budget_gb = 64.0\n", "unknown key(s) ['ram_budget_gb']"),
        ("[worker]\nt5_on_cpu = 1\n", "t5_on_cpu must be true or false"),
    ],
)
def test_bad_engine_options_in_server_toml_name_the_key(tmp_path, toml, words):
    path = tmp_path / "server.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert words in str(info.value) and f"{path} [worker]" in str(info.value)


def test_gpus_key_gives_one_engine_two_gpus(tmp_path):
    """`gpus = "0,1"` (or `serve --gpus 0,1`): one worker whose rollouts use two GPUs (worldgen.pipelines.multi_gpu);
    it replaces `device` and excludes a pool."""
    config = load_server_config(None, {"worker.device": "cpu", "worker.gpus": "0,1"})
    assert config.worker.engine.devices == ("cuda:0", "cuda:1") and config.worker.pool_devices() == ("cuda:0",)
    assert config.worker.options_for("cuda:0").devices == ("cuda:0", "cuda:1")  # what the one worker is sent
    for bad in ("0", "0,0", "a,b", "0,1,2"):
        with pytest.raises(ConfigError, match="gpus"):
            load_server_config(None, {"worker.gpus": bad})
    with pytest.raises(ConfigError, match="exclude each other"):
        load_server_config(None, {"worker.gpus": "0,1", "worker.devices": ["cuda:0", "cuda:1"]})


def test_a_device_list_of_two_gives_one_engine_two_devices():
    """`device = ["cpu", "cpu"]`: one worker whose rollouts span both (`gpus`' split over two CPU ranks, for
    tests); a list of one or three, a bad entry, or a list beside `gpus` or a pool's `devices` is refused."""
    config = load_server_config(None, {"worker.device": ["cpu", "cpu"]})
    assert config.worker.engine.devices == ("cpu", "cpu") and config.worker.pool_devices() == ("cpu",)
    assert config.worker.options_for("cpu").devices == ("cpu", "cpu")
    for bad, words in ((["cpu"], "a list of two"), (["cpu"] * 3, "a list of two"), (["cpu", "gpu1"], "'gpu1'"),
                       ([1, 2], "device")):  # fmt: skip
        with pytest.raises(ConfigError, match=words):
            load_server_config(None, {"worker.device": bad})
    for other in ({"worker.gpus": "0,1"}, {"worker.devices": ["cpu", "cpu"]}):
        with pytest.raises(ConfigError, match="give one of them"):
            load_server_config(None, {"worker.device": ["cpu", "cpu"], **other})


def test_a_warm_up_is_for_the_servers_own_job_defaults(servers):
    """`warm_up = true`: the worker is sent the server's generation preset ([tiny]) as the job it warms up for."""
    server = servers(worker=TINY, worker_keys={"model": "fast", "warm_up": True}, generation_preset="tiny")
    with Client(server.endpoint, timeout=10) as client:
        health = wait_for(lambda: (h := client.health())["ok"] and h, 180, interval=0.5, what="the tiny worker")
        reported = health["worker"]["reported"]
        assert reported["options"]["warm_up_settings"]["size"] == "96*160" and reported["warm_up_s"] > 0
    plain = load_server_config(None, {"worker.model": "fast"})
    assert plain.worker.engine.warm_up_settings is None  # no warm-up: nothing sent


def test_warm_up_settings_must_be_a_table():
    with pytest.raises(EngineOptionsError, match="warm_up_settings"):
        EngineOptions(warm_up_settings="320*576")
