"""The live-job messages on the wire (`live`, `poses`, `end`, `poses_ok`; bridge/wire/live_protocol.py):
round trips and the decoder's refusals, without sockets."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.wire import protocol
from bridge.wire.live_protocol import LiveOpen, PoseBatch, parse_live
from bridge.wire.protocol import ProtocolError, decode_reply, encode, parse_request
from tests.bridge.strategies import PNG

K = np.float32([[502.0, 502.0, 416.0, 240.0], [1.0, 1.0, 1.0, 1.0]])
POSES = np.tile(np.eye(4, dtype=np.float32), (3, 1, 1))


def live_frames(**fields):
    header = {"rid": "r1", "live_v": protocol.LIVE_VERSION, "prompt": "a room", **fields}
    return encode("live", header, {"intrinsics": K}, {"image": PNG})


def parsed(frames):
    request = parse_request(frames)
    return parse_live(request) if isinstance(request, protocol.Message) else request


def test_live_open_and_pose_batch_round_trip():
    opened = parsed(live_frames(settings={"model": "fast"}, want_stills=True))
    assert isinstance(opened, LiveOpen) and opened.want_stills and opened.settings == {"model": "fast"}
    assert opened.intrinsics.shape == (1, 4)  # row 0: one camera
    batch = parsed(encode("poses", {"rid": "r2", "job": "j1", "seq": 4, "end": True}, {"poses": POSES}))
    assert isinstance(batch, PoseBatch) and batch.seq == 4 and batch.end and np.array_equal(batch.poses, POSES)
    end = parse_request(encode("end", {"rid": "r3", "job": "j1"}))
    assert (end.type, end.job) == ("end", "j1")
    ack = {"rid": "r2", "job": "j1", "seq": 4, "poses": 3, "chunks_ready": 0, "chunks_sent": 0, "behind": 0,
           "ended": True}  # fmt: skip
    assert decode_reply(encode("poses_ok", ack)).fields["ended"] is True


@pytest.mark.parametrize(
    ("frames", "code", "words"),
    [
        (live_frames(live_v=2), "bad_version", "live_v 2"),
        (encode("live", {"rid": "r", "live_v": 1, "prompt": "p"}, {"intrinsics": K}), "bad_request", "image"),
        (encode("poses", {"rid": "r", "job": "j", "seq": -1}, {"poses": POSES}), "bad_request", "seq"),
        (encode("poses", {"rid": "r", "job": "j", "seq": 0}, {"poses": POSES[:, :3]}), "bad_request", "shape"),
        (encode("poses", {"rid": "r", "job": "j", "seq": 0}, {"poses": POSES * 2}), "bad_input", "pose 0"),
        (
            encode("poses", {"rid": "r", "job": "j", "seq": 0}, {"poses": np.full((1, 4, 4), np.nan)}),
            "bad_input",
            "NaN",
        ),
        (live_frames()[:1] + [encode("live", {}, {"intrinsics": -K})[1]] + live_frames()[2:], "bad_input", "fx"),
    ],
)
def test_bad_live_messages_are_refused_with_a_named_code(frames, code, words):
    with pytest.raises(ProtocolError) as refused:
        parsed(frames)
    assert refused.value.code == code and words in str(refused.value)
