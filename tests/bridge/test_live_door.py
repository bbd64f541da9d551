"""Issue 53: the live path held to the batch path's door. Raw pyzmq + msgpack clients (as an outside
client written from docs/protocol.md) against a real server subprocess: blank prompts, poses that
float32 camera maths cannot survive, Fast frame counts below one chunk and magic-bytes-only images
are refused at the door with the same code on `submit` and `live` (a bad pose batch harms nothing),
and only a job's owner may append to, end or cancel it. The stand-in worker is held on a first job,
so the live jobs under test stay queued and take poses."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bridge.client.episode_payload import EpisodePayload
from bridge.wire import protocol
from contracts import episode
from tests.bridge.conftest import ServerPool, make_episode, standin_command
from tests.bridge.test_server import RawDealer

FAST = {"model": "fast", "size": "48*80", "frame_num": 33}
JPEG_MAGIC_ONLY = episode.JPEG_MAGIC + b"\x00" * 64


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A server whose only worker is busy with a held job: every job after it stays queued."""
    root = tmp_path_factory.mktemp("live-door")
    pool = ServerPool(root)
    server = pool.start(worker=standin_command(step_s=0.01, hold_until=root / "never"))
    payload = EpisodePayload.from_dir(make_episode(root / "ep", n=33))
    blocker = RawDealer(server.endpoint)
    try:
        reply = blocker.ask(submit(payload, "block"))
        assert reply.type == "accepted", reply.fields
        yield server, payload
    finally:
        blocker.close()
        pool.close()


@pytest.fixture
def dealers(held):
    made: list[RawDealer] = []

    def dealer() -> RawDealer:
        made.append(RawDealer(held[0].endpoint))
        return made[-1]

    yield dealer
    for one in made:
        one.close()


def submit(payload: EpisodePayload, rid: str, poses=None, image=None, **header) -> list:
    fields = {"rid": rid, "prompt": "go forward", "settings": {"steps": 2}, **header}
    arrays = {"poses": payload.poses if poses is None else poses, "intrinsics": payload.intrinsics}
    return protocol.encode("submit", fields, arrays, {"image": payload.image if image is None else image})


def live(payload: EpisodePayload, rid: str, image=None, **header) -> list:
    fields = {"rid": rid, "live_v": protocol.LIVE_VERSION, "prompt": "a room", "settings": FAST, **header}
    return protocol.encode("live", fields, {"intrinsics": payload.intrinsics[:1]},
                           {"image": payload.image if image is None else image})  # fmt: skip


def poses(job: str, seq: int, batch: np.ndarray, rid: str = "p") -> list:
    return protocol.encode("poses", {"rid": rid, "job": job, "seq": seq}, {"poses": batch})


def refused(reply: protocol.Message, code: str, *words: str) -> None:
    assert reply.type == "error" and reply.fields["code"] == code, reply.fields
    for word in words:
        assert word in reply.fields["message"], reply.fields


def cancel(dealer: RawDealer, job: str) -> protocol.Message:
    """`cancel`'s reply (a subscriber may get its jobs' events first: queue positions, `cancelled`)."""
    reply = dealer.ask(protocol.encode("cancel", {"rid": "c", "job": job}))
    while reply.fields.get("rid") != "c":
        reply = dealer.read()
    return reply


def open_live(dealer: RawDealer, payload: EpisodePayload, rid: str) -> str:
    reply = dealer.ask(live(payload, rid))
    assert reply.type == "accepted", reply.fields
    return reply.fields["job"]


@pytest.mark.parametrize("prompt", ["", " ", "\n\t"])
def test_a_blank_prompt_is_a_bad_request_on_live_and_submit(held, dealers, prompt):
    _, payload = held
    dealer = dealers()
    refused(dealer.ask(live(payload, "l", prompt=prompt)), "bad_request", "prompt")
    refused(dealer.ask(submit(payload, "s", prompt=prompt)), "bad_request", "prompt")


