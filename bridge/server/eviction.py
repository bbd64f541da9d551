"""Kept results are a cache: the spool deletes the oldest of them to make room, and never lets them
wedge the server.

Room is wanted in two ways, and both evict the same jobs, oldest finished first:
- the quota in force (`quota_bytes()`): `spool_quota_bytes`, or by default (0) `QUOTA_SHARE` of
  the spool's filesystem, and never more than that disk can hold now (what the spool uses plus the
  free space above `spool_min_free_bytes`), so a quota larger than the disk evicts like a full one;
- free disk below `spool_min_free_bytes` (whatever filled it): the storage probe evicts before it
  reports the spool full, so a queued job is never held by storage that eviction can free.

Never evicted: an unfinished job's inputs (the job could not run without them), a job whose state is
not yet on disk, and a finished job's result that no client has fetched yet while it is within
`result_grace_s` of finishing (a client that follows the job gets the result the moment it is done;
the grace is for one that comes back for it). An evicted job is forgotten: it answers `not_found`.

A mixin of `bridge.server.server.Server` (it uses the server's `spool`, `jobs`, `config`, `spool_usage`).
"""

from __future__ import annotations

import logging
import os
import time

from bridge.server.jobs import Job

log = logging.getLogger("bridge.server.server")

QUOTA_SHARE = 0.5  # the default spool quota: this share of the spool's filesystem


class Eviction:
    def quota_bytes(self) -> int:
        """The spool quota in force: configured (or QUOTA_SHARE of the disk), at most what the disk
        can hold for the spool now."""
        config = self.config
        try:
            stat = os.statvfs(self.spool.root)
        except OSError:  # the storage probe reports it; the configured quota stands meanwhile
            return config.spool_quota_bytes or 0
        quota = config.spool_quota_bytes or int(stat.f_blocks * stat.f_frsize * QUOTA_SHARE)
        used, _ = self.spool_usage()
        holdable = used + stat.f_bavail * stat.f_frsize - config.spool_min_free_bytes
        return max(0, min(quota, holdable))

    def quota_per_client_bytes(self) -> int:
        return min(self.config.spool_quota_per_client_bytes, self.quota_bytes())

    def _evictable(self, keep: str | None = None) -> list[Job]:
        """Finished jobs whose files may go, oldest finished first."""
        now = time.time()
        grace = self.config.result_grace_s
        return sorted(
            (j for j in self.jobs.values()
             if j.terminal and j.spool_bytes and not j.dirty and j.id != keep
             and (j.fetched or now - (j.finished or 0) >= grace)),
            key=lambda j: j.finished or 0,
        )  # fmt: skip

    def _evict(self, job: Job, why: str) -> None:
        log.info("spool %s: deleting job %s (finished %.0f s ago, %d bytes)", why, job.id,
                 time.time() - (job.finished or 0), job.spool_bytes)  # fmt: skip
        self.spool.remove(job)
        del self.jobs[job.id]
        self.by_request.pop((job.client, job.rid), None)

    def _make_room(self, size: int, client: str, keep: str | None = None) -> None:
        """Before a quota refuses new work (`size` more bytes for `client`), the oldest finished jobs
        are deleted (this client's first for its own share). Inputs of unfinished jobs are never touched."""
        quota, per_client_quota = self.quota_bytes(), self.quota_per_client_bytes()
        used, per_client = self.spool_usage()
        for job in self._evictable(keep):
            over_all = used + size > quota
            over_mine = job.client == client and per_client.get(client, 0) + size > per_client_quota
            if not (over_all or over_mine):
                continue
            used -= job.spool_bytes
            per_client[job.client] = per_client.get(job.client, 0) - job.spool_bytes
            self._evict(job, "quota")

    def _free_disk(self, free: int) -> int:
        """Free disk below spool_min_free_bytes: evict kept results, oldest first, until it is not;
        -> the free bytes now."""
        for job in self._evictable():
            if free >= self.config.spool_min_free_bytes:
                break
            self._evict(job, "disk nearly full")
            free = self.spool.free_bytes()
        return free
