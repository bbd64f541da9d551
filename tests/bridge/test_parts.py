"""Unit tests of the server's parts: the worker pipe framing, the fair queue, the disk spool."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.server.fair_queue import FairQueue
from bridge.server.server_config import ConfigError, ServerConfig, load_server_config
from bridge.server.spool import Spool, SpoolError
from bridge.workers import worker_protocol as wp
from tests.bridge.conftest import REPO

# ---------------------------------------------------------------------------------------------
# Worker pipe


def test_worker_messages_round_trip_through_a_stream():
    stream = io.BytesIO()
    messages = [{"type": "run", "job": "j", "settings": {"steps": 4}}, {"type": "cancel", "job": "j"}]
    for message in messages:
        wp.write_message(stream, message)
    stream.seek(0)
    assert [wp.read_message(stream), wp.read_message(stream), wp.read_message(stream)] == [*messages, None]


def test_message_buffer_reassembles_messages_fed_byte_by_byte():
    data = b"".join(wp.encode({"type": "progress", "job": "j", "step": i}) for i in range(3))
    buffer, out = wp.MessageBuffer(), []
    for i in range(len(data)):
        out += buffer.feed(data[i : i + 1])
    assert [m["step"] for m in out] == [0, 1, 2] and buffer.pending_bytes == 0


def test_worker_pipe_refuses_oversized_lengths_and_garbage():
    with pytest.raises(wp.WorkerProtocolError, match="declares"):
        wp.MessageBuffer().feed(struct.pack(">I", wp.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(wp.WorkerProtocolError, match="'type'"):
        wp.MessageBuffer().feed(struct.pack(">I", 3) + msgpack.packb([1, 2]))
    with pytest.raises(wp.WorkerProtocolError, match="middle"):
        wp.read_message(io.BytesIO(struct.pack(">I", 10) + b"abc"))
    with pytest.raises(wp.WorkerProtocolError):
        wp.encode({"no": "type"})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_message_buffer_raises_only_worker_protocol_errors(chunks):
    buffer = wp.MessageBuffer()
    try:
        for chunk in chunks:
            for message in buffer.feed(chunk):
                assert isinstance(message["type"], str)
    except wp.WorkerProtocolError:
        pass


# ---------------------------------------------------------------------------------------------
# Fair queue


def test_clients_take_turns_and_keep_their_own_order():
    queue = FairQueue()
    for i in range(4):
        queue.push("a", f"a{i}")
    queue.push("b", "b0")
    queue.push("c", "c0")
    queue.push("b", "b1")
    assert queue.order() == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]
    assert queue.positions()["c0"] == 2
    assert [queue.pop() for _ in range(len(queue))] == ["a0", "b0", "c0", "a1", "b1", "a2", "a3"]
    assert queue.pop() is None


def test_remove_and_front():
    queue = FairQueue()
    for job in ("a0", "a1"):
        queue.push("a", job)
    queue.push("b", "b0")
    assert queue.remove("a0") and not queue.remove("a0")
    queue.push("b", "b-resumed", front=True)
    assert queue.order() == ["b-resumed", "a1", "b0"]
    assert queue.count("b") == 2 and "a1" in queue and len(queue) == 3
    with pytest.raises(ValueError):
        queue.push("a", "a1")


# ---------------------------------------------------------------------------------------------
# Spool


def accept(spool: Spool, rid: str = "r1"):
    return spool.accept(
        client="c",
        rid=rid,
        prompt="forward",
        image=b"\x89PNG\r\n\x1a\nxx",
        poses=np.tile(np.eye(4, dtype=np.float32), (5, 1, 1)),
        intrinsics=np.ones((5, 4), np.float32),
        settings={"steps": 4},
        want_frames=True,
    )


def test_accepted_job_is_an_episode_folder_in_the_lingbot_layout(tmp_path):
    spool = Spool(tmp_path)
    record = accept(spool)
    episode = record.episode_dir
    assert sorted(p.name for p in episode.iterdir()) == ["image.png", "intrinsics.npy", "poses.npy", "prompt.txt"]
    assert np.load(episode / "poses.npy").shape == (5, 4, 4)
    assert (episode / "prompt.txt").read_text() == "forward"
    assert json.loads((record.dir / "state.json").read_text())["state"] == "queued"
    assert not any(spool.incoming_dir.iterdir())
    spool.close()


def test_spool_reloads_jobs_and_states_after_a_restart(tmp_path):
    spool = Spool(tmp_path)
    first, second = accept(spool, "r1"), accept(spool, "r2")
    second.state, second.attempts = "running", 1
    spool.save_state(second)
    spool.close()
    spool = Spool(tmp_path)
    records = spool.load_all()
    assert [(r.id, r.state, r.attempts, r.want_frames) for r in records] == [
        (first.id, "queued", 0, True),
        (second.id, "running", 1, True),
    ]
    assert accept(spool, "r3").seq == 2
    spool.close()


def test_spool_moves_unreadable_jobs_aside_and_drops_unacknowledged_ones(tmp_path):
    spool = Spool(tmp_path)
    record = accept(spool)
    (record.dir / "state.json").write_text("{not json")
    (spool.incoming_dir / "half-written").mkdir()
    spool.close()
    spool = Spool(tmp_path)
    assert spool.load_all() == []
    assert (tmp_path / "corrupt" / record.id).is_dir()
    assert not any(spool.incoming_dir.iterdir())
    spool.close()


def test_one_server_per_spool(tmp_path):
    spool = Spool(tmp_path)
    with pytest.raises(SpoolError, match="in use by another server"):
        Spool(tmp_path)
    spool.close()
    Spool(tmp_path).close()


# ---------------------------------------------------------------------------------------------
# Server config


def test_config_server_toml_documents_exactly_the_defaults():
    assert load_server_config(REPO / "config" / "server.toml") == ServerConfig()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[server]\nbnid = 'tcp://127.0.0.1:1'\n", "unknown key(s) ['bnid']"),
        ("[servers]\n", "unknown table(s) ['servers']"),
        ("[server]\nmax_queue = 'many'\n", "max_queue must be a non-negative integer"),
        ("[server]\nmax_queue = 0\n", "must be >= 1"),
        ("[worker]\nrestart_backoff_s = [1]\n", "list of 2 numbers"),
        ("[worker]\ncommand = 'python w.py'\n", "must be a list"),
        ("[limits]\nmax_poses = -1\n", "non-negative integer"),
        ("[server\n", "not valid TOML"),
        ("[server]\nlive_idle_s = 60.0\n", "live_idle_s: renamed live_max_gap_s"),
    ],
)
def test_config_mistakes_are_named(tmp_path, text, words):
    path = tmp_path / "server.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_server_config(path)
    assert words in str(info.value)


# ---------------------------------------------------------------------------------------------
# Import boundaries (docs/architecture.md)


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    [
        (
            "bridge.client.client, bridge.server.server, bridge.server.serve, bridge.client.submit, lingbot_cli.serve, lingbot_cli.submit, lingbot_cli.keys",
            "torch",
        ),
        ("worldgen.worker", "zmq"),
        ("bridge, bridge.workers.worker_protocol, contracts.settings", "zmq"),
    ],
)
def test_import_boundaries(modules, forbidden):
    code = f"import sys, {modules}; sys.exit({forbidden!r} in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"importing {modules} imports {forbidden} {done.stderr}"


# ---------------------------------------------------------------------------------------------
# The job state machine and the result check


def test_job_moves_only_along_the_state_machine(tmp_path):
    from bridge.server.jobs import BadMove, Job

    job = Job(id="j", dir=tmp_path, client="peer:01", rid="r", seq=0, created=0.0, settings={})
    with pytest.raises(BadMove):
        job.move("done")  # never done without having run
    job.move("running")
    assert job.attempts == 1 and job.live is not None
    job.move("queued")  # requeued (the spool could not record it, or a restart)
    assert job.live is None
    job.move("running")
    job.move("done")
    assert job.terminal and job.finished is not None
    for state in ("running", "queued", "failed"):
        with pytest.raises(BadMove):
            job.move(state)


def test_mp4_check_refuses_cut_files_and_wrong_frame_counts(tmp_path):
    from bridge.server.mp4 import IncompleteVideo, check_complete
    from tests.bridge.standin_worker import mp4_bytes

    path = tmp_path / "result.mp4"
    whole = mp4_bytes(17, b"x" * 1000)
    path.write_bytes(whole)
    assert check_complete(path, 17) == len(whole)
    for data, words in [
        (mp4_bytes(17, b"x" * 1000, truncate=True), "no moov"),
        (whole[:-10], "claims"),
        (b"", "empty"),
        (b"\x00" * 64, "no ftyp"),
    ]:
        path.write_bytes(data)
        with pytest.raises(IncompleteVideo, match=words):
            check_complete(path, 17)
    path.write_bytes(whole)
    with pytest.raises(IncompleteVideo, match="17 frames, 21 were expected"):
        check_complete(path, 21)
