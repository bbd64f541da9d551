"""The wire format: round trips, every refusal, and hypothesis fuzzing of the decoder."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from bridge.wire import protocol
from bridge.wire.protocol import Limits, ProtocolError, decode_reply, decode_request, encode
from tests.bridge.strategies import INTRINSICS, PNG, POSES, frame_lists, header_of, submit_frames


def test_submit_round_trip_keeps_arrays_exact():
    message = decode_request(submit_frames())
    assert message.type == "submit"
    assert message.fields["rid"] == "r-1" and message.fields["settings"] == {"steps": 4}
    assert message.blobs["image"] == PNG
    np.testing.assert_array_equal(message.arrays["poses"], POSES)
    assert message.arrays["poses"].dtype == np.float32 and message.arrays["poses"].shape == (9, 4, 4)
    np.testing.assert_array_equal(message.arrays["intrinsics"], INTRINSICS)


def test_float64_arrays_stay_float64():
    frames = encode(
        "submit",
        {"rid": "r", "prompt": "p"},
        {"poses": POSES.astype(np.float64), "intrinsics": INTRINSICS},
        {"image": PNG},
    )
    poses = decode_request(frames).arrays["poses"]
    assert poses.dtype == np.float64
    np.testing.assert_array_equal(poses, POSES)


def test_big_endian_input_is_sent_little_endian():
    frames = encode(
        "submit", {"rid": "r", "prompt": "p"}, {"poses": POSES.astype(">f4"), "intrinsics": INTRINSICS}, {"image": PNG}
    )
    np.testing.assert_array_equal(decode_request(frames).arrays["poses"], POSES)


def test_an_empty_pose_batch_encodes_and_decodes_as_zero_rows():
    """Found by the live fuzz (issue 53): a [0, 4, 4] batch raised TypeError in `encode` (a memoryview
    cannot cast a shape with a 0); it travels as an empty frame and the decoder refuses it by name."""
    frames = encode("poses", {"rid": "r", "job": "j", "seq": 0}, {"poses": np.zeros((0, 4, 4), np.float32)})
    assert bytes(frames[1]) == b""
    with pytest.raises(ProtocolError) as refused:
        decode_request(frames)
    assert refused.value.code == "bad_request" and "empty array" in str(refused.value)


def test_result_round_trip_with_frames():
    frames_array = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    frames = encode("result", {"job": "j1", "seconds": 1.5}, {"frames": frames_array}, {"video": b"mp4!"})
    message = decode_reply(frames)
    assert message.blobs["video"] == b"mp4!"
    np.testing.assert_array_equal(message.arrays["frames"], frames_array)


def test_error_frames_round_trip():
    message = decode_reply(protocol.error_frames("busy", "queue full", rid="r-9", job="j"))
    assert message.type == "error"
    assert (message.fields["code"], message.fields["message"], message.fields["rid"]) == ("busy", "queue full", "r-9")


@pytest.mark.parametrize(
    ("frames", "code", "words"),
    [
        ([], "bad_request", "empty message"),
        ([b""], "bad_request", "empty header"),
        ([b"\xc1"], "bad_request", "msgpack"),
        ([msgpack.packb([1, 2])], "bad_request", "not a map"),
        ([msgpack.packb({"v": 2, "type": "health", "rid": "x"})], "bad_version", "version 2"),
        ([msgpack.packb({"v": True, "type": "health", "rid": "x"})], "bad_version", "version"),
        ([msgpack.packb({"type": "health", "rid": "x"})], "bad_version", "version None"),
        ([msgpack.packb({"v": 1, "type": "launch", "rid": "x"})], "bad_request", "unknown message type"),
        ([msgpack.packb({"v": 1, "type": "health"})], "bad_request", "missing field 'rid'"),
        ([msgpack.packb({"v": 1, "type": "health", "rid": "bad id with spaces"})], "bad_request", "rid"),
        ([msgpack.packb({"v": 1, "type": "health", "rid": "x" * 65})], "bad_request", "rid"),
        ([msgpack.packb({"v": 1, "type": "cancel", "rid": "x", "job": 5})], "bad_request", "job"),
        ([msgpack.packb({"v": 1, "type": "health", "rid": "x"}), b"extra"], "bad_request", "describes 0"),
        ([b"x"] * 10, "too_large", "frames"),
        ([b"\x81" + msgpack.packb("a") + msgpack.packb("b" * 70000)], "too_large", "header"),
    ],
)
def test_malformed_requests_are_refused_with_a_code(frames, code, words):
    with pytest.raises(ProtocolError) as info:
        decode_request(frames)
    assert info.value.code == code
    assert words in str(info.value)


def test_bin_and_ext_types_in_the_header_are_refused():
    with pytest.raises(ProtocolError):
        decode_request([msgpack.packb({"v": 1, "type": "health", "rid": "x", "junk": b"\x00" * 10})])
    with pytest.raises(ProtocolError):
        decode_request([msgpack.packb({"v": 1, "type": "health", "rid": "x", "e": msgpack.ExtType(1, b"a")})])


def test_prompt_over_the_cap_is_too_large():
    with pytest.raises(ProtocolError) as info:
        decode_request(submit_frames(prompt="x" * 20000), Limits(max_prompt_bytes=16384))
    assert info.value.code == "too_large"


def test_declared_shape_far_beyond_the_caps_is_refused_before_any_allocation():
    # 10**12 poses would be 64 TB: refused from the header alone, no MemoryError.
    frames = submit_frames()
    header = header_of(frames)
    header["frames"][0]["shape"] = [10**12, 4, 4]
    with pytest.raises(ProtocolError) as info:
        decode_request([msgpack.packb(header), *frames[1:]])
    assert info.value.code == "too_large" and "rows" in str(info.value)


def test_declared_shape_must_match_the_frame_length():
    frames = submit_frames()
    header = header_of(frames)
    header["frames"][0]["shape"] = [8, 4, 4]  # the frame holds 9
    with pytest.raises(ProtocolError, match="frame has"):
        decode_request([msgpack.packb(header), *frames[1:]])


@pytest.mark.parametrize("dtype", ["float16", "object", "<f4", "int64", "V8", "O", None, 7])
def test_dtypes_outside_the_allowlist_are_refused(dtype):
    frames = submit_frames()
    header = header_of(frames)
    header["frames"][0]["dtype"] = dtype
    with pytest.raises(ProtocolError, match="not allowed"):
        decode_request([msgpack.packb(header), *frames[1:]])


def test_uint8_poses_are_refused_even_though_uint8_is_a_wire_dtype():
    frames = encode(
        "submit",
        {"rid": "r", "prompt": "p"},
        {"poses": np.zeros((9, 4, 4), np.uint8), "intrinsics": INTRINSICS},
        {"image": PNG},
    )
    with pytest.raises(ProtocolError, match="not allowed"):
        decode_request(frames)


@pytest.mark.parametrize(
    "shape", [[9, 4], [9, 4, 3], [9, 4, 4, 1], [-1, 4, 4], [9.0, 4, 4], [True, 4, 4], "9,4,4", [0, 4, 4]]
)
def test_bad_shapes_are_refused(shape):
    frames = submit_frames()
    header = header_of(frames)
    header["frames"][0]["shape"] = shape
    with pytest.raises(ProtocolError):
        decode_request([msgpack.packb(header), *frames[1:]])


def test_image_over_its_cap_is_too_large():
    frames = encode(
        "submit",
        {"rid": "r", "prompt": "p"},
        {"poses": POSES, "intrinsics": INTRINSICS},
        {"image": PNG + b"\x00" * 2000},
    )
    with pytest.raises(ProtocolError) as info:
        decode_request(frames, Limits(max_image_bytes=1000))
    assert info.value.code == "too_large"


def test_missing_duplicate_and_unknown_data_frames():
    frames = submit_frames()
    header = header_of(frames)
    with pytest.raises(ProtocolError, match="missing data frame 'image'"):
        decode_request([msgpack.packb({**header, "frames": header["frames"][:2]}), *frames[1:3]])
    duplicate = [header["frames"][0], header["frames"][0], header["frames"][2]]
    with pytest.raises(ProtocolError, match="twice"):
        decode_request([msgpack.packb({**header, "frames": duplicate}), frames[1], frames[1], frames[3]])
    renamed = [{**header["frames"][0], "name": "payload"}, *header["frames"][1:]]
    with pytest.raises(ProtocolError, match="unexpected data frame"):
        decode_request([msgpack.packb({**header, "frames": renamed}), *frames[1:]])


def test_image_format_and_episode_values():
    assert protocol.image_format(protocol.JPEG_MAGIC + b"...") == "jpeg"
    assert protocol.image_format(PNG) == "png"
    with pytest.raises(ProtocolError, match="JPEG or PNG"):
        protocol.image_format(b"GIF89a....")
    bad = POSES.copy()
    bad[3, 0, 0] = np.nan
    with pytest.raises(ProtocolError, match="NaN"):
        protocol.check_episode_arrays(bad, INTRINSICS)
    with pytest.raises(ProtocolError, match="fx, fy"):
        protocol.check_episode_arrays(POSES, INTRINSICS * -1)


def test_peek_rid_survives_garbage():
    assert protocol.peek_rid(msgpack.packb({"rid": "abc"})) == "abc"
    assert protocol.peek_rid(b"\xc1\xc1") is None
    assert protocol.peek_rid(msgpack.packb({"rid": "not ok!"})) is None


# ---------------------------------------------------------------------------------------------
# Fuzzing: whatever arrives, the decoder returns a message or raises ProtocolError, nothing else.


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame_lists)
def test_fuzz_request_decoder_raises_only_protocol_errors(frames):
    try:
        message = decode_request(frames)
    except ProtocolError as exc:
        assert exc.code in protocol.ERROR_CODES
        return
    assert message.type in protocol.REQUESTS


@settings(max_examples=200, deadline=None)
@given(frame_lists)
def test_fuzz_reply_decoder_raises_only_protocol_errors(frames):
    try:
        decode_reply(frames)
    except ProtocolError as exc:
        assert exc.code in protocol.ERROR_CODES


def test_a_watch_may_ask_for_chunks_and_stills_and_other_job_requests_never_carry_them():
    ask = protocol.parse_request(protocol.encode("watch", {"rid": "r1", "job": "j1", "want_chunks": True}))
    assert (ask.type, ask.job, ask.want_chunks, ask.want_stills) == ("watch", "j1", True, False)
    plain = protocol.parse_request(protocol.encode("watch", {"rid": "r2", "job": "j1"}))
    assert not plain.want_chunks and not plain.want_stills
    status = protocol.parse_request(protocol.encode("status", {"rid": "r3", "job": "j1", "want_chunks": True}))
    assert not status.want_chunks  # only a watch subscribes
    with pytest.raises(protocol.ProtocolError, match="want_chunks"):
        protocol.parse_request(protocol.encode("watch", {"rid": "r4", "job": "j1", "want_chunks": "yes"}))
