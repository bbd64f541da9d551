"""`python -m worldgen.worker`: the generation process that the bridge server supervises.

Loads the pipeline once and keeps it warm, then runs one job at a time as the supervisor asks,
speaking `bridge.workers.worker_protocol` (length-prefixed msgpack) on stdin/stdout. Logs go to stderr;
anything a library prints is sent to stderr too (fd 1 is redirected), so stray output can never
corrupt the protocol pipe.

Threads: the main thread loads the model and runs jobs; a reader thread takes messages from stdin
at any time, so a `cancel` is seen during a job (the progress callback raises at the next
denoising step) and `health` is answered even while the main thread is busy. When the worker is
idle, `health` is answered by the main thread after probing the device, so a reply proves the
process that holds the model still works. If stdin closes (the server died), the worker exits at
once rather than holding GPU memory for nobody.

A pool's two-GPU job (setting `gpus = 2`, bridge/workers/worker_pool.py) involves two workers: the one
sent `run` with a `peer` runs the job with a `worldgen.pipelines.multi_gpu.PeerDevice` as its second device;
the one sent `guide` serves that job's unconditional passes (`serve_guidance`) with its own warm
experts until the first closes the connection, then answers `result` and is free again.

Engine-agnostic core (`serve(load_engine)`): the real engine is `PipelineEngine` (worldgen.pipelines.loader
+ worldgen.rollout, imports torch); anything with the same four methods can be served.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from bridge.workers import worker_protocol as wp
from contracts import atomic
from contracts.engine_options import EngineOptions, EngineOptionsError
from contracts.episode import EpisodeError
from contracts.provenance import sidecar_path
from contracts.settings import GenerationSettings, SettingsError
from contracts.video import read_mp4
from worldgen.chunk_files import ChunkReport
from worldgen.errors import CheckpointError, InputError, PeerLost
from worldgen.runtime.metering import peak_rss_gib, rss_gib

log = logging.getLogger("worldgen.worker")

STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)

ProgressFn = Callable[[str, int, int], None]


# Errors that mean "your input is wrong", by type: they come back as bad_input, the worker carries on.
BAD_INPUT = (InputError, EpisodeError, SettingsError)


def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """Host and (when torch is loaded) CUDA out-of-memory errors, by type."""
    torch = sys.modules.get("torch")
    cuda_oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return (MemoryError, cuda_oom) if cuda_oom is not None else (MemoryError,)


class JobCancelled(Exception):
    """Raised inside the progress callback to stop a job the supervisor cancelled."""


class Engine(Protocol):
    def describe(self) -> dict[str, Any]: ...

    def generate(
        self,
        episode_dir: Path,
        settings: GenerationSettings,
        output: Path,
        progress: ProgressFn,
        on_chunk: ChunkReport | None = None,
        peer: dict[str, Any] | None = None,  # a two-GPU job of a pool: who runs its unconditional passes
    ) -> Path: ...

    # A two-GPU job of a pool, on its second worker: serve the job's unconditional passes to the
    # worker that runs it (peer {address, token}) until it closes; `on_step(n)` after each pass.
    def guide(
        self, address: str, token: str, on_step: Callable[[int], None], stop: Callable[[], bool] | None = None
    ) -> int: ...

    def probe(self) -> dict[str, Any]: ...

    def after_failure(self) -> None: ...


class PipelineEngine:
    """The real engine: a warm pipeline (`worldgen.pipelines.loader`) and `worldgen.rollout.generate_episode`."""

    def __init__(self, options: EngineOptions) -> None:
        import torch

        self.torch = torch
        self.options = options
        from worldgen.pipelines.loader import resolve_device

        # "auto" is resolved here, where PyTorch says what there is; `ready` reports the device taken
        self.ckpt, self.device = options.ckpt, str(resolve_device(options.device))
        # models load lazily (on a job's first use); this checks the checkpoint now. A folder with
        # only one of the models (e.g. only the Fast DiT) serves that model alone.
        other = "fast" if options.model == "base" else "base"
        self.warm_up_s: float | None = None
        try:
            self.model, self.pipe = options.model, self._load(options.model)
        except CheckpointError:
            try:
                self.model, self.pipe = other, self._load(other)
            except CheckpointError:
                pass
            else:
                return
            raise
        if options.warm_up and self.model == "fast":  # compile before the first job (FastPipeline.warm_up)
            from worldgen.pipelines.fast_warm_up import job_defaults

            self.warm_up_s = round(self.pipe.warm_up(job_defaults(options)), 2)

    def _load(self, model: str):
        from worldgen.pipelines.loader import load_pipeline_from_options

        return load_pipeline_from_options(self.options.replace(model=model), first_use_ahead=True)  # a server

    def _pipeline_for(self, model: str):
        """The pipeline of a job's model: one is resident at a time (a switch frees the other's models
        first, so both never need memory together); a missing Fast folder is the job's bad input."""
        if model != self.model:
            old, self.pipe, self.model = self.pipe, None, None
            if old is not None:
                _unload_all(old)
                del old
                if self.device.startswith("cuda"):
                    self.torch.cuda.empty_cache()
            self.pipe, self.model = self._load(model), model
        return self.pipe

    def describe(self) -> dict[str, Any]:
        from worldgen.kernels.fp8 import unsupported_reason_of  # torch: imported at load already

        devices = [self.device] if len(self.options.devices) == 1 else self.options.devices  # "auto" resolved
        return {
            "model": self.ckpt,
            "engine": self.model,  # the model resident now: base or fast (chosen per job by settings.model)
            "device": self.device,
            "dtype": (self.pipe.engine if self.pipe else {}).get("dtype", self.options.dtype or "auto"),
            "torch": self.torch.__version__,
            "options": self.options.to_dict(),  # as the server sent them
            "pipeline": dict(self.pipe.engine) if self.pipe else {},  # as the pipeline applied them
            "fp8_unsupported": unsupported_reason_of(devices),  # why compute fp8 cannot run here: the door says it
            "warm_up_s": self.warm_up_s,  # seconds the Fast DiT's warm-up took at load (None: none ran)
        }

    def generate(
        self,
        episode_dir: Path,
        settings: GenerationSettings,
        output: Path,
        progress: ProgressFn,
        on_chunk: ChunkReport | None = None,
        peer: dict[str, Any] | None = None,
    ) -> Path:
        pipe = self._pipeline_for(settings.model)
        if peer is not None:  # a two-GPU job: the unconditional passes run on the peer's warm experts
            from worldgen.pipelines.multi_gpu import PeerDevice

            if getattr(pipe, "second_device", None) is not None:
                raise InputError("this worker already runs every rollout on two GPUs; it takes no second worker")
            pipe.second_device = PeerDevice(peer["address"], peer["token"], peer["device"], peer.get("name", "peer"))
            try:
                return self._generate(pipe, episode_dir, settings, output, progress, on_chunk)
            finally:
                second, pipe.second_device = pipe.second_device, None
                second.close()
        return self._generate(pipe, episode_dir, settings, output, progress, on_chunk)

    def guide(
        self, address: str, token: str, on_step: Callable[[int], None], stop: Callable[[], bool] | None = None
    ) -> int:
        from worldgen.pipelines.multi_gpu import serve_guidance

        def load():
            pipe = self._pipeline_for("base")  # guidance passes are the base model's
            return pipe.residency, pipe.device

        return serve_guidance(load, address, token, on_step, stop)

    def _generate(self, pipe, episode_dir, settings, output, progress, on_chunk) -> Path:
        from worldgen.chunk_files import chunk_reporter
        from worldgen.rollout import generate_episode

        with chunk_reporter(settings, output, progress, on_chunk) as chunk_fn:
            # chunks nobody asked for (no `want_chunks`) may decode after the loop: the whole video sooner
            stream = on_chunk is not None
            return Path(
                generate_episode(
                    pipe, episode_dir, settings, output, progress=progress, on_chunk=chunk_fn, stream=stream
                )
            )

    def generate_live(
        self, episode_dir, feed, settings, output, progress, on_chunk, on_plan, on_start
    ) -> tuple[Path, int]:
        """A live job (model fast): `worldgen.live_rollout.generate_live_episode` on the warm Fast pipeline."""
        from worldgen.chunk_files import chunk_reporter
        from worldgen.live_rollout import generate_live_episode

        pipe = self._pipeline_for("fast")
        with chunk_reporter(settings, output, progress, on_chunk) as chunk_fn:
            return generate_live_episode(
                pipe, episode_dir, feed, settings, output, progress, chunk_fn, on_plan, on_start
            )

    def expected_frames(self, episode_dir: Path, settings: GenerationSettings) -> int | None:
        """Frames `generate` writes for this episode: the request cut to what the poses cover, as the
        pipeline does (model fast: then rounded down to whole chunks, worldgen.pipelines.fast_plan.fast_frames)."""
        import warnings

        import numpy as np

        from worldgen.pipelines.camera import frames_for_poses

        poses = np.load(episode_dir / "poses.npy", mmap_mode="r", allow_pickle=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if getattr(settings, "model", "base") in ("fast", "causal"):
                from worldgen.pipelines.fast_plan import fast_frames

                chunk_frames = self._pipeline_for(settings.model).family.chunk_frames
                return fast_frames(settings.frame_num, len(poses), chunk_frames).frames
            return frames_for_poses(settings.frame_num, len(poses))

    def probe(self) -> dict[str, Any]:
        """Touch the device: a reply means the CUDA context (or CPU torch) still works."""
        torch = self.torch
        if self.device.startswith("cuda"):
            device = torch.device(self.device)
            torch.cuda.synchronize(device)
            free, total = torch.cuda.mem_get_info(device)
            return {
                "gpu": {
                    "name": torch.cuda.get_device_name(device),
                    "free_mb": free >> 20,
                    "total_mb": total >> 20,
                    "allocated_mb": torch.cuda.memory_allocated(device) >> 20,
                    "peak_allocated_mb": torch.cuda.max_memory_allocated(device) >> 20,
                }
            }
        float((torch.ones(4) * 2).sum())
        return {"gpu": None}

    def after_failure(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.empty_cache()


def _unload_all(pipe) -> None:
    for slot in (pipe.text_encoder, pipe.vae, *pipe.experts.values()):
        if slot is not None:
            slot.unload()
    if getattr(pipe, "scale_out", None) is not None:  # a two-device causal pipeline: its rank 1 and group go
        pipe.scale_out.close()


def memory_info() -> dict[str, Any]:
    """Resident and peak memory of this process, in whole MiB (worldgen.runtime.metering; empty off Linux)."""
    figures = {"rss_mb": rss_gib(), "peak_rss_mb": peak_rss_gib()}
    return {key: int(gib * 1024) for key, gib in figures.items() if gib is not None}


class Worker:
    """The worker's two threads and its shared state."""

    def __init__(self, protocol_in: BinaryIO, protocol_out: BinaryIO) -> None:
        self.protocol_in, self.protocol_out = protocol_in, protocol_out
        self.write_lock = threading.Lock()
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        self.cancel = threading.Event()
        self.cancel_job: str | None = None  # the job `cancel` applies to (the last `run` read)
        self.state = "loading"  # loading | idle | busy
        self.job: str | None = None
        self.progress: dict[str, Any] = {}
        self.engine: Engine | None = None
        self.info: dict[str, Any] = {}
        self.live_feed = None  # the running live job's pose feed (worldgen.live_rollout.LivePoseFeed)

    def send(self, message: dict[str, Any]) -> None:
        with self.write_lock:
            wp.write_message(self.protocol_out, message)

    # -- the reader thread -------------------------------------------------------------------

    def read_forever(self) -> None:
        while True:
            try:
                message = wp.read_message(self.protocol_in)
            except (wp.WorkerProtocolError, OSError) as exc:
                log.error("unreadable message from the supervisor (%s); exiting", exc)
                os._exit(3)
            if message is None:
                log.info("supervisor closed the pipe; exiting")
                os._exit(0)
            kind = message["type"]
            if kind == "load":
                self.commands.put(message)
            elif kind in ("run", "guide"):
                self.cancel.clear()
                self.cancel_job = message.get("job")
                self.commands.put(message)
            elif kind == "cancel":
                if message.get("job") == self.cancel_job:
                    self.cancel.set()
                    feed = self.live_feed
                    if feed is not None:
                        feed.nudge()  # a live job waiting for poses sees the cancel now
            elif kind == "live_poses":
                feed = self.live_feed
                if feed is not None and message.get("job") == self.job:
                    feed.nudge()
            elif kind == "health":
                # Idle: the main thread answers after probing the device (nothing is queued before
                # it, since this thread is the only producer). Busy or loading: answer from here.
                if self.state == "idle" and self.commands.empty():
                    self.commands.put(message)
                else:
                    self.send(self.health(message.get("id")))
            elif kind == "shutdown":
                self.cancel.set()
                self.commands.put(message)
            else:
                log.warning("unknown message type %r ignored", kind)

    def health(self, health_id: Any, probe: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = {
            "type": "health",
            "id": health_id,
            "state": self.state,
            "job": self.job,
            "pid": os.getpid(),
            "memory": memory_info(),
            **self.info,
        }
        if self.state == "busy":
            answer["progress"] = dict(self.progress)
        if probe:
            answer.update(probe)
        return answer

    # -- the main thread ---------------------------------------------------------------------

    def main(self, load_engine: Callable[[EngineOptions], Engine]) -> int:
        threading.Thread(target=self.read_forever, name="protocol-reader", daemon=True).start()
        message = self.commands.get()  # the supervisor's first message: `load` with the engine options
        if message["type"] != "load":
            self.send(
                {"type": "fatal", "code": "load_failed", "message": f"expected 'load' first, got {message['type']!r}"}
            )
            return 3
        started = time.monotonic()
        try:
            options = EngineOptions.from_dict(message.get("options") or {}, "the worker's engine options")
            self.engine = load_engine(options)
        except (CheckpointError, EngineOptionsError, InputError) as exc:  # permanent: the server waits for a reload
            code = "checkpoint" if isinstance(exc, CheckpointError) else "options"  # e.g. a device not here
            self.send({"type": "fatal", "code": code, "message": str(exc)})
            return wp.EXIT_CONFIGURATION
        except Exception as exc:  # a missing package is permanent too; anything else is retried
            log.error("cannot load the model:\n%s", traceback.format_exc())
            code = "missing_package" if isinstance(exc, ImportError) else "load_failed"
            self.send({"type": "fatal", "code": code, "message": f"{type(exc).__name__}: {exc}"})
            return wp.EXIT_MISSING_PACKAGE if code == "missing_package" else wp.EXIT_LOAD_FAILED
        self.info = {**self.engine.describe(), "load_s": round(time.monotonic() - started, 2)}
        self.state = "idle"
        self.send({"type": "ready", "pid": os.getpid(), **self.info})
        log.info("ready: %s", self.info)
        while True:
            message = self.commands.get()
            kind = message["type"]
            if kind == "shutdown":
                return 0
            if kind == "health":
                try:
                    probe = self.engine.probe()
                except Exception as exc:
                    probe = {"probe_error": f"{type(exc).__name__}: {exc}"}
                self.send(self.health(message.get("id"), probe))
            elif kind == "run":
                self.run_job(message)
            elif kind == "guide":
                self.guide_job(message)

    def run_job(self, message: dict[str, Any]) -> None:
        job = message.get("job")
        self.job, self.state, self.progress = job, "busy", {}
        started = time.monotonic()
        output = Path(message["output"])
        partial = output.with_name(f"{output.stem}.partial{output.suffix}")

        def progress(phase: str, step: int, total: int) -> None:
            if self.cancel.is_set():
                raise JobCancelled(f"cancelled during {phase} (step {step}/{total})")
            self.progress = {"phase": phase, "step": int(step), "total": int(total)}
            self.send({"type": "progress", "job": job, **self.progress})

        def on_chunk(index: int, total: int, path: Path, frames: int, still: Path | None = None) -> None:
            # a finished, decoded part of the video (model = fast): the server streams it to the client
            chunk = {"type": "chunk", "job": job, "index": index, "total": total, "path": str(path), "frames": frames}
            if still is not None:
                chunk["still"] = str(still)
            self.send(chunk)

        try:
            settings = GenerationSettings.from_dict(message["settings"])
            generate_args = (Path(message["episode_dir"]), settings, partial, progress)
            extra: dict[str, Any] = {"on_chunk": on_chunk} if message.get("want_chunks") else {}
            if message.get("peer"):  # a two-GPU job of a pool (bridge/workers/worker_pool.py)
                extra["peer"] = message["peer"]
            live_frames = None
            if message.get("live_dir"):  # a live job: its poses arrive while it runs (worldgen.live_rollout)
                written, live_frames = self.run_live(job, message, generate_args, progress)
            else:
                written = self.engine.generate(*generate_args, **extra)
            if self.cancel.is_set():
                raise JobCancelled("cancelled after the last step")
            record = sidecar_path(written)
            if record.is_file():  # the provenance record goes first: a result never exists without it
                atomic.commit(record, sidecar_path(output))
            atomic.commit(written, output)  # fsynced and renamed: durable before it is reported
            frames_output = message.get("frames_output")
            if message.get("want_frames") and frames_output:
                self.write_frames(output, Path(frames_output))
            self.send(
                {
                    "type": "result",
                    "job": job,
                    "output": str(output),
                    "frames_output": frames_output,
                    "seconds": round(time.monotonic() - started, 3),
                    "frames": live_frames or self.expected_frames(Path(message["episode_dir"]), settings),
                }
            )
        except JobCancelled as exc:
            log.info("job %s: %s", job, exc)
            self.send({"type": "error", "job": job, "code": "cancelled", "message": str(exc)})
        except BAD_INPUT as exc:  # the episode or the settings: the user's to fix
            self.send({"type": "error", "job": job, "code": "bad_input", "message": str(exc)})
        except OSError as exc:
            # Disk full or read-only: not the job's fault; the server requeues it until space returns.
            code = "storage" if exc.errno in STORAGE_ERRNOS else "worker_error"
            log.error("job %s: cannot write its files: %s", job, exc)
            self.send({"type": "error", "job": job, "code": code, "message": f"{type(exc).__name__}: {exc}"})
        except PeerLost as exc:  # its other process (a two-GPU job's rank 1) is gone: this worker goes on
            log.error("job %s: %s", job, exc)
            self.send({"type": "error", "job": job, "code": "peer_lost", "message": f"PeerLost: {exc}"})
        except Exception as exc:
            log.error("job %s failed:\n%s", job, traceback.format_exc())
            code = "out_of_memory" if isinstance(exc, out_of_memory_errors()) else "worker_error"
            self.send({"type": "error", "job": job, "code": code, "message": f"{type(exc).__name__}: {exc}"})
            try:
                self.engine.after_failure()
            except Exception:
                log.error("cleanup after the failure failed:\n%s", traceback.format_exc())
        finally:
            try:  # a read-only or vanished spool must not take the worker down with it
                partial.unlink(missing_ok=True)
                sidecar_path(partial).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove %s: %s", partial, exc)
            self.job, self.state, self.progress, self.live_feed = None, "idle", {}, None
            with contextlib.suppress(Exception):  # health then says which model is resident now
                self.info.update(self.engine.describe())

    def run_live(self, job: str, message: dict[str, Any], generate_args: tuple, progress) -> tuple[Path, int]:
        """A live job: the feed reads its pose batches as the server writes them; each chunk reports
        the poses it was made from and when it started (the server adds its own timings)."""
        from worldgen.live_rollout import LivePoseFeed

        generate_live = getattr(self.engine, "generate_live", None)
        if generate_live is None:
            raise InputError("this worker's engine does not run live jobs")
        starts: dict[int, dict[str, Any]] = {}

        def keep_alive(held: int, needed: int) -> None:  # progress while waiting: the stall timer, the cancel
            progress("poses", held, needed)

        def on_start(chunk: int, poses: int) -> None:
            starts[chunk] = {"poses": poses, "started_at": round(time.time(), 4)}

        def live_chunk(index: int, total: int, path: Path, frames: int, still: Path | None = None) -> None:
            chunk = {"type": "chunk", "job": job, "index": index, "total": total, "path": str(path),
                     "frames": frames, **starts.get(index, {})}  # fmt: skip
            if still is not None:
                chunk["still"] = str(still)
            self.send(chunk)

        def on_plan(needed: list[int], frames: int) -> None:
            self.send({"type": "live", "job": job, "poses_needed": needed, "frames": frames})

        self.live_feed = LivePoseFeed(Path(message["live_dir"]), keep_alive, wp.LIVE_BATCH_FILE, wp.LIVE_END_FILE)
        episode_dir, settings, partial, _ = generate_args
        return generate_live(episode_dir, self.live_feed, settings, partial, progress, live_chunk, on_plan, on_start)

    def guide_job(self, message: dict[str, Any]) -> None:
        """Be the second worker of a two-GPU job: serve its unconditional passes until the job's own
        worker closes the connection; then `result` (or `error`) frees this worker."""
        job = message.get("job")
        self.job, self.state, self.progress = job, "busy", {}
        started = time.monotonic()

        def on_step(step: int) -> None:  # the supervisor hears from us every step (its stall timer)
            if self.cancel.is_set():
                raise JobCancelled(f"cancelled after {step} guidance pass(es)")
            self.progress = {"phase": "guidance", "step": int(step), "total": 0}
            self.send({"type": "progress", "job": job, **self.progress})

        try:
            steps = self.engine.guide(str(message["address"]), str(message["token"]), on_step, self.cancel.is_set)
            self.send({"type": "result", "job": job, "guidance_steps": steps,
                       "seconds": round(time.monotonic() - started, 3)})  # fmt: skip
        except JobCancelled as exc:
            self.send({"type": "error", "job": job, "code": "cancelled", "message": str(exc)})
        except Exception as exc:
            log.error("job %s (guidance passes) failed:\n%s", job, traceback.format_exc())
            self.send({"type": "error", "job": job, "code": "worker_error", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            self.job, self.state, self.progress = None, "idle", {}
            with contextlib.suppress(Exception):
                self.info.update(self.engine.describe())

    def expected_frames(self, episode_dir: Path, settings: GenerationSettings) -> int | None:
        """The frame count the engine's mp4 must hold (the server checks it in the file); None if
        the engine cannot say (the server then checks that the mp4 is complete only)."""
        count = getattr(self.engine, "expected_frames", None)
        if count is None:
            return None
        try:
            return int(count(episode_dir, settings))
        except Exception as exc:
            log.warning("cannot tell the expected frame count: %s", exc)
            return None

    @staticmethod
    def write_frames(video: Path, target: Path) -> None:
        import numpy as np

        frames, _ = read_mp4(video)  # for clients that asked for the frames too
        with atomic.atomic_open(target) as f:
            np.save(f, frames, allow_pickle=False)


def serve(load_engine: Callable[[EngineOptions], Engine]) -> int:
    """Run a worker on this process's stdin/stdout with the engine `load_engine(options)` returns,
    `options` being what the supervisor's first message (`load`) carries."""
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints from any library now land on stderr
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s: %(message)s",
    )
    code = Worker(sys.stdin.buffer, protocol_out).main(load_engine)
    logging.shutdown()
    sys.stderr.flush()
    # Exit now: a normal interpreter shutdown would wait for the reader thread's lock on stdin.
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """`python -m worldgen.worker`: no flags. Its engine options arrive as data, in the supervisor's
    first message (`load`, see bridge/workers/worker_protocol.py)."""
    argv = sys.argv[1:] if argv is None else argv
    usage = (
        "usage: python -m worldgen.worker\n\n" + __doc__.split("\n\n")[0] + " Its engine options arrive as data, in "
        "the supervisor's first message (`load`, see bridge/workers/worker_protocol.py); there are no engine flags."
    )
    if argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    if argv:
        print(f"{usage}\n\nerror: unrecognized arguments: {' '.join(argv)}", file=sys.stderr)
        return 2
    return serve(PipelineEngine)


if __name__ == "__main__":
    sys.exit(main())
