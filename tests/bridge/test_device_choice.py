"""`device = "auto"`: CUDA where the worker's PyTorch sees a GPU, else the CPU, and the worker is
named by the device it took (a real server and its real tiny-model worker)."""

from __future__ import annotations

import pytest

from bridge.client.client import Client
from bridge.server.server_config import ConfigError, load_server_config
from contracts.engine_options import EngineOptions, EngineOptionsError
from tests.bridge.conftest import TINY


def test_auto_is_a_device_of_one_worker_only():
    assert EngineOptions(devices=["auto"]).device == "auto"
    with pytest.raises(EngineOptionsError, match="auto .*cpu, cuda or cuda:N"):
        EngineOptions(devices=["gpu"])
    with pytest.raises(EngineOptionsError):
        EngineOptions(devices=["auto", "cuda:1"])  # a two-GPU rollout names its GPUs
    assert load_server_config(None, {"worker.device": "auto"}).worker.pool_devices() == ("auto",)
    with pytest.raises(ConfigError, match="auto"):
        load_server_config(None, {"worker.device": "tpu"})


def test_an_auto_worker_is_named_by_the_device_it_took(servers):
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    server = servers(worker=TINY, worker_keys={"device": "auto"}).wait_loaded()
    with Client(server.endpoint, timeout=10) as client:
        health = client.health()
    assert [w["name"] for w in health["workers"]] == [f"0:{expected}"], health["workers"]
    assert health["model"]["device"] == expected
