"""What the server accepts can run (issue 25): field types, prompts, the engine's frame and size
rules in the engine's words, settings the server's engine cannot run, and the preset that follows
the checkpoint. A real server subprocess; the stand-in worker unless the real one is needed."""

from __future__ import annotations

import msgpack
import pytest

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from bridge.server.server_config import ServerConfig, WorkerConfig, load_server_config
from bridge.wire import protocol
from contracts.engine_options import EngineOptions
from contracts.generation_request import MIN_FRAMES, latent_size
from contracts.settings import load_settings
from tests.bridge.conftest import REPO, TINY, make_episode, standin_command
from tests.bridge.test_server import RawDealer, record_of


def submit(payload: EpisodePayload, rid: str, **fields) -> list:
    header = {"rid": rid, "prompt": "go forward", "settings": {"steps": 2}, **fields}
    return protocol.encode("submit", header, {"poses": payload.poses, "intrinsics": payload.intrinsics},
                           {"image": payload.image})  # fmt: skip


def with_header(frames: list, **changes) -> list:
    header = msgpack.unpackb(frames[0])
    header.update(changes)
    return [msgpack.packb(header), *frames[1:]]


@pytest.fixture
def door(servers, episode):
    server = servers(worker=standin_command(step_s=0.01))
    dealer = RawDealer(server.endpoint)
    yield dealer, EpisodePayload.from_dir(episode)
    dealer.close()


@pytest.mark.parametrize("version", [1.0, True, "1", None, 2])
def test_v_must_be_the_integer_1(door, version):
    dealer, _ = door
    reply = dealer.ask([msgpack.packb({"v": version, "type": "health", "rid": "h"})])
    assert reply.type == "error" and reply.fields["code"] == "bad_version", reply.fields


@pytest.mark.parametrize("prompt", ["", "   ", "\t\n", "\u3000", 5, 1.5, True, [], {}, ["go"]])
def test_empty_blank_and_non_string_prompts_are_bad_requests(door, prompt):
    dealer, payload = door
    reply = dealer.ask(with_header(submit(payload, "p"), prompt=prompt))
    assert reply.type == "error" and reply.fields["code"] == "bad_request", reply.fields
    assert "prompt" in reply.fields["message"]


@pytest.mark.parametrize("frame_num", [1, 2, 3, 4])
def test_too_few_frames_are_refused_at_the_door_in_the_engines_words(door, frame_num):
    dealer, payload = door
    reply = dealer.ask(submit(payload, "f", settings={"frame_num": frame_num}))
    assert reply.type == "error" and reply.fields["code"] == "bad_settings", reply.fields
    assert f"frame_num {frame_num} is too small: use at least {MIN_FRAMES} frames" in reply.fields["message"]


def test_too_few_poses_for_any_video_are_bad_input(servers, tmp_path):
    server = servers(worker=standin_command(step_s=0.01))
    payload = EpisodePayload.from_dir(make_episode(tmp_path / "short", n=3))
    dealer = RawDealer(server.endpoint)
    try:
        reply = dealer.ask(submit(payload, "short"))
    finally:
        dealer.close()
    assert reply.type == "error" and reply.fields["code"] == "bad_input", reply.fields
    assert "poses (poses.npy) has 3 poses; at least 5 are needed" in reply.fields["message"]  # the engine's words


def test_a_size_too_small_names_a_size_that_works(door):
    dealer, payload = door  # a 160x96 image
    reply = dealer.ask(submit(payload, "s", settings={"size": "16*16"}))
    assert reply.type == "error" and reply.fields["code"] == "bad_settings", reply.fields
    message = reply.fields["message"]
    assert "max_area 256 is too small for a 96*160 image (H*W); use at least 16*32" in message
    suggested = message.rsplit("use at least ", 1)[1].split()[0]
    height, width = (int(v) for v in suggested.split("*"))
    assert latent_size((96, 160), height * width)  # the engine's own rule takes it
    assert dealer.ask(submit(payload, "s2", settings={"size": suggested})).type == "accepted"


def test_two_gpus_on_a_one_device_server_are_refused(door):
    dealer, payload = door
    reply = dealer.ask(submit(payload, "g", settings={"gpus": 2}))
    assert reply.type == "error" and reply.fields["code"] == "bad_settings" and "gpus 2" in reply.fields["message"]


def test_fp8_on_a_server_whose_engine_cannot_is_refused_at_the_door(servers, episode):
    """The real tiny worker on the CPU says in its `ready` why FP8 cannot run there; the server
    refuses such jobs with those words, and runs the same job with exact compute."""
    server = servers(worker=TINY).wait_loaded()
    payload = EpisodePayload.from_dir(episode)
    dealer = RawDealer(server.endpoint)
    try:
        reply = dealer.ask(submit(payload, "fp8", settings={"compute": "fp8", "steps": 1}), timeout=10)
        assert reply.type == "error" and reply.fields["code"] == "bad_settings", reply.fields
        assert "compute fp8 cannot run on this server" in reply.fields["message"]
        assert "FP8 tensor cores" in reply.fields["message"]
    finally:
        dealer.close()


def test_the_servers_preset_follows_its_checkpoint(tmp_path):
    tiny = ServerConfig()
    assert tiny.generation_preset == "" and tiny.preset() == "tiny"
    real = ServerConfig(worker=WorkerConfig(engine=EngineOptions(ckpt=str(tmp_path))))
    assert real.preset() == "default"
    chosen = load_server_config(None, {"server.generation_preset": "fast40", "worker.ckpt": str(tmp_path)})
    assert chosen.preset() == "fast40"
    shipped = load_server_config(REPO / "config" / "server.toml")
    assert shipped.generation_preset == "" and shipped.preset() == "tiny"


def test_a_job_without_settings_runs_the_checkpoints_preset(servers, episode, tmp_path):
    """A server on a real checkpoint folder (the stand-in worker loads nothing): a job that sends no
    settings runs the reference's [default] (480*832, 81 frames, 70 steps), not the tiny model's."""
    server = servers(worker=standin_command(step_s=0.001), worker_keys={"ckpt": str(tmp_path)})
    payload = EpisodePayload.from_dir(make_episode(tmp_path / "long", n=81))
    with Client(server.endpoint, timeout=10) as client:
        record = record_of(client.submit(payload, None).result(timeout=60))
    default = load_settings(preset="default")
    assert record["settings"] == default.to_dict()
    tiny = load_settings(preset="tiny")
    assert (default.size, default.frame_num, default.steps) != (tiny.size, tiny.frame_num, tiny.steps)
