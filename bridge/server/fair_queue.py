"""The job queue: clients take turns, so one client with many jobs cannot starve the others.

Each client's jobs run in the order it sent them; the clients with waiting jobs are served
round-robin (a client that gets a job run goes to the back of the line). Small and exact: the
queue is capped at a few dozen jobs, so positions are computed by walking the turn order.
"""

from __future__ import annotations

from collections import deque


class FairQueue:
    def __init__(self) -> None:
        self._jobs: dict[str, deque[str]] = {}  # client -> its waiting job ids, oldest first
        self._turns: deque[str] = deque()  # clients with waiting jobs, next to be served first
        self._client_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._client_of)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._client_of

    def count(self, client: str) -> int:
        return len(self._jobs.get(client, ()))

    def push(self, client: str, job_id: str, front: bool = False) -> None:
        """Queue a job; `front` puts it first in its client's line and that client first in turn
        (a job resumed after a restart was running, so it should run next)."""
        if job_id in self._client_of:
            raise ValueError(f"job {job_id} is already queued")
        line = self._jobs.get(client)
        if line is None:
            line = self._jobs[client] = deque()
            if front:
                self._turns.appendleft(client)
            else:
                self._turns.append(client)
        elif front:
            self._turns.remove(client)
            self._turns.appendleft(client)
        if front:
            line.appendleft(job_id)
        else:
            line.append(job_id)
        self._client_of[job_id] = client

    def pop(self) -> str | None:
        """The next job to run, or None."""
        if not self._turns:
            return None
        client = self._turns.popleft()
        line = self._jobs[client]
        job_id = line.popleft()
        if line:
            self._turns.append(client)
        else:
            del self._jobs[client]
        del self._client_of[job_id]
        return job_id

    def peek(self) -> str | None:
        """The job `pop` would return, left in the queue."""
        return self._jobs[self._turns[0]][0] if self._turns else None

    def remove(self, job_id: str) -> bool:
        client = self._client_of.pop(job_id, None)
        if client is None:
            return False
        line = self._jobs[client]
        line.remove(job_id)
        if not line:
            del self._jobs[client]
            self._turns.remove(client)
        return True

    def order(self) -> list[str]:
        """All waiting jobs in the order they will run (if nothing new arrives)."""
        lines = {client: list(jobs) for client, jobs in self._jobs.items()}
        turns = list(self._turns)
        order: list[str] = []
        while turns:
            client = turns.pop(0)
            order.append(lines[client].pop(0))
            if lines[client]:
                turns.append(client)
        return order

    def positions(self) -> dict[str, int]:
        """job id -> number of waiting jobs that run before it."""
        return {job_id: i for i, job_id in enumerate(self.order())}
