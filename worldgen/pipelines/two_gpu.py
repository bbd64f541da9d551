"""A causal job (model fast or causal) on two devices of one host: each chunk forward split over two ranks.

Rank 0 is the pipeline's own process: the text, the VAE's encode and decode, the chunk loop and its
scheduler, and rank 0's half of every DiT forward. Rank 1 is a process spawned here (`follower_main`)
that holds its own copy of the DiT's weights on the second device and runs only the other half of each
forward (the split: `worldgen.models.sequence_parallel`, Ulysses over the heads). It learns each call
from rank 0 (`Leader.before_forward`: a small header over a pipe, then x and t, and when they change y,
the camera and the text, by broadcast) and each KV cache's life (made, grown, closed: `LeaderKVCache`).
Each rank's caches hold half the heads; their token bookkeeping (and so rolling) is the same on both.

The process group is gloo on the CPU, NCCL on CUDA, with a timeout (`contracts.engine_options.PEER_TIMEOUT_S`).
A peer that dies closes its connections: the other rank's next collective or send fails with `PeerLost`
(the rollout's error); the follower also exits when the leader's pipe closes, or its parent is gone.
One two-device pipeline per process (the group is the process's default one).

NCCL, which the CPU tests cannot run: its collectives are queued on the GPU and return at once, so a dead
peer shows as a kernel that never ends, not as an error. Rank 0 therefore watches rank 1's process (`_watch`,
a thread): when it is gone, the group is aborted (its kernels end), the forward being run fails with
`PeerLost`, and each forward's gathered output is waited for and checked (one event a forward, waited for one
forward late, and the last before a chunk is handed out: `Leader.verify`), so a forward that ran into the abort
is never taken for a result. A silent peer (alive, stuck) is the watchdog's: `TORCH_NCCL_ASYNC_ERROR_HANDLING=2`
aborts the group after the timeout without taking the worker down, and the next collective fails with `PeerLost`. The environment (`LINK_ENVIRONMENT`) is set
before the group starts, in this process and so in rank 1's: NVLink multicast (NVLS) off, which the lent
two-GPU machines forbid. The wait is a host synchronisation on the forward before the last, so the GPU still has
one queued while the host waits.
`TwoDevices.peer_stats` asks rank 1 for its device's memory figures (its peak: the bench's per-GPU peak) and
its link counters.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from contracts.engine_options import PEER_LOAD_TIMEOUT_S, PEER_TIMEOUT_S
from worldgen.models.block_graphs import BlockGraphs
from worldgen.models.camera_cache import CameraCache
from worldgen.models.kv_cache import CacheSpec, KVCache
from worldgen.models.positions import rope_tables
from worldgen.models.sequence_parallel import PeerLost, SequenceParallel
from worldgen.pipelines.fast_plan import hold_nf4_weights
from worldgen.runtime.metering import ForwardClock

WORLD = 2
# set (unless already set) before a two-device group starts: NVLink multicast off (NCCL's NVLS, PyTorch's
# symmetric memory, NVSHMEM), and NCCL's watchdog aborts a timed-out group without killing the process
LINK_ENVIRONMENT = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
}
WATCH_S = 0.5  # how often rank 0 looks whether rank 1's process is still there (CUDA)
DitFactory = Callable[[], torch.nn.Module]  # picklable (a top-level function or a partial of one): runs in rank 1


def backend_for(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _group(device: torch.device, timeout: datetime.timedelta) -> dict[str, Any]:
    """The process group's settings for a rank on `device`: NCCL bound to its GPU (not the one its rank
    number would guess: `--gpus 2,3`), gloo on the CPU; the timeout bounds every collective."""
    bound = {"device_id": device} if device.type == "cuda" else {}
    return {"backend": backend_for(device), "world_size": WORLD, "timeout": timeout, **bound}


def _link_environment() -> None:
    for name, value in LINK_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def _meta(tensor: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(tensor.shape), tensor.dtype


class Leader(SequenceParallel):
    """Rank 0's split: `SequenceParallel` plus handing every forward and cache event to rank 1."""

    def __init__(self, conn, process) -> None:
        super().__init__(0, WORLD)
        self.conn, self.process = conn, process
        self.lost: str | None = None  # why the peer is gone, once it is: every later call fails with it
        self.caches = 0
        self.held: dict[str, torch.Tensor | None] = {}  # the y and camera tensors rank 1 holds (by identity)
        # the timestep tensors rank 1 holds, by the id of rank 0's (kept here, so no other tensor takes that id): a
        # forward names its step and rank 1 never reads t on the host (a device sync: it could not queue ahead)
        self.steps: dict[int, torch.Tensor] = {}
        self.forwards = 0  # forwards handed to rank 1
        self.pending: torch.cuda.Event | None = None  # the last forward's end, not yet waited for (`gather`)

    def send(self, message: dict[str, Any], quiet: bool = False) -> None:
        """A header to rank 1; `quiet` (a cache's close in a `finally`): a lost peer is not raised again."""
        if self.lost is None:
            try:
                if not self.process.is_alive():
                    raise BrokenPipeError(f"it exited with code {self.process.exitcode}")
                self.conn.send(message)
                return
            except (OSError, EOFError) as exc:
                self.lost = f"rank 1 (pid {self.process.pid}) is gone: {self._peer_error() or exc}"
        if not quiet:
            raise PeerLost(self.lost)

    def _peer_error(self) -> str | None:
        """What rank 1 said before it went (its error), if anything."""
        try:
            while self.conn.poll(0.2):
                message = self.conn.recv()
                if message.get("op") == "error":
                    return message["error"]
        except (OSError, EOFError):
            pass
        return None

    def _collective(self, op, *args) -> None:
        if self.lost is not None:
            raise PeerLost(self.lost)
        try:
            super()._collective(op, *args)
        except PeerLost as exc:  # the collective may fail before the watch (`_watch`) sees the process gone
            if self.lost is None:
                said = self._peer_error()
                self.lost = f"rank 1 (pid {self.process.pid}) is gone: {exc}{f'; rank 1 said: {said}' if said else ''}"
            raise PeerLost(self.lost) from exc.__cause__

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """`SequenceParallel.gather`, and on CUDA the forward before this one waited for: a group aborted under it
        (its peer gone) fails it here. One forward late, so the GPU has this one queued while the host waits and
        prepares the next (waiting for this one left both GPUs idle while it launched the next forward's first
        kernels); `verify` waits for the last one before a chunk is handed out."""
        out = super().gather(x)
        if x.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            self.verify()
            self.pending = done
        return out

    def verify(self) -> None:
        """Wait for the last forward handed to rank 1 (CUDA) and fail with `PeerLost` if its group was aborted under
        it: its output is then no result. The pipelines call it before they hand out a chunk."""
        if self.pending is not None:
            self.pending.synchronize()
            self.pending = None
        if self.lost is not None:
            raise PeerLost(self.lost)

    def before_forward(self, model, x, t, context, y, cam, cache, rope, keys_only: bool) -> None:
        if not isinstance(cache, LeaderKVCache):
            raise ValueError("a two-device forward needs the pipeline's KV cache (worldgen.pipelines.two_gpu)")
        send_y, send_cam = y is not self.held.get("y"), cam is not None and cam is not self.held.get("cam")
        send_t = self.steps.get(id(t)) is not t
        text = None
        if not cache.has_text:  # the text keys/values are made on a cache's first call only
            text = list(context) if isinstance(context, (list, tuple)) else list(context.unbind(0))
        camera = model.camera_cache
        self.send(
            {
                "op": "forward",
                "id": cache.peer_id,
                "call": cache.call,
                "keys_only": keys_only,
                "x": _meta(x),
                "t": (id(t), _meta(t) if send_t else None),  # the step's key, and its tensor's shape when new
                "y": _meta(y) if send_y else None,
                "cam": None if cam is None else _meta(cam) if send_cam else "held",
                "text": None if text is None else [_meta(c) for c in text],
                "camera_blocks": None if camera is None else camera.covered(len(model.blocks)),
                # rank 0's blocks replayed as CUDA graphs between the attentions: rank 1 does the same, or it
                # launches every kernel from the host while rank 0 waits in the next all-to-all
                "block_graphs": model.block_graphs is not None and model.block_graphs.allowed,
                "compute": model.blocks[0].self_attn.compute,  # a pipeline's `set_compute` (bench_fast's)
                "held_blocks": getattr(model, "held_blocks", 0),  # an NF4 DiT's blocks holding 8-bit weights
            }
        )
        for tensor in (
            x,
            *([t] if send_t else []),
            *([y] if send_y else []),
            *([cam] if send_cam else []),
            *(text or []),
        ):
            self._collective(dist.broadcast, tensor.contiguous(), 0)
            self.count(tensor.nbytes * (self.world - 1), 0)
        self.held["y"], self.forwards = y, self.forwards + 1
        self.steps[id(t)] = t
        if send_cam:
            self.held["cam"] = cam


