"""`config/server.toml`: where the server listens, where it spools, how it runs its worker.

Every key is optional (the defaults below are the documented ones); unknown keys are an error so
a typo does not silently fall back to a default. Relative paths are relative to the current
directory.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from bridge.wire.protocol import DEFAULT_PORT, Limits
from bridge.workers.worker_config import ConfigError, WorkerConfig
from contracts.engine_options import DEVICE_HELP, EngineOptions, EngineOptionsError
from contracts.model_families import preset_for
from contracts.toml_file import read_toml

BACKENDS = ("local", "ray")
RENAMED = {"live_idle_s": "live_max_gap_s"}  # [server] keys of earlier releases: named, not "unknown"
DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")


# Keys of [worker] that are engine options (contracts.engine_options.EngineOptions); `device` is the
# engine's one device, or a list of two that each rollout spans (`gpus = "0,1"` is its CUDA shorthand);
# a pool's workers each get one entry of `devices` instead.
ENGINE_KEYS = (
    "ckpt", "model", "assets_dir", "device", "gpus", "dtype", "compute", "attention", "vram_budget_gb", "t5_on_cpu",
    "warm_up",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SecurityConfig:
    server_secret_key: Path | None = None  # a `.key_secret` file from `lingbot-isaac keys server`
    client_keys_dir: Path | None = None  # folder of allowed clients' public `.key` files

    @property
    def curve(self) -> bool:
        return self.server_secret_key is not None


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    bind: str = f"tcp://127.0.0.1:{DEFAULT_PORT}"
    spool_dir: Path = Path("out/spool")
    max_queue: int = 32  # waiting jobs, all clients together; above it: "busy"
    max_queue_per_client: int = 16
    max_attempts: int = 2  # a job interrupted by server restarts this often is failed, not resumed
    result_ttl_s: float = 24 * 3600.0  # finished jobs (and their mp4) are deleted after this
    # A live job's two limits (docs/protocol.md, "Live jobs"; bridge/server/live_jobs.py). Both count only the
    # time its running model waits for its poses (never the queue, never a model behind the poses it holds),
    # and end it with its chunks so far as its result, the limit named (live_gap, live_deadline):
    live_max_gap_s: float = 10.0  # the longest wait for the next pose batch (from the last batch or chunk sent)
    # all its waits together: at most live_deadline_factor x its real-time length (frame_num / fps) + live_deadline_extra_s
    live_deadline_factor: float = 4.0
    live_deadline_extra_s: float = 30.0
    live_ahead_chunks: int = 8  # a live job's poses may run this many chunks ahead of the model; beyond: "busy"
    # a result no client fetched yet is not evicted for room (bridge/server/eviction.py) this long after its job ended
    result_grace_s: float = 600.0
    # inputs of unfinished jobs + kept results, all clients; 0: half the spool's disk (bridge/server/eviction.py);
    # never more than the disk can hold (the oldest kept results are evicted first)
    spool_quota_bytes: int = 0
    spool_quota_per_client_bytes: int = 2 << 30  # the same, for one client
    spool_min_free_bytes: int = 256 << 20  # below this much free disk: evict kept results, else "storage"
    # [preset] of config/generation.toml under each job's settings; "" follows the checkpoint
    # (`preset()`): [tiny] for the built-in tiny model, [default] (the reference's own) for real weights
    generation_preset: str = ""
    generation_config: Path | None = None  # None: config/generation.toml
    limits: Limits = Limits()
    worker: WorkerConfig = WorkerConfig()
    security: SecurityConfig = SecurityConfig()

    def live_deadline_s(self, real_time_s: float) -> float:
        """A live job's time limit: the seconds its model may wait for its poses, all waits together;
        `real_time_s`: its video's length played back (frame_num / fps)."""
        return self.live_deadline_factor * real_time_s + self.live_deadline_extra_s

    def preset(self) -> str:
        """The generation preset under each job's settings: `generation_preset`, or the checkpoint's
        own when it is "" (a 14B model must not run the tiny model's 96x160, 17 frames by default)."""
        if self.generation_preset:
            return self.generation_preset
        engine = self.worker.engine
        return preset_for(engine.ckpt, engine.model)


