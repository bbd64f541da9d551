"""The server's watch over its spool: state writes that may fail, the probe that finds out
whether the spool can be written (and has room) again, and the bytes each client holds there.

A mixin of `bridge.server.server.Server` (it uses the server's `spool`, `jobs`, `config`); any write
error marks the spool not writable (health, `storage` answers) and is retried every loop turn,
so the server recovers by itself when space returns.
"""

from __future__ import annotations

import logging
import time

from bridge.server.jobs import Job
from bridge.server.spool import describe_os_error

log = logging.getLogger("bridge.server.server")

PROBE_EVERY_S = 2.0  # how often a writable spool is checked (a failing one: every loop turn)


class StorageWatch:
    def _save(self, job: Job) -> bool:
        """Write a job's state.json; on failure the job is marked dirty (written again when the
        spool recovers) and the spool is reported not writable."""
        try:
            self.spool.save_state(job)
            return True
        except OSError as exc:
            job.dirty = True
            self._storage_failed(exc, f"job {job.id} state")
            return False

    def _storage_failed(self, exc: OSError, what: str) -> None:
        reason = describe_os_error(exc)
        if self.storage_error != reason:
            log.error("spool: cannot write %s: %s; new jobs are refused until it can be written", what, reason)
        self.storage_error = reason
        self._next_probe = 0.0  # check again at the next loop turn

    def _probe_storage(self) -> None:
        """Is the spool writable (and is there room) now? Clears or sets `storage_error`."""
        now = time.monotonic()
        self._next_probe = now + (0.2 if self.storage_error else PROBE_EVERY_S)
        try:
            self.spool.probe()
            free = self.spool.free_bytes()
        except OSError as exc:
            self._storage_failed(exc, "its probe file")
            return
        if free < self.config.spool_min_free_bytes:
            free = self._free_disk(free)  # kept results are a cache (bridge/server/eviction.py)
        if free < self.config.spool_min_free_bytes:
            reason = (
                f"the spool's disk is nearly full: {free >> 20} MiB free, below spool_min_free_bytes "
                f"({self.config.spool_min_free_bytes >> 20} MiB)"
            )
            if self.storage_error != reason:
                log.error("spool: %s", reason)
            self.storage_error = reason
            return
        for job in self.jobs.values():  # state changes that could not be written before
            if job.dirty:
                try:
                    self.spool.save_state(job)
                except OSError as exc:
                    self._storage_failed(exc, f"job {job.id} state")
                    return
                if job.released:
                    self.spool.release_inputs(job)
        if self.storage_error:
            log.info("spool is writable again")
        self.storage_error = None

    def spool_usage(self) -> tuple[int, dict[str, int]]:
        """Bytes the jobs hold in the spool: in all, and per client."""
        per_client: dict[str, int] = {}
        for job in self.jobs.values():
            per_client[job.client] = per_client.get(job.client, 0) + job.spool_bytes
        return sum(per_client.values()), per_client
