"""Hypothesis against a live server: random and malformed frames (batch and live messages), wrong versions, oversized
declared shapes, bad dtypes, MiB-sized junk. The server (with the real tiny worker) must answer
every one with an error (or, for the rare valid message, a normal reply), never crash, and keep its
memory bounded."""

from __future__ import annotations

import time

import pytest
import zmq
from hypothesis import HealthCheck, given, settings

from bridge.client.client import Client
from bridge.wire import protocol
from tests.bridge.conftest import TINY, rss_mb, wait_for
from tests.bridge.strategies import server_frames


class Prober:
    def __init__(self, endpoint: str, limits: protocol.Limits) -> None:
        self.endpoint, self.limits = endpoint, limits
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(endpoint)
        self.answered = 0

    def check(self, frames: list) -> None:
        try:
            expected = protocol.decode_request(frames, self.limits)
        except protocol.ProtocolError as exc:
            expected = exc
        self.socket.send_multipart(frames)
        while True:  # skip events of jobs that a (rare) valid submit started
            assert self.socket.poll(5000), f"no answer to {[bytes(f[:40]) for f in frames]}"
            reply = protocol.decode_reply(self.socket.recv_multipart())
            if reply.type not in ("progress", "result", "chunk") and not (
                reply.type == "error" and "rid" not in reply.fields and "job" in reply.fields
            ):
                break
        self.answered += 1
        if isinstance(expected, protocol.ProtocolError):
            assert reply.type == "error" and reply.fields["code"] == expected.code, (reply.fields, expected)
        else:
            assert reply.type in ("error", "accepted", "status", "health", "poses_ok")

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@pytest.mark.slow
def test_fuzz_the_live_server(servers):
    server = servers(worker=TINY, limits={"max_image_bytes": 8 << 20}, max_queue=4)
    prober = Prober(server.endpoint, protocol.Limits(max_image_bytes=8 << 20))
    pid = server.proc.pid
    try:

        @settings(max_examples=400, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                         HealthCheck.data_too_large])  # fmt: skip
        @given(server_frames)
        def campaign(frames):
            prober.check(frames)
            assert server.alive()

        campaign()  # warm-up: allocator pools, imports on first use, caches
        baseline = rss_mb(pid)
        campaign()
        grown = rss_mb(pid) - baseline
        assert grown < 48, f"server RSS grew {grown:.0f} MiB over a fuzz campaign"
        assert prober.answered >= 400
    finally:
        prober.close()
    with Client(server.endpoint, timeout=5) as client:
        assert wait_for(lambda: client.health()["ok"], 20, what="a healthy server")


def test_frames_above_the_size_cap_are_dropped_by_zeromq_and_the_server_goes_on(servers):
    server = servers(limits={"max_image_bytes": 1 << 20})
    prober = Prober(server.endpoint, protocol.Limits(max_image_bytes=1 << 20))
    try:
        prober.socket.send_multipart([b"\x80", b"\x00" * (4 << 20)])  # ZMQ_MAXMSGSIZE: connection dropped
        time.sleep(0.5)
        assert server.alive()
    finally:
        prober.close()
    with Client(server.endpoint, timeout=5) as client:
        assert wait_for(lambda: client.health()["ok"], 20, what="a healthy server")
