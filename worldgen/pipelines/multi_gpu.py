"""One rollout on two GPUs (`--gpus 0,1`): classifier-free guidance's two passes at once.

Every denoising step runs the expert twice, with the prompt (conditional) and with the negative
prompt (unconditional), and only then combines them (uncond + g * (cond - uncond)). With two GPUs
the conditional pass runs on the first and the unconditional one on the second, at the same time;
everything else (text, VAE, scheduler, the combination) stays on the first GPU as before.

Why one process with one thread per GPU, not torch.distributed (one process per GPU, NCCL):
- The exchange is tiny: per step the second GPU receives the latent and returns its prediction
  (16 x 21 x 60 x 104 float32 = 8.4 MB at 480p, ~1 ms over PCIe). There is no collective to speed
  up, so NCCL would add a launcher, a rendezvous and a second copy of the whole control flow
  (text, VAE, progress, cancel, errors) in every rank for nothing.
- One process keeps the server's contract unchanged: one supervised worker per rollout, one
  progress stream, one cancel, one health answer, one memory meter.
- CUDA work is asynchronous and PyTorch releases the GIL inside each op, so two Python threads keep
  both GPUs busy: a forward launches a few thousand kernels of milliseconds each; the CPU side is
  never what the GPUs wait on.
Each GPU holds its own copy of the experts under its own memory plan (a 24 GB card keeps both NF4
experts resident, exactly as the one-GPU plan decides), so nothing is reloaded at the boundary.
Both GPUs run the same kernels on the same inputs, so the output equals the one-GPU path's (on GPUs
of one model, bit for bit; tests/worldgen/test_multi_gpu.py checks the logic on the CPU).

A server's pool of one-GPU workers runs a job that asks for two GPUs (setting `gpus = 2`) without
loading anything: the job's first worker runs it as above, but its "second device" is a
`PeerDevice`, the unconditional passes sent to another worker of the pool (`serve_guidance`), whose
own experts are already warm on its own GPU. The exchange is the same as between two threads (the
latent in, the prediction out, per step; the job's fixed inputs once), over a Unix socket between
the two processes (`bridge/workers/worker_pool.py` pairs them and says why in its docstring).
"""

from __future__ import annotations

import contextlib
import hmac
import io
import socket
import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from worldgen.errors import InputError, PeerLost
from worldgen.models.camera_cache import CameraCaches
from worldgen.runtime.residency import ResidencyPolicy


def parse_gpus(spec: str | Sequence[int] | None) -> list[int] | None:
    """'0,1' -> [0, 1] (checked: distinct non-negative indices, at most two). None/'' -> None."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, str):
        try:
            gpus = [int(part) for part in spec.split(",") if part.strip()]
        except ValueError:
            raise InputError(f"--gpus {spec!r}: give CUDA device indices separated by commas, e.g. 0,1") from None
    else:
        gpus = [int(g) for g in spec]
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise InputError(f"--gpus {spec!r}: give distinct CUDA device indices, e.g. 0,1")
    if len(gpus) > 2:
        raise InputError(
            f"--gpus {spec!r}: a rollout uses at most two GPUs (one per guidance pass); run more rollouts for more GPUs"
        )
    return gpus


def devices_for_gpus(spec: str | Sequence[int] | None) -> list[str] | None:
    """'0,1' -> ['cuda:0', 'cuda:1'], refusing when this machine lacks CUDA or those GPUs."""
    gpus = parse_gpus(spec)
    if gpus is None:
        return None
    if not torch.cuda.is_available():
        raise InputError(
            f"--gpus {','.join(map(str, gpus))}: this machine has no CUDA GPU (PyTorch {torch.__version__}); "
            "leave --gpus out to run on the CPU"
        )
    count = torch.cuda.device_count()
    if max(gpus) >= count:
        raise InputError(
            f"--gpus {','.join(map(str, gpus))}: this machine has {count} CUDA GPU(s) (indices 0..{count - 1}); "
            "check CUDA_VISIBLE_DEVICES or ask for fewer"
        )
    return [f"cuda:{g}" for g in gpus]


def check_devices(devices: Sequence[str]) -> None:
    """Refuse CUDA devices this machine does not have (clear message, before anything loads)."""
    wanted = [torch.device(d) for d in devices if torch.device(d).type == "cuda"]
    if not wanted:
        return
    names = f"device{'s' if len(devices) > 1 else ''} {', '.join(devices)}"
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no GPU visible"
        raise InputError(
            f"{names}: this machine has no CUDA GPU (PyTorch {torch.__version__}: {build}); use cpu (or auto)"
        )
    count = torch.cuda.device_count()
    if max(d.index or 0 for d in wanted) >= count:
        raise InputError(f"{names}: this machine has {count} CUDA GPU(s) (indices 0..{count - 1})")


class GuidanceDevice:
    """Where a job's unconditional passes run, beside the first device: `SecondDevice` (another GPU
    of this process) or `PeerDevice` (another worker's GPU). The pipeline calls `fit` once per job,
    `start_job` with the job's fixed inputs, `submit` each step, then `end_job`. Each pass runs in
    the device's one thread (`_predict`, defined by each kind), so it overlaps the conditional pass."""

    def __init__(self, device: torch.device | str, thread_name: str) -> None:
        self.device = torch.device(device)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)

    def submit(
        self, which: str, upcoming: Sequence[str], x: torch.Tensor, timestep: torch.Tensor, compute: str
    ) -> Future:
        """Start the unconditional prediction of this step; `.result()` is [16, F, H, W] on x's device."""
        return self._pool.submit(self._predict, which, list(upcoming), x, timestep, compute)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class SecondDevice(GuidanceDevice):
    """The unconditional pass of each step, on another device of this process, in a thread of its own."""

    def __init__(self, device: torch.device | str, residency: ResidencyPolicy):
        super().__init__(device, f"guidance-{torch.device(device)}")
        self.residency = residency  # this device's own plan (its budget) over its own copies of the experts
        self.experts = residency.experts
        self._inputs: dict[str, torch.Tensor | None] = {}

    def fit(self, tokens: int, pixels: int) -> None:
        """Re-plan this device's residency for a job's size (its own budget, its own experts)."""
        self.residency.fit(tokens, pixels)

    def start_job(self, negative_context: torch.Tensor, y: torch.Tensor, cam: torch.Tensor | None) -> None:
        """Copy the job's fixed inputs to this device once (not once per step)."""
        self._inputs = job_inputs(self.residency, self.device, negative_context, y, cam)

    def _predict(
        self, which: str, upcoming: list[str], x: torch.Tensor, timestep: torch.Tensor, compute: str
    ) -> torch.Tensor:
        return unconditional(self.residency, self.device, self._inputs, which, upcoming, x, timestep, compute).to(
            x.device
        )

    def end_job(self) -> None:
        end_inputs(self._inputs)
        self._inputs = {}
        self.residency.phase_done("denoise")