@pytest.mark.parametrize("far", [np.float32(3e38), np.float64(1e300), 2e9])
def test_translations_float32_maths_cannot_survive_are_refused_whole_and_the_job_goes_on(held, dealers, far):
    _, payload = held
    dealer = dealers()
    bad = payload.poses[:12].astype(type(far))
    bad[5, 0, 3] = far
    refused(dealer.ask(submit(payload, "s", poses=np.concatenate([bad, payload.poses[12:].astype(bad.dtype)]))),
            "bad_input", "translation")  # fmt: skip
    job = open_live(dealer, payload, "far")
    assert dealer.ask(poses(job, 0, payload.poses[:9])).fields["poses"] == 9
    refused(dealer.ask(poses(job, 1, bad)), "bad_input", "translation", "pose 5")
    ok = dealer.ask(poses(job, 1, payload.poses[9:21]))  # the same seq again: nothing of the bad batch was kept
    assert ok.type == "poses_ok" and ok.fields["seq"] == 1 and ok.fields["poses"] == 21, ok.fields
    assert cancel(dealer, job).fields["state"] == "cancelled"


def test_intrinsics_float32_maths_cannot_survive_are_refused_at_the_door(held, dealers):
    """A float64 1e300 focal length is finite where it is checked and inf in the engine's float32 maths."""
    _, payload = held
    dealer = dealers()
    far = copy.copy(payload)  # past the client library's own check (EpisodePayload refuses it): a raw client
    object.__setattr__(far, "intrinsics", np.float64([[1e300, 1e300, 0, 0]]).repeat(len(payload.poses), 0))
    refused(dealer.ask(submit(far, "s")), "bad_input", "intrinsics", "1e+09")
    refused(dealer.ask(live(far, "l")), "bad_input", "intrinsics", "1e+09")


@pytest.mark.parametrize("frame_num", [1, 4, 5, 8])
def test_fast_frames_below_one_chunk_are_bad_settings_at_the_door(held, dealers, frame_num):
    _, payload = held
    dealer = dealers()
    settings = {**FAST, "frame_num": frame_num}
    refused(dealer.ask(live(payload, "l", settings=settings)), "bad_settings", "at least 9 frames")
    refused(dealer.ask(submit(payload, "s", settings={**settings, "steps": 2})), "bad_settings", "at least 9 frames")


@pytest.mark.parametrize("image", [JPEG_MAGIC_ONLY, episode.PNG_MAGIC + b"\x00" * 64])
def test_an_image_of_magic_bytes_only_is_bad_input_at_the_door_and_no_text_names_a_path(held, dealers, image):
    server, payload = held
    dealer = dealers()
    for reply in (dealer.ask(live(payload, "l", image=image)), dealer.ask(submit(payload, "s", image=image))):
        refused(reply, "bad_input", "image")
        message = reply.fields["message"]
        assert str(server.workdir) not in message and "/" not in message, message


def test_only_the_owner_may_append_end_or_cancel_a_job(held, dealers):
    _, payload = held
    owner, other = dealers(), dealers()
    job = open_live(owner, payload, "mine")
    batch = other.ask(submit(payload, "theirs"))
    assert batch.type == "accepted", batch.fields
    for frames in (
        poses(job, 0, payload.poses[:9]),
        protocol.encode("end", {"rid": "e", "job": job}),
        protocol.encode("cancel", {"rid": "c", "job": job}),
    ):
        refused(other.ask(frames), "not_found", job)
    # its owner's job is untouched (seq 0 is still free) and the other may watch it, as documented
    status = other.ask(protocol.encode("status", {"rid": "s", "job": job}))
    assert status.type == "status" and status.fields["state"] == "queued", status.fields
    first = owner.ask(poses(job, 0, payload.poses[:9]))
    assert first.type == "poses_ok" and first.fields["poses"] == 9, first.fields
    # nor may the owner of a live job cancel another's batch job
    refused(owner.ask(protocol.encode("cancel", {"rid": "c2", "job": batch.fields["job"]})), "not_found")
    assert cancel(owner, job).fields["state"] == "cancelled"
    assert cancel(other, batch.fields["job"]).fields["state"] == "cancelled"