class LeaderKVCache(KVCache):
    """Rank 0's KV cache (its heads); made, grown and closed on rank 1 alike, and each call's tokens noted."""

    def __init__(
        self,
        leader: Leader,
        spec: CacheSpec,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        dtype,
        device,
        start_tokens,
    ):
        super().__init__(spec, num_layers, num_heads, head_dim, dtype, device, start_tokens)
        self.leader, self.peer_id, self.call = leader, leader.caches, (0, 0)
        leader.caches += 1
        shape = {"layers": num_layers, "heads": num_heads, "head_dim": head_dim, "dtype": dtype, "start": start_tokens}
        leader.send({"op": "cache", "id": self.peer_id, "spec": spec, **shape})

    def begin(self, current_start: int, num_tokens: int) -> None:
        super().begin(current_start, num_tokens)
        self.call = (current_start, num_tokens)

    def grow(self) -> None:
        super().grow()
        self.leader.send({"op": "grow", "id": self.peer_id})

    def close(self) -> None:
        super().close()
        self.leader.held.clear()
        self.leader.steps.clear()
        self.leader.send({"op": "close", "id": self.peer_id}, quiet=True)


class TwoDevices:
    """Rank 0's handle on a two-device causal job: rank 1's process, the split, the per-rank caches.
    Made by `use_two_devices`; `close` stops rank 1 (also at exit)."""

    def __init__(
        self,
        dit_factory: DitFactory,
        devices: list[str],
        timeout_s: float = PEER_TIMEOUT_S,
        load_timeout_s: float = PEER_LOAD_TIMEOUT_S,
    ) -> None:
        if len(devices) != WORLD:
            raise ValueError(f"a two-device job takes two devices, not {devices}")
        self.devices = [torch.device(d) for d in devices]
        self.dit_factory, self.timeout_s, self.load_timeout_s = dit_factory, timeout_s, load_timeout_s
        self.process = None
        self._start()

    def _start(self) -> None:
        """Spawn rank 1 and join it in a process group (rank 1 then loads its weights: `wait_ready`)."""
        if dist.is_initialized():
            raise RuntimeError("this process already has a process group: one two-device pipeline per process")
        _link_environment()  # before the group, and before rank 1 is spawned: it inherits them
        self.ready = False
        self._dir = tempfile.mkdtemp(prefix="lingbot-two-devices-")
        store = f"file://{os.path.join(self._dir, 'store')}"  # a file rendezvous: no port to pick
        context = mp.get_context("spawn")
        self.conn, child = context.Pipe()
        args = (child, store, str(self.devices[1]), self.timeout_s, self.dit_factory, os.getpid())
        self.process = context.Process(target=follower_main, args=args, name="lingbot-rank1", daemon=True)
        self.process.start()
        child.close()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        try:
            dist.init_process_group(init_method=store, rank=0, **_group(self.devices[0], timeout))
        except RuntimeError as exc:  # rank 1 never joined (it died while starting)
            self.process.kill()
            self.process = None
            raise PeerLost(f"rank 1 did not join the process group: {exc}") from exc
        self.leader = Leader(self.conn, self.process)
        self.starts = getattr(self, "starts", 0) + 1
        self.peer_stats_at_close: dict[str, Any] | None = None
        self._closing = threading.Event()  # this rank 1's: set by `close`
        if self.devices[0].type == "cuda":  # gloo fails a collective with a closed peer at once; NCCL waits
            watch = (self.process, self.leader, self._closing)
            threading.Thread(target=_watch, args=watch, name="lingbot-rank1-watch", daemon=True).start()
        atexit.register(self.close)

    def verify(self) -> None:
        """The last forward waited for and checked (`Leader.verify`): before a chunk is handed out."""
        self.leader.verify()

    @property
    def peer_pid(self) -> int | None:
        return self.process.pid

    def wait_ready(self) -> None:
        """Wait (bounded) until rank 1 has its weights: its first collective would otherwise time out."""
        deadline = time.monotonic() + self.load_timeout_s
        while not self.ready:
            if self.leader.lost is not None:
                raise PeerLost(self.leader.lost)
            try:
                if self.conn.poll(0.5):
                    message = self.conn.recv()
                    if message.get("op") == "error":
                        raise EOFError(message["error"])
                    self.ready = message.get("op") == "ready"
                elif not self.process.is_alive():
                    raise EOFError(f"it exited with code {self.process.exitcode}")
                elif time.monotonic() > deadline:
                    raise EOFError(f"it did not load its DiT within {self.load_timeout_s:g} s")
            except (OSError, EOFError) as exc:
                self.leader.lost = f"rank 1 (pid {self.process.pid}) is gone: {exc}"
                raise PeerLost(self.leader.lost) from exc

    def new_cache(self, model, spec: CacheSpec, cfg, dtype: torch.dtype, device, start_tokens: int) -> KVCache:
        """A rollout's cache on rank 0 (its half of the heads), the same made on rank 1; `model` split first.
        A rank 1 lost in an earlier job (that job failed with PeerLost) is started afresh first: the next job runs."""
        if self.process is None or self.leader.lost is not None or not self.process.is_alive():
            self.close()  # ... as is one that died between jobs: the job runs on a new one
            self._start()
        self.wait_ready()
        self.leader.attach(model)
        heads = cfg.num_heads // WORLD
        return LeaderKVCache(self.leader, spec, cfg.num_layers, heads, cfg.head_dim, dtype, device, start_tokens)

    def peer_stats(self, reset: bool = False, timeout_s: float = 10.0) -> dict[str, Any]:
        """Rank 1's figures, asked between forwards: its device, `peak_allocated_bytes` (CUDA's
        `max_memory_allocated` since its start or the last `reset`; None on the CPU), `allocated_bytes`,
        `peak_rss_gib` (its process's), what crossed the link from and to it (`sent_bytes`, `received_bytes`: rank
        0's `received_bytes` and `sent_bytes` seen from the other end), its allocator's `alloc_retries` at the cap
        since its start, and its `clock` (`ForwardClock.figures`, since its start or the last `reset`)."""
        return self._ask({"op": "stats", "reset": reset}, timeout_s)["stats"]

    def peer_region(
        self, factory: Callable[[], contextlib.AbstractContextManager] | None, timeout_s: float = 120.0
    ) -> None:
        """Rank 1 enters `factory()` (picklable: it is made in rank 1's process) before the next forward it is handed,
        and leaves it at `peer_region(None)`, which waits until it has (bounded): what rank 0's process runs around
        a rollout, rank 1's runs around its half (the bench's profile: `bench.kernel_profile.profiled`). A region
        that fails to enter or leave raises RuntimeError here with rank 1's error; rank 1 goes on."""
        error = self._ask({"op": "region", "factory": factory}, timeout_s).get("error")
        if error:
            raise RuntimeError(f"rank 1's region: {error}")

    def _ask(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send `message` to rank 1 (between forwards) and wait (bounded) for its answer, of the same op."""
        self.wait_ready()  # its "ready" comes first (a load still under way), not to be taken for an answer
        self.leader.send(message)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.conn.poll(0.2):
                    answer = self.conn.recv()
                    if answer.get("op") == message["op"]:
                        return answer
                    if answer.get("op") == "error":
                        raise EOFError(answer["error"])
                elif not self.process.is_alive():
                    raise EOFError(f"it exited with code {self.process.exitcode}")
        except (OSError, EOFError) as exc:
            self.leader.lost = f"rank 1 (pid {self.process.pid}) is gone: {exc}"
            raise PeerLost(self.leader.lost) from exc
        raise PeerLost(f"rank 1 (pid {self.process.pid}) did not answer {message['op']!r} within {timeout_s:g} s")

    def close(self) -> None:
        """Stop rank 1 and leave the process group (idempotent); rank 1's last figures (`peer_stats`) are
        kept in `peer_stats_at_close` (None if it was lost)."""
        if self.process is None:
            return
        atexit.unregister(self.close)
        self._closing.set()
        if self.leader.lost is None and self.ready and self.process.is_alive():  # a loading rank 1 is not waited for
            with contextlib.suppress(PeerLost):
                self.peer_stats_at_close = self.peer_stats(timeout_s=5.0)
        self.leader.send({"op": "stop"}, quiet=True)
        self.process.join(timeout=10 if self.leader.lost is None else 0)  # a lost peer is not waited for
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        self.process = None
        self.conn.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(self._dir, ignore_errors=True)


def _watch(process, leader: Leader, closing: threading.Event) -> None:
    """Rank 0's watch over one rank 1's process (CUDA): once it is gone, the group is aborted, so that no NCCL
    kernel waits for it until the timeout; the leader's next send, collective or gathered output fails."""
    while not closing.wait(WATCH_S):
        if process.is_alive():
            continue
        if leader.lost is None:
            leader.lost = f"rank 1 (pid {process.pid}) is gone: it exited with code {process.exitcode}"
        if not closing.is_set() and dist.is_initialized():
            with contextlib.suppress(Exception):  # already aborted or destroyed: nothing left to end
                dist.distributed_c10d._abort_process_group()
        return


def use_two_devices(pipe, dit_factory: DitFactory, devices: list[str], **kwargs: Any) -> TwoDevices:
    """Give a Fast (or causal-pretrain) pipeline a second rank: its rollouts then split each forward over
    `devices` (rank 0 is the pipeline's device). Whole captured forwards (`chunk_graph`) are off while it is attached: a
    replay would run rank 0's half without handing rank 1 the call; the blocks' graphs stay (each rank
    replays the parts between its attentions, whose all-to-alls run eagerly: `worldgen.models.block_graphs`)."""
    handle = TwoDevices(dit_factory, devices, **kwargs)
    pipe.scale_out = handle
    pipe.ranks = WORLD
    return handle


# -- rank 1 ------------------------------------------------------------------------------------------
def follower_main(conn, store: str, device: str, timeout_s: float, dit_factory: DitFactory, parent: int) -> None:
    """Rank 1's process: join the group, load the DiT, then run the other half of every forward rank 0
    hands over until told to stop, or until rank 0 is gone (its pipe closed, or no parent)."""
    _link_environment()  # inherited from rank 0 already; set here too for a rank started otherwise
    on = torch.device(device)
    if on.type == "cuda":
        torch.cuda.set_device(on)
    else:  # the two ranks share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD))
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(init_method=store, rank=1, **_group(on, timeout))
    try:
        model = dit_factory()
        split = SequenceParallel(1, WORLD)
        split.attach(model)
        conn.send({"op": "ready"})
        with torch.no_grad():
            _serve(conn, model, split, on, parent)
    except (PeerLost, EOFError, OSError) as exc:  # rank 0 is gone: nothing to tell it
        print(f"lingbot rank 1: {type(exc).__name__}: {exc}", file=sys.stderr)
        os._exit(3)
    except BaseException as exc:  # noqa: BLE001  (anything else: said to rank 0, whose job fails with it)
        traceback.print_exc()
        with contextlib.suppress(OSError, EOFError):
            conn.send({"op": "error", "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    dist.destroy_process_group()


def _serve(conn, model, split: SequenceParallel, device: torch.device, parent: int) -> None:
    caches: dict[int, KVCache] = {}
    held: dict[str, torch.Tensor | None] = {}
    # one tensor per rank 0's timestep tensor (`Leader.steps`), so the model's time cache (keyed by the tensor)
    # computes each once a job as rank 0's does: the 14B's time projection is a large dequantized weight for one row
    # (`WanCameraDiT.time_cache`)
    steps: dict[int, torch.Tensor] = {}
    held_weights: tuple[str, int] | None = None  # (compute, blocks) of the 8-bit weights an NF4 DiT holds
    model.time_cache = {}
    region = contextlib.ExitStack()  # `TwoDevices.peer_region`'s (left when rank 1 is told to stop)
    clock = ForwardClock(device.type == "cuda")

    def receive(meta) -> torch.Tensor:
        tensor = torch.empty(meta[0], dtype=meta[1], device=device)
        split._collective(dist.broadcast, tensor, 0)
        split.count(0, tensor.nbytes)
        return tensor

    while True:
        if not conn.poll(1.0):  # idle between jobs: nothing waits in a collective
            if os.getppid() != parent:
                raise EOFError("rank 0's process is gone")
            continue
        message = conn.recv()
        op = message["op"]
        if op == "stop":
            region.close()
            return
        if op == "stats":
            conn.send({"op": "stats", "stats": _stats(split, clock, device, message["reset"])})
        elif op == "region":
            conn.send({"op": "region", "error": _region(region, message["factory"])})
        elif op == "cache":
            shape = (message["layers"], message["heads"], message["head_dim"], message["dtype"])
            caches[message["id"]] = KVCache(message["spec"], *shape, device, start_tokens=message["start"])
        elif op == "grow":
            caches[message["id"]].grow()
        elif op == "close":
            caches.pop(message["id"]).close()
            held.clear()
            steps.clear()
            model.camera_cache, model.time_cache = None, {}
            if model.block_graphs is not None:  # they read the closed cache's text keys
                model.block_graphs.close()
                model.block_graphs = None
        elif op == "forward":
            arrived = time.perf_counter()
            x = receive(message["x"])
            step, t_meta = message["t"]
            if t_meta is not None:
                steps[step] = receive(t_meta)
            t = steps[step]
            if message["y"] is not None:
                held["y"] = receive(message["y"])
            if message["cam"] not in (None, "held"):
                held["cam"] = receive(message["cam"])
            cam = None if message["cam"] is None else held["cam"]
            text = None if message["text"] is None else [receive(meta) for meta in message["text"]]
            blocks = message["camera_blocks"]  # rank 0's camera cache, mirrored (the same blocks covered)
            if blocks is None:
                model.camera_cache = None
            elif model.camera_cache is None or model.camera_cache.max_blocks != blocks:
                model.camera_cache = CameraCache(blocks)
            if message["block_graphs"] and model.block_graphs is None:
                model.block_graphs = BlockGraphs()
            elif not message["block_graphs"] and model.block_graphs is not None:
                model.block_graphs.close()
                model.block_graphs = None
            if message["compute"] != model.blocks[0].self_attn.compute:
                model.set_compute(message["compute"])  # drops the held 8-bit weights of another compute
                held_weights = None
            if (message["compute"], message["held_blocks"]) != held_weights:  # rank 0's plan's, mirrored
                hold_nf4_weights(model, message["compute"], message["held_blocks"])
                held_weights = (message["compute"], message["held_blocks"])
            cache = caches[message["id"]]
            current_start, tokens = message["call"]
            f, h, w = model.grid(x)
            cache.begin(current_start, tokens)
            rope = rope_tables(model.cfg.head_dim, (f, h, w), device, current_start // (h * w))
            received, began = time.perf_counter(), clock.event()
            model.forward_tokens(x, t, text, held["y"], cam, cache, rope, message["keys_only"])
            clock.add(arrived, received, began)
            cache.commit()


def _region(region: contextlib.ExitStack, factory) -> str | None:
    """Leave the region rank 1 is in (if any), then enter `factory()` (if given); -> the failure, said to rank 0."""
    try:
        region.close()
        if factory is not None:
            region.enter_context(factory())
    except Exception as exc:  # noqa: BLE001  (a region is the bench's: its failure is said, the rank goes on)
        return f"{type(exc).__name__}: {exc}"
    return None


def _stats(split: SequenceParallel, clock: ForwardClock, device: torch.device, reset: bool) -> dict[str, Any]:
    """Rank 1's figures (`TwoDevices.peer_stats`); `reset` starts its peak memory and its clock again."""
    from worldgen.runtime.metering import peak_rss_gib

    cuda, rss = device.type == "cuda", peak_rss_gib()
    figures = {
        "device": str(device),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "allocated_bytes": torch.cuda.memory_allocated(device) if cuda else None,
        "peak_rss_gib": None if rss is None else round(rss, 3),
        "sent_bytes": split.sent_bytes,
        "received_bytes": split.received_bytes,
        "alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if cuda else None,
        "clock": clock.figures(),
    }
    if reset:
        clock.reset()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
    return figures
