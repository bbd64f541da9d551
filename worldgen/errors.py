"""Errors the engine raises on purpose, each with its own meaning to the caller.

`InputError` and `CheckpointError` mean "your input is wrong" (not "our code is wrong"): the CLI prints them
briefly. Their one home is `contracts.errors` (the server's door raises them too); worldgen code imports them
from here.

`PeerLost`: the other process of a job that spans two (a two-GPU job's rank 1, `worldgen.pipelines.two_gpu`,
or a pool's second worker, `worldgen.pipelines.multi_gpu`) died or stopped answering mid-job. The job fails
with it, the worker survives (a worker reports it as the error code `peer_lost`).
"""

from contracts.errors import CheckpointError, InputError

__all__ = ["CheckpointError", "InputError", "PeerLost"]


class PeerLost(RuntimeError):
    """The other process of a job that spans two went away (died, or stopped answering) mid-job."""
