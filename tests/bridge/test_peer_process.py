"""Without CurveZMQ keys one process cannot take several clients' share of the queue by opening
several connections (issue 25, bridge/server/peer_process.py): over ipc:// the cap holds per peer process
(the kernel's credentials), over tcp:// for all unauthenticated connections together. A real
server subprocess; the other process is a real `python` child."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from bridge.client.client import Client
from bridge.client.episode_payload import EpisodePayload
from tests.bridge.conftest import REPO, standin_command, wait_for
from tests.bridge.test_robustness import reply_to, submit_frames
from tests.bridge.test_server import RawDealer

OTHER_PROCESS = textwrap.dedent("""
    import sys
    from bridge.client.client import Client
    from bridge.client.client_errors import RequestFailed
    from bridge.client.episode_payload import EpisodePayload
    with Client(sys.argv[1], timeout=10) as client:
        try:
            print("accepted", client.submit(EpisodePayload.from_dir(sys.argv[2]), {"steps": 1}).id)
        except RequestFailed as exc:
            print(exc.code, exc.message)
""")


def codes(replies) -> list[str]:
    return [r.fields.get("code", r.type) for r in replies]


def start_held_job(endpoint: str, dealer: RawDealer, payload: EpisodePayload) -> None:
    """A job the (held) worker runs, so the jobs after it wait in the queue."""
    with Client(endpoint, timeout=10) as client:
        wait_for(lambda: client.health()["ok"], 30, what="the worker")
        running = reply_to(dealer, submit_frames(payload, "run"))
        assert running.type == "accepted"
        wait_for(lambda: client.status(running.fields["job"])["state"] == "running", 10, what="the job to run")


def test_over_ipc_the_cap_holds_per_process_and_another_process_is_served(servers, episode, tmp_path):
    hold = tmp_path / "release"
    server = servers(worker=standin_command(step_s=0.01, hold_until=hold), bind=f"ipc://{tmp_path}/server.ipc",
                     max_queue=8, max_queue_per_client=2)  # fmt: skip
    payload = EpisodePayload.from_dir(episode)
    dealers = [RawDealer(server.endpoint) for _ in range(3)]  # one process, three connections
    try:
        start_held_job(server.endpoint, dealers[0], payload)
        replies = [reply_to(d, submit_frames(payload, f"r{i}")) for i, d in enumerate(dealers * 2)]
        assert codes(replies).count("accepted") == 2, codes(replies)
        refused = next(r for r in replies if r.type == "error")
        assert refused.fields["code"] == "busy" and "the clients of your process" in refused.fields["message"]
        other = subprocess.run([sys.executable, "-c", OTHER_PROCESS, server.endpoint, str(episode)], cwd=REPO,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert other.stdout.startswith("accepted"), other.stdout + other.stderr  # another process: its own share
    finally:
        hold.touch()
        for dealer in dealers:
            dealer.close()


def test_over_tcp_without_keys_all_connections_share_one_clients_cap(servers, episode, tmp_path):
    hold = tmp_path / "release"
    server = servers(worker=standin_command(step_s=0.01, hold_until=hold), max_queue=8, max_queue_per_client=2)
    payload = EpisodePayload.from_dir(episode)
    dealers = [RawDealer(server.endpoint) for _ in range(3)]
    try:
        start_held_job(server.endpoint, dealers[0], payload)
        replies = [reply_to(d, submit_frames(payload, f"r{i}")) for i, d in enumerate(dealers * 2)]
        assert codes(replies).count("accepted") == 2, codes(replies)  # not 2 per connection
        refused = next(r for r in replies if r.type == "error")
        assert refused.fields["code"] == "busy" and "no CurveZMQ keys" in refused.fields["message"]
    finally:
        hold.touch()
        for dealer in dealers:
            dealer.close()
    assert "a server shared by several users needs keys" in server.log()
