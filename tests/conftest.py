"""Shared test fixtures: where the reference material lives, a loaded tiny-model server."""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# ../shared beside the checkout; LINGBOT_ISAAC_SHARED points elsewhere (e.g. a copy on the GPU machine)
SHARED = Path(os.environ.get("LINGBOT_ISAAC_SHARED", REPO.parent / "shared"))
GOLDEN = SHARED / "golden"


def pythonpath_with_repo() -> str:
    """PYTHONPATH for a subprocess of the checkout's code: the checkout first, then the caller's path (packages
    installed beside it, as on a lent GPU machine, where a path of the checkout alone hid them)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="session")
def golden() -> Path:
    if not GOLDEN.is_dir():
        pytest.skip(f"reference golden files not found at {GOLDEN} (../shared beside the repo)")
    return GOLDEN


@pytest.fixture(scope="session")
def lingbot_examples() -> Path:
    path = SHARED / "reference" / "lingbot_examples"
    if not path.is_dir():
        pytest.skip(f"reference examples not found at {path} (../shared beside the repo)")
    return path


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """A real `serve` subprocess with its real worker (`python -m worldgen.worker`, the built-in tiny
    model on the CPU), loaded, shared by the tests of one module (loading takes ~10 s on 2 cores)."""
    from tests.bridge.conftest import TINY, ServerPool

    pool = ServerPool(tmp_path_factory.mktemp("tiny-server"))
    try:
        yield pool.start(worker=TINY).wait_loaded()
    finally:
        pool.close()


@dataclasses.dataclass
class MeasuredRun:
    """A `lingbot_cli` subprocess as the "inputs first" tests see it."""

    returncode: int
    stdout: str
    stderr: str
    errors: list[str]  # stderr without -X importtime's lines
    imported: set[str]  # every module the process imported
    cpu_s: float  # CPU seconds it used (user + system)
    wall_s: float


def run_cli_measured(args: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> MeasuredRun:
    """`python -X importtime -m lingbot_cli ARGS`: what it said, what it imported, what it cost."""
    before, started = _cpu_seconds_of_children(), time.monotonic()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lingbot_cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    cpu, wall = _cpu_seconds_of_children() - before, time.monotonic() - started
    lines = done.stderr.splitlines()
    timing = "import time:"
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith(timing)}
    errors = [line for line in lines if not line.startswith(timing)]
    return MeasuredRun(done.returncode, done.stdout, done.stderr, errors, imported, cpu, wall)


def _cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CODE_FOLDERS = ("contracts", "lingbot_isaac", "bridge", "worldgen", "comparison", "lingbot_cli", "bench", "scripts")


def files_matching(pattern: str, folders: tuple[str, ...] = CODE_FOLDERS) -> list[str]:
    """The repo's Python files (relative paths, sorted) in which the regular expression `pattern` occurs:
    the "one home" tests assert that a rule, a reader or a literal lives in one file only."""
    found = re.compile(pattern, re.M)
    return sorted(
        str(path.relative_to(REPO))
        for folder in folders
        for path in (REPO / folder).rglob("*.py")
        if found.search(path.read_text())
    )
