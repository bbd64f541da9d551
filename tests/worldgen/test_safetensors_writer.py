"""The streaming safetensors writer: files the official library reads back exactly."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from worldgen.runtime.safetensors_writer import SafetensorsWriter, header_bound, save_file

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int64, torch.int8, torch.bool]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=4)),
        min_size=1,
        max_size=8,
    )
)
def test_round_trip_through_the_official_reader(tmp_path_factory, specs):
    path = tmp_path_factory.mktemp("w") / "out.safetensors"
    tensors = {}
    for i, (dtype, shape) in enumerate(specs):
        tensors[f"layer.{i}.weight"] = (torch.randn(shape) * 10).to(dtype)
    metadata = {"format": "pt"}
    with SafetensorsWriter(path, header_bound([(k, t.ndim) for k, t in tensors.items()], metadata), metadata) as w:
        for key, tensor in tensors.items():
            w.add(key, tensor)
    with safe_open(path, "pt") as f:
        assert set(f.keys()) == set(tensors)
        assert f.metadata() == metadata
        for key, tensor in tensors.items():
            back = f.get_tensor(key)
            assert back.dtype == tensor.dtype and torch.equal(back, tensor)


def test_a_failure_leaves_no_file(tmp_path):
    path = tmp_path / "model.safetensors"
    with pytest.raises(RuntimeError, match="boom"), SafetensorsWriter(path, header_bound([("a", 1)])) as w:
        w.add("a", torch.ones(3))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_too_small_a_reserve_is_refused_not_truncated(tmp_path):
    path = tmp_path / "model.safetensors"
    writer = SafetensorsWriter(path, 16)
    writer.add("a_rather_long_tensor_name", torch.ones(3))
    with pytest.raises(RuntimeError, match="reserved"):
        writer.close()
    writer.abort()
    assert not path.exists()


def test_duplicate_keys_and_unstorable_dtypes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="twice"), SafetensorsWriter(tmp_path / "a.safetensors", 256) as w:
        w.add("x", torch.ones(1))
        w.add("x", torch.ones(1))
    with pytest.raises(ValueError, match="complex"), SafetensorsWriter(tmp_path / "b.safetensors", 256) as w:
        w.add("x", torch.ones(1, dtype=torch.complex64))
    assert list(tmp_path.iterdir()) == []


def test_save_file_writes_a_dict_atomically_with_the_umask_mode(tmp_path):
    """`save_file` (bench/synthetic_checkpoint.py): the official reader reads it back, and it is
    0666 & ~umask like any other output, not safetensors' own 0600."""
    tensors = {"a.weight": torch.randn(3, 4).to(torch.bfloat16), "b.bias": torch.arange(5), "c": torch.ones(())}
    old = os.umask(0o022)
    try:
        path = save_file(tensors, tmp_path / "model.safetensors", {"format": "pt"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temporary file left
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert sorted(f.keys()) == sorted(tensors)  # noqa: SIM118 (safe_open is not a dict)
        assert all(torch.equal(f.get_tensor(k), v) and f.get_tensor(k).dtype == v.dtype for k, v in tensors.items())
