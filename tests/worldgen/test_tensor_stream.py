"""Streaming tensors out of safetensors files in batched sequential reads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from worldgen.errors import CheckpointError
from worldgen.runtime.tensor_stream import StagingBuffer, stream_safetensors


@settings(max_examples=20, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=12),
    capacity=st.sampled_from([64, 256, 1024, 64 * 2**20]),
    subset_seed=st.integers(0, 2**16),
)
def test_every_tensor_comes_back_exactly(tmp_path_factory, sizes, capacity, subset_seed):
    """Buffers smaller and larger than the tensors, subsets with gaps: the same tensors as the official reader."""
    path = tmp_path_factory.mktemp("s") / "m.safetensors"
    g = torch.Generator().manual_seed(subset_seed)
    dtypes = [torch.float32, torch.bfloat16, torch.uint8, torch.int64]
    tensors = {f"t{i:02d}": (torch.randn(n, generator=g) * 50).to(dtypes[i % 4]) for i, n in enumerate(sizes)}
    save_file(tensors, path)
    expected = load_file(path)
    keys = [k for k in tensors if torch.rand(1, generator=g).item() < 0.7] or list(tensors)
    got = dict(stream_safetensors(path, keys, "cpu", None, StagingBuffer(capacity, pin=False)))
    assert list(got) == sorted(keys, key=list(expected).index) or set(got) == set(keys)
    for key in keys:
        assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key])


def test_yielded_tensors_own_their_bytes(tmp_path):
    """The staging buffers are reused: tensors kept from an early read must not change later."""
    path = tmp_path / "m.safetensors"
    save_file({f"t{i}": torch.full((100,), float(i)) for i in range(10)}, path)
    kept = list(stream_safetensors(path, None, "cpu", None, StagingBuffer(512, pin=False)))
    assert [t[0].item() for _, t in kept] == [float(i) for i in range(10)]


def test_truncated_file_names_the_fix(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(1000), "b": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated.*re-download"):
        list(stream_safetensors(path))


def test_unaligned_tensors_in_one_read(tmp_path):
    """Files written tensor by tensor (our quantize output) are not aligned: odd-sized uint8 then float32."""
    from worldgen.runtime.safetensors_writer import SafetensorsWriter, header_bound

    tensors = {"a": torch.arange(5, dtype=torch.uint8), "b": torch.randn(7), "c": torch.randn(3).bfloat16()}
    path = tmp_path / "m.safetensors"
    with SafetensorsWriter(path, header_bound([(k, 1) for k in tensors])) as w:
        for key, tensor in tensors.items():
            w.add(key, tensor)
    got = dict(stream_safetensors(path, None, "cpu", None, StagingBuffer(2**20, pin=False)))
    assert all(torch.equal(got[k], tensors[k]) for k in tensors)


def test_prefetch_reads_in_the_background_and_ignores_missing_files(tmp_path):
    from worldgen.runtime.tensor_stream import prefetch_into_page_cache

    present = tmp_path / "a.bin"
    present.write_bytes(b"x" * 3_000_000)
    thread = prefetch_into_page_cache([tmp_path / "missing.bin", present])
    thread.join(timeout=30)
    assert not thread.is_alive() and thread.daemon


def test_model_slot_prefetches_only_what_is_not_loaded():
    from worldgen.runtime.residency import ModelSlot

    calls = []
    slot = ModelSlot("x", lambda: torch.nn.Linear(1, 1), prefetch=lambda: calls.append(1))
    slot.prefetch()
    slot.get()
    slot.prefetch()
    assert calls == [1]
