"""The real worker (`worldgen.worker`, tiny engine) that SIGKILLs itself, once, at the worst moment
for durability: after its result is written (renamed into place) and before it reports it.

    python tests/bridge/dying_worker.py MARKER [--group]

The first result of the process family is not reported: `MARKER` is created and the worker (with
`--group`: its whole process group, i.e. the server too) is SIGKILLed. Later workers (MARKER
exists) behave normally. Used by test_durable_results.py.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from worldgen import worker


def main() -> int:
    marker, group = Path(sys.argv[1]), "--group" in sys.argv[2:]
    send = worker.Worker.send

    def send_or_die(self: worker.Worker, message: dict) -> None:
        if message.get("type") == "result" and not marker.exists():
            marker.write_text(message["output"])  # which file was written, for the test
            if group:
                os.killpg(os.getpgid(0), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        send(self, message)

    worker.Worker.send = send_or_die
    return worker.serve(worker.PipelineEngine)


if __name__ == "__main__":
    sys.exit(main())
