"""`worldgen.kernels.triton_lang.launch`: a kernel variant launched straight to Triton's C launcher from
its third launch gives what Triton's own launch gives, a new variant (alignment, an int of 1, a dtype)
goes through Triton first, and an installed launch hook or the switch keeps every launch on Triton's
path. The variant key is checked on the CPU; the launches need a CUDA GPU and Triton."""

from __future__ import annotations

import pytest
import torch

from worldgen.kernels import triton_lang
from worldgen.kernels.triton_lang import _arg_key, launch, tl, triton


def test_the_variant_key_separates_what_triton_specialises_on():
    ints = [1, 2, 16, 2**31, 2**31 + 1, 2**63]  # 1, a multiple of 16 or not, int32 / int64 / uint64
    assert len({_arg_key(n) for n in ints}) == len(ints)
    assert _arg_key(2) == _arg_key(17) and _arg_key(16) == _arg_key(2**31 - 16)  # one variant to Triton too
    assert _arg_key(True) != _arg_key(1) and _arg_key(False) != _arg_key(0)
    assert _arg_key(0.5) == _arg_key(1e-6)  # every float is passed as fp32, never specialised
    x = torch.zeros(8)
    assert _arg_key(x) == _arg_key(torch.ones(8)) != _arg_key(x[1:])  # 16-byte alignment
    assert _arg_key(x) != _arg_key(x.double())
    assert _arg_key(None) != _arg_key(0)
    with pytest.raises(TypeError):
        hash(_arg_key([1, 2]))  # unhashable: `launch` then goes through Triton every time


if triton is not None:

    @triton.jit
    def _axpy_kernel(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr, SQUARE: tl.constexpr = False):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        if SQUARE:
            x = x * x
        tl.store(out_ptr + offsets, alpha * x + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def _axpy(x: torch.Tensor, y: torch.Tensor, alpha: float, square: bool = False, plain: bool = False) -> torch.Tensor:
    """alpha * x (squared) + y through `launch`, or through Triton's own launch (`plain`: the reference,
    bit for bit: Triton fuses the multiply-add, so torch's alpha * x + y may differ in the last bit)."""
    out = torch.empty_like(x)
    grid, n, block = (triton.cdiv(x.numel(), 256),), x.numel(), 256
    if plain:
        _axpy_kernel[grid](x, y, out, alpha, n, BLOCK=block, SQUARE=square)
    else:
        launch(_axpy_kernel, grid, x, y, out, alpha, n, BLOCK=block, SQUARE=square)
    return out


def _plain(x: torch.Tensor, y: torch.Tensor, alpha: float, square: bool = False) -> torch.Tensor:
    want = _axpy(x, y, alpha, square, plain=True)
    assert torch.allclose(want, alpha * (x * x if square else x) + y, rtol=1e-6, atol=1e-6)  # the kernel's sum
    return want


@pytest.fixture
def cuda():
    if not torch.cuda.is_available() or triton is None:
        pytest.skip("needs a CUDA GPU and Triton")
    triton_lang._direct.clear()
    return torch.device("cuda")


@pytest.mark.cuda
def test_a_variant_goes_direct_from_its_third_launch_with_tritons_results(cuda):
    g = torch.Generator(cuda).manual_seed(0)
    counts = triton_lang.counts
    for n in (1000, 4096):  # two variants (a multiple of 16 or not)
        before = (counts.direct, counts.triton)
        for i in range(5):
            x, y = torch.randn(n, generator=g, device=cuda), torch.randn(n, generator=g, device=cuda)
            alpha = 0.5 + i
            assert torch.equal(_axpy(x, y, alpha), _plain(x, y, alpha))
            assert torch.equal(_axpy(x, y, alpha, square=True), _plain(x, y, alpha, True))  # another constexpr
        assert (counts.direct - before[0], counts.triton - before[1]) == (6, 4)


@pytest.mark.cuda
def test_misaligned_int_of_one_and_other_dtypes_are_variants_of_their_own(cuda):
    g = torch.Generator(cuda).manual_seed(1)
    base = torch.randn(1025, generator=g, device=cuda)
    for _ in range(3):
        _axpy(base[:1024], base[:1024], 2.0)  # aligned, direct from now on
    direct = triton_lang.counts.direct
    x = base[1:]  # 4 bytes past a 16-byte boundary: Triton specialises on alignment
    assert torch.equal(_axpy(x, x, 2.0), _plain(x, x, 2.0))
    one = base[:1]  # n == 1 is a constant to Triton
    assert torch.equal(_axpy(one, one, 2.0), _plain(one, one, 2.0))
    for dtype in (torch.float16, torch.bfloat16):
        h = base[:1024].to(dtype)
        assert torch.equal(_axpy(h, h, 2.0), _axpy(h, h, 2.0, plain=True))
    assert triton_lang.counts.direct == direct  # each a first launch: through Triton


@pytest.mark.cuda
def test_a_launch_hook_or_the_switch_keeps_launches_on_tritons_path(cuda, monkeypatch):
    x = torch.ones(512, device=cuda)
    for _ in range(3):
        _axpy(x, x, 1.0)
    seen = []
    hook = seen.append
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        direct = triton_lang.counts.direct
        assert torch.equal(_axpy(x, x, 1.0), 2 * x)
        assert triton_lang.counts.direct == direct and len(seen) == 1  # the profiler's hook saw it
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setenv(triton_lang.DIRECT_SWITCH, "0")
    y = torch.ones(383, device=cuda)  # a variant first seen now (not a multiple of 16)
    for _ in range(4):
        assert torch.equal(_axpy(y, y, 1.0), 2 * y)
    assert triton_lang.counts.direct == direct


@pytest.mark.cuda
def test_direct_launches_are_captured_and_replayed_by_a_cuda_graph(cuda):
    x, y = torch.randn(2048, device=cuda), torch.randn(2048, device=cuda)
    for _ in range(3):
        _axpy(x, y, 3.0)
    direct = triton_lang.counts.direct
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = _axpy(x, y, 3.0)
    assert triton_lang.counts.direct == direct + 1
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _plain(x, y, 3.0))