def job_inputs(
    residency: ResidencyPolicy, device: torch.device, negative: torch.Tensor, y: torch.Tensor, cam: torch.Tensor | None
) -> dict[str, Any]:
    """A job's fixed inputs on the guidance device, with this device's camera caches where its plan
    has room for them (`worldgen.models.camera_cache`), so its passes are as fast as the first device's."""
    cam = None if cam is None else cam.to(device)
    return {
        "negative": negative.to(device),
        "y": y.to(device),
        "cam": cam,
        "cameras": CameraCaches(enabled=residency.plan.camera_cache and cam is not None),
    }


def end_inputs(inputs: dict[str, Any]) -> None:
    """The job is over on this device: its camera caches are detached and freed."""
    cameras = inputs.get("cameras")
    if cameras is not None:
        cameras.release()


@torch.no_grad()
def unconditional(
    residency: ResidencyPolicy,
    device: torch.device,
    inputs: dict[str, Any],
    which: str,
    upcoming: Sequence[str],
    x: torch.Tensor,
    timestep: torch.Tensor,
    compute: str,
) -> torch.Tensor:
    """One step's unconditional prediction [16, F, H, W] on `device`, by its own copy of expert `which`
    (the one body of both a second device in this process and a peer worker's)."""
    model = residency.use(which, upcoming=list(upcoming))
    model.set_compute(compute)
    if inputs.get("cameras") is not None:
        inputs["cameras"].attach(which, model)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        return model(x.to(device), timestep.to(device), [inputs["negative"]], inputs["y"], inputs["cam"])[0]


# -- a second device in another worker process -------------------------------------------------------

PEER_CONNECT_S = 60.0  # how long the job's worker tries to reach its peer (it may still be setting up)
PEER_ACCEPT_S = 120.0  # how long the peer waits for the job's worker before giving the job up
_LENGTH = struct.Struct(">Q")


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    """One message: an 8-byte length, then `torch.save` of a dict of tensors, strings and numbers."""
    buffer = io.BytesIO()
    torch.save(message, buffer)
    data = buffer.getbuffer()
    conn.sendall(_LENGTH.pack(len(data)))
    conn.sendall(data)


def _receive(conn: socket.socket, max_bytes: int | None = None) -> dict[str, Any] | None:
    """The next message, or None when the other side closed the connection between messages."""
    head = _read_exactly(conn, _LENGTH.size)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    if max_bytes is not None and length > max_bytes:
        raise PeerLost(f"a message of {length} bytes where at most {max_bytes} are expected")
    body = _read_exactly(conn, length)
    if body is None:
        raise PeerLost("the connection closed in the middle of a message")
    # weights_only: tensors, strings, numbers and containers only (never arbitrary pickled objects)
    return torch.load(io.BytesIO(body), weights_only=True)


def _read_exactly(conn: socket.socket, count: int) -> bytearray | None:
    data = bytearray(count)
    view, have = memoryview(data), 0
    while have < count:
        got = conn.recv_into(view[have:])
        if not got:
            if have:
                raise PeerLost("the connection closed in the middle of a message")
            return None
        have += got
    return data


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().to("cpu").contiguous()


