"""Ulysses sequence parallelism for the causal DiT's chunk forward: P ranks, one chunk.

Each rank holds a slice of the chunk's tokens for everything that works token by token (the
projections, RMSNorm+RoPE of q and k, the camera layers, the modulations, the cross-attention to the
text, the feed-forward, the head): the GEMMs split P ways. Self-attention needs every token, so around
it one all-to-all turns q, k, v [B, tokens/P, all heads, d] into [B, all tokens, heads/P, d], the
rank attends with its heads (its KV cache holds only those heads: `num_heads / P` per rank, the rolling
rules unchanged since they count tokens, not heads), and the inverse all-to-all brings the output back
to [B, tokens/P, all heads * d] for the output projection. The head's 64-channel output is gathered.

The token split pads: a chunk of L tokens becomes ceil(L/P)*P rows, rank r holding rows
[r*ceil(L/P), (r+1)*ceil(L/P)); the padding rows (zeros) pass through the per-token work and are
dropped after the first all-to-all (never a key, never written into the cache) and after the gather.
Heads must divide by P (1.3B: 12, 14B: 40).

The DiT calls into this only where `model.sequence_parallel` / `self_attn.sequence_parallel` is set
(`attach`); with one device nothing here runs. A collective that fails because a peer went away
raises `PeerLost`; the process group's timeout bounds how long a silent peer is waited for.

Per layer the link carries two all-to-alls: q, k and v in one (each copied once into its destination's
slot of one send buffer: no stack, then permute), and the attention's output back. `sent_bytes` and
`received_bytes` count what crossed the link from and to this rank (host arithmetic from the tensors'
sizes, no synchronisation): the bench reads them per chunk.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from worldgen.errors import PeerLost  # another rank died, or stopped answering within the group's timeout
from worldgen.kernels.fp8 import QuantizedTensor


class SequenceParallel:
    """One rank's view of a chunk forward split over `world` ranks (the default process group)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.tokens = 0  # the current forward's token count (before padding), set by `shard`
        self.sent_bytes = self.received_bytes = 0  # what crossed the link from / to this rank, so far

    def count(self, sent: int, received: int) -> None:
        self.sent_bytes += sent
        self.received_bytes += received

    # -- tokens ------------------------------------------------------------------------------------
    def rows(self, tokens: int) -> int:
        """Rows each rank holds for a chunk of `tokens` tokens (the padded split)."""
        return -(-tokens // self.world)

    def shard(self, x: torch.Tensor, dim: int = 1, fill: float = 0.0) -> torch.Tensor:
        """This rank's rows of `x` along `dim` (the token axis), padded with `fill` to whole slices."""
        n = x.shape[dim]
        rows = self.rows(n)
        pad = rows * self.world - n
        if pad:
            widths = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, pad]
            x = F.pad(x, widths, value=fill)
        return x.narrow(dim, self.rank * rows, rows)

    def begin(self, tokens: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        """The forward's residual stream [B, L, dim] and RoPE tables [L, d/2] -> this rank's rows of both."""
        self.tokens = tokens.shape[1]
        cos, sin = rope
        return self.shard(tokens), (self.shard(cos, 0, 1.0), self.shard(sin, 0, 0.0))

    def shard_camera(self, cams: list) -> list:
        """Each block's camera input (None, tokens [1, L, dim] or a (scale, shift) pair) -> this rank's rows;
        a tensor shared by several blocks is sliced once."""
        done: dict[int, object] = {}
        out = []
        for cam in cams:
            if cam is None:
                out.append(None)
                continue
            if id(cam) not in done:
                done[id(cam)] = tuple(map(self.shard, cam)) if isinstance(cam, tuple) else self.shard(cam)
            out.append(done[id(cam)])
        return out

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's rows [B, rows, C] -> the whole chunk [B, L, C] (padding dropped), on every rank."""
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self._collective(dist.all_gather, parts, x.contiguous())
        self.count(x.nbytes * (self.world - 1), x.nbytes * (self.world - 1))
        return torch.cat(parts, dim=1)[:, : self.tokens]

    # -- heads -------------------------------------------------------------------------------------
    def to_heads(self, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each of `parts` [B, rows, n, d] (this rank's tokens, all heads: q, k, v) -> [B, L, n/P, d] (every
        token, this rank's heads), padding rows dropped: one all-to-all for all of them. Each part is copied
        once, straight into its slot of the send buffer [destination rank, part, B, rows, n/P, d]."""
        b, rows, n, d = parts[0].shape
        local = n // self.world
        send = parts[0].new_empty((self.world, len(parts), b, rows, local, d))
        for i, part in enumerate(parts):
            send[:, i].copy_(part.reshape(b, rows, self.world, local, d).permute(2, 0, 1, 3, 4))
        recv = torch.empty_like(send)  # [source rank (its tokens), part, B, rows, n/P, d]
        self._collective(dist.all_to_all_single, recv, send)
        moved = send.nbytes // self.world * (self.world - 1)
        self.count(moved, moved)
        whole = recv.permute(1, 2, 0, 3, 4, 5).reshape(len(parts), b, self.world * rows, local, d)
        return tuple(whole[:, :, : self.tokens].unbind(0))

    def to_tokens(self, out: torch.Tensor, num_heads: int) -> torch.Tensor:
        """The attention's output [B, L, n/P * d] (every token, this rank's heads) -> [B, rows, n * d]
        (this rank's tokens, every head), the inverse all-to-all."""
        b, length, width = out.shape
        rows, local = self.rows(length), num_heads // self.world
        d = width // local
        out = F.pad(out, (0, 0, 0, rows * self.world - length)).view(b, self.world, rows, local, d)
        send = out.permute(1, 0, 2, 3, 4).contiguous()  # [destination rank (its tokens), B, rows, n/P, d]
        recv = torch.empty_like(send)  # [source rank (its heads), B, rows, n/P, d]
        self._collective(dist.all_to_all_single, recv, send)
        moved = send.nbytes // self.world * (self.world - 1)
        self.count(moved, moved)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, rows, num_heads * d)

    def attention_output(self, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv) -> torch.Tensor:
        """`SelfAttention.attention_output` over the ranks: [B, rows, n, d] q/k/v -> [B, rows, dim]. Each rank
        attends with its heads as one device does (`SelfAttention.attention_output`: cuDNN's FP8 attention under fp8,
        INT8 under int8); an FP8 output is dequantized before the inverse all-to-all, since each rank's has its
        own scale and the output projection takes one."""
        q, k, v = self.to_heads(q, k, v)
        attended = attn.attention_output(q, k, v, kv, heads_here=True)
        if isinstance(attended, QuantizedTensor):
            attended = attended.dequantize(q.dtype).flatten(2)
        return self.to_tokens(attended, attn.num_heads)

    def write_keys(self, kv, k: torch.Tensor, v: torch.Tensor) -> None:
        """`SelfAttention.write_keys` over the ranks: this rank's heads of every token into its cache."""
        k, v = self.to_heads(k, v)
        kv.write(k, v)

    def _collective(self, op, *args) -> None:
        try:
            op(*args)
        except (RuntimeError, ValueError) as exc:  # gloo/NCCL: the peer closed its connection, the timeout
            # passed, or the group was aborted (its peer gone: `worldgen.pipelines.two_gpu`) and is no more
            raise PeerLost(
                f"rank {self.rank}: a sequence-parallel peer was lost ({str(exc).splitlines()[0][:200]})"
            ) from exc

    # -- the model ---------------------------------------------------------------------------------
    def attach(self, model) -> None:
        """Route `model`'s chunk forwards through this split (a `WanCameraDiT`; its heads divide by P)."""
        heads = model.cfg.num_heads
        if heads % self.world:
            raise ValueError(f"{heads} attention heads do not split over {self.world} ranks")
        model.sequence_parallel = self
        for block in model.blocks:
            block.self_attn.sequence_parallel = self

    def before_forward(self, model, x, t, context, y, cam, cache, rope, keys_only: bool) -> None:
        """Called first in each sharded forward (the leader sends the call to its peers here)."""