def load_server_config(path: Path | None, overrides: dict[str, Any] | None = None) -> ServerConfig:
    """Read a server TOML (tables [server], [worker], [limits], [security]); None: all defaults.

    `overrides` maps "table.key" (e.g. "server.bind") to values from command-line flags.
    """
    table: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        table = read_toml(path, "server config", "try config/server.toml", ConfigError)
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".")
        table.setdefault(section, {})[key] = value
    where = str(path) if path else "server config"
    unknown_tables = sorted(set(table) - {"server", "worker", "limits", "security"})
    if unknown_tables:
        raise ConfigError(f"{where}: unknown table(s) {unknown_tables}; known: server, worker, limits, security")
    for key, now in RENAMED.items():
        if isinstance(table.get("server"), dict) and key in table["server"]:
            raise ConfigError(f"{where} [server] {key}: renamed {now} (see config/server.toml)")
    server = _fields(ServerConfig, table.get("server", {}), f"{where} [server]", skip={"limits", "worker", "security"})
    limits = _fields(Limits, table.get("limits", {}), f"{where} [limits]")
    worker = _worker_config(table.get("worker", {}), f"{where} [worker]")
    security = _fields(SecurityConfig, table.get("security", {}), f"{where} [security]")
    config = ServerConfig(**server, limits=Limits(**limits), worker=worker, security=SecurityConfig(**security))
    if config.max_queue < 1 or config.max_queue_per_client < 1 or config.max_attempts < 1:
        raise ConfigError(f"{where}: max_queue, max_queue_per_client and max_attempts must be >= 1")
    if config.worker.backend not in BACKENDS:
        raise ConfigError(f"{where} [worker] backend must be one of {list(BACKENDS)} (got {config.worker.backend!r})")
    for device in config.worker.pool_devices():
        if not DEVICE_RE.fullmatch(device):
            raise ConfigError(f"{where} [worker] device {device!r}: expected {DEVICE_HELP}")
    if (config.security.server_secret_key is None) != (config.security.client_keys_dir is None):
        raise ConfigError(f"{where} [security]: set both server_secret_key and client_keys_dir, or neither")
    return config


def _worker_config(values: Any, where: str) -> WorkerConfig:
    """[worker]: the engine keys become EngineOptions (its own strict parser), the rest the pool's."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a table")
    engine = {key: values[key] for key in ENGINE_KEYS if key in values}
    if "device" in engine:  # one device; or a list of two: one worker whose rollouts span both (as `gpus`)
        device = engine.pop("device")
        if isinstance(device, list) and len(device) != 2:
            raise ConfigError(f'{where}: device is one device, or a list of two (e.g. ["cpu", "cpu"]: two ranks '
                              f"of one worker on the CPU), not {device!r}")  # fmt: skip
        if isinstance(device, list) and (values.get("devices") or engine.get("gpus")):
            raise ConfigError(f"{where}: a device list of two (one worker, two devices per rollout) excludes gpus "
                              "(the same for two GPUs) and devices (a pool of one-device workers); give one of them")  # fmt: skip
        engine["devices"] = device if isinstance(device, list) else [device]
    if engine.get("gpus"):  # one rollout over two GPUs (worldgen.pipelines.multi_gpu): "0,1" -> cuda:0, cuda:1
        if values.get("devices"):
            raise ConfigError(f"{where}: gpus (one worker, two GPUs per rollout) and devices (a pool of workers) "
                              "exclude each other; give one of them")  # fmt: skip
        try:
            gpus = [int(g) for g in str(engine["gpus"]).split(",") if g.strip()]
        except ValueError:
            raise ConfigError(f'{where}: gpus must look like "0,1" (got {engine["gpus"]!r})') from None
        if len(gpus) != 2 or len(set(gpus)) != 2 or min(gpus) < 0:
            raise ConfigError(f'{where}: gpus must name two different GPUs, e.g. "0,1" (got {engine["gpus"]!r})')
        engine["devices"] = [f"cuda:{g}" for g in gpus]
    engine.pop("gpus", None)
    try:
        options = EngineOptions.from_dict(engine, where)
    except EngineOptionsError as exc:
        raise ConfigError(str(exc)) from None
    rest = {key: value for key, value in values.items() if key not in ENGINE_KEYS}
    fields = {f.name for f in dataclasses.fields(WorkerConfig)} - {"engine"}
    unknown = sorted(set(rest) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields | set(ENGINE_KEYS))}")
    return WorkerConfig(engine=options, **_fields(WorkerConfig, rest, where, skip={"engine"}))


def _fields(cls: type, values: dict[str, Any], where: str, skip: set[str] = frozenset()) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    out: dict[str, Any] = {}
    for key, value in values.items():
        default = fields[key].default
        out[key] = _coerce(value, default, f"{where} {key}")
    return out


def _coerce(value: Any, default: Any, where: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false (got {value!r})")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where} must be a non-negative integer (got {value!r})")
        return value
    if isinstance(default, float):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where} must be a non-negative number (got {value!r})")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list (got {value!r})")
        if default and isinstance(default[0], float):
            if len(value) != len(default) or not all(isinstance(v, (int, float)) for v in value):
                raise ConfigError(f"{where} must be a list of {len(default)} numbers (got {value!r})")
            return tuple(float(v) for v in value)
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings (got {value!r})")
        return tuple(value)
    if default is None or isinstance(default, Path):  # paths
        if value in ("", None):
            return None if default is None else default
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a path string (got {value!r})")
        return Path(value).expanduser()
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string (got {value!r})")
    return value
