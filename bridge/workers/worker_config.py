"""`[worker]` of config/server.toml as the workers see it: how each worker loads its engine.

Here, in the workers' room, so that the pool and the Ray backend never import the server; the server's
config (`bridge.server.server_config`) parses the file into it.
"""

from __future__ import annotations

import dataclasses
import sys

from contracts.engine_options import EngineOptions


class ConfigError(ValueError):
    """The server config file has a missing, unknown or invalid key."""


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    engine: EngineOptions = EngineOptions()  # how each worker loads its engine, sent as data (`load`)
    # One warm worker per entry (a pool, bridge/workers/worker_pool.py); empty: one worker on the engine's device.
    devices: tuple[str, ...] = ()
    backend: str = "local"  # "local": worker processes here; "ray": one Ray actor per device
    ray_address: str = ""  # backend "ray": "" starts a local Ray; "auto"; "HOST:PORT"; "ray://HOST:10001"
    retry_crashed: bool = False  # a job whose worker died runs again (until max_attempts starts)
    command: tuple[str, ...] = ()  # a whole worker command line instead of `python -m worldgen.worker`
    startup_timeout_s: float = 600.0
    health_timeout_s: float = 2.5  # below a client's try timeout (10 s / 3 tries by default)
    cancel_grace_s: float = 120.0
    stall_timeout_s: float = 900.0
    restart_backoff_s: tuple[float, float] = (0.5, 30.0)
    max_start_failures: int = 3

    def pool_devices(self) -> tuple[str, ...]:
        """The device of each worker in the pool."""
        return self.devices or (self.engine.device,)

    def options_for(self, device: str) -> EngineOptions:
        """The engine options of the pool's worker on `device` (no pool: the engine's own, which may
        name two GPUs for one rollout: `gpus`)."""
        if not self.devices and device == self.engine.device:
            return self.engine
        return self.engine.replace(devices=[device])

    def argv(self) -> tuple[str, ...]:
        """The worker's command; its engine options travel in the `load` message, not here."""
        return self.command or (sys.executable, "-m", "worldgen.worker")