class PeerDevice(GuidanceDevice):
    """A `GuidanceDevice` served by another worker process (`serve_guidance`) over a Unix
    socket: the two-GPU job of a pool of one-GPU workers. Every call waits for the peer's answer,
    so a peer that died is known at once (PeerLost, naming it)."""

    def __init__(self, address: str, token: str, device: str, name: str = "peer",
                 connect_s: float = PEER_CONNECT_S) -> None:  # fmt: skip
        super().__init__(device, f"peer-{name}")  # the peer's device (what `job_compute` checks for fp8)
        self.name = name
        deadline = time.monotonic() + connect_s
        while True:  # the peer is told to listen at the same moment as we are told to connect
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(address)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                if time.monotonic() > deadline:
                    raise PeerLost(f"the second worker of this two-GPU job ({name}) did not listen "
                                   f"within {connect_s:g} s") from None  # fmt: skip
                time.sleep(0.02)
        self._conn = conn
        self._call({"type": "hello", "token": token})

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            _send(self._conn, message)
            reply = _receive(self._conn)
        except OSError as exc:
            raise PeerLost(f"the second worker of this two-GPU job ({self.name}) is gone: {exc}") from None
        if reply is None:
            raise PeerLost(f"the second worker of this two-GPU job ({self.name}) closed the connection")
        if reply.get("error"):
            raise PeerLost(f"the second worker of this two-GPU job ({self.name}) failed: {reply['error']}")
        return reply

    def fit(self, tokens: int, pixels: int) -> None:
        self._call({"type": "fit", "tokens": int(tokens), "pixels": int(pixels)})

    def start_job(self, negative_context: torch.Tensor, y: torch.Tensor, cam: torch.Tensor | None) -> None:
        self._call({"type": "start", "negative": _cpu(negative_context), "y": _cpu(y), "cam": _cpu(cam)})

    def _predict(
        self, which: str, upcoming: list[str], x: torch.Tensor, timestep: torch.Tensor, compute: str
    ) -> torch.Tensor:
        message = {"type": "step", "which": which, "upcoming": upcoming, "x": _cpu(x), "timestep": _cpu(timestep),
                   "compute": compute}  # fmt: skip
        return self._call(message)["out"].to(x.device)

    def end_job(self) -> None:
        """Denoising is over: the peer is released now (this worker decodes alone)."""
        self._call({"type": "end"})
        self.close()

    def close(self) -> None:
        super().close()
        with contextlib.suppress(OSError):
            self._conn.close()


def serve_guidance(
    load: Callable[[], tuple[ResidencyPolicy, torch.device | str]],
    address: str,
    token: str,
    on_step: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    accept_s: float = PEER_ACCEPT_S,
) -> int:
    """Serve a two-GPU job's unconditional passes with this worker's warm experts, for the one
    connection that knows `token`, until it closes; returns the steps served.

    Listens at once (the job's worker is connecting right now), then `load()` gives this worker's
    (residency policy, device) (a worker holding the Fast model switches to the base one here).
    `on_step(n)` after each pass: the worker's heartbeat and cancel point; `stop()` ends the wait
    for the connection (the job ended before it connected)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(4)
    deadline = time.monotonic() + accept_s
    try:
        while True:
            if stop is not None and stop():
                raise PeerLost("the job ended before its worker connected")
            if time.monotonic() > deadline:
                raise PeerLost(f"the job's first worker did not connect within {accept_s:g} s")
            listener.settimeout(0.25)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(5.0)  # whoever connects proves the token at once, in a small message
            try:
                hello = _receive(conn, max_bytes=1 << 16)
            except Exception:
                hello = None
            if hello and hello.get("type") == "hello" and hmac.compare_digest(str(hello.get("token")), token):
                conn.settimeout(None)
                break
            conn.close()  # not the job's worker: keep waiting for it
    finally:
        listener.close()
    steps = 0
    inputs: dict[str, Any] = {}
    with conn:
        residency, device = load()
        device = torch.device(device)
        _send(conn, {"ok": True})
        while (message := _receive(conn)) is not None:
            kind = message.get("type")
            try:
                if kind == "fit":
                    residency.fit(int(message["tokens"]), int(message["pixels"]))
                    reply: dict[str, Any] = {"ok": True}
                elif kind == "start":
                    end_inputs(inputs)  # a job that never said "end"
                    inputs = job_inputs(residency, device, message["negative"], message["y"], message["cam"])
                    reply = {"ok": True}
                elif kind == "step":
                    out = unconditional(residency, device, inputs, message["which"], message["upcoming"],
                                        message["x"], message["timestep"], message["compute"])  # fmt: skip
                    reply = {"out": _cpu(out)}
                elif kind == "end":
                    end_inputs(inputs)
                    inputs = {}
                    residency.phase_done("denoise")
                    reply = {"ok": True}
                else:
                    reply = {"error": f"unknown request {kind!r}"}
            except Exception as exc:  # the job's worker reports it (PeerLost); this worker serves on
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            _send(conn, reply)
            if kind == "step":
                steps += 1
                if on_step is not None:
                    on_step(steps)
    end_inputs(inputs)  # the connection closed mid-job: free what the job held
    return steps
