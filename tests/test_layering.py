"""The layering contract (pyproject.toml [tool.importlinter]) holds, and fails on a planted violation.

`lint-imports` (import-linter) builds the import graph of our packages (direct and indirect
imports, also those inside functions) and checks every contract: contracts imports none of ours,
nothing on the Isaac side imports torch, OpenCV or worldgen, worldgen never imports zmq, omni or
bridge (but the worker protocol), the comparison imports none of the others.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("contracts", "lingbot_isaac", "bridge", "worldgen", "comparison", "lingbot_cli")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (the dev extra)")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def copy_of_the_repo(target: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(REPO / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", target / "pyproject.toml")
    return target


def test_the_layering_contract_holds():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    "module,line,contract",
    [
        ("lingbot_isaac/resample.py", "import torch", "the Isaac side (lingbot_isaac, bridge) never imports torch"),
        (
            "bridge/server/fair_queue.py",
            "from worldgen.pipelines import camera",
            "never imports torch, OpenCV or worldgen",
        ),
        ("contracts/model_frame.py", "import bridge.wire.protocol", "contracts is the bottom layer"),
        ("worldgen/pipelines/scheduler.py", "import zmq", "worldgen knows no ZeroMQ"),
        ("comparison/metrics.py", "from lingbot_isaac import camera", "comparison stands alone"),
        ("lingbot_isaac/session.py", "from comparison import report", "lingbot_isaac asks the CLI"),
        ("worldgen/kernels/fused.py", "from worldgen.models import dit", "worldgen's rooms"),
        ("worldgen/models/dit.py", "from worldgen.runtime import memory", "worldgen's rooms"),
        ("worldgen/runtime/memory.py", "from worldgen.pipelines import base", "worldgen's rooms"),
        ("bridge/client/client.py", "from bridge.server import jobs", "the client never imports the server"),
        ("bridge/client/submit.py", "from bridge.workers import supervisor", "the client never imports the server"),
        ("bridge/wire/protocol.py", "from bridge.client import job_events", "the wire (message formats"),
        ("bridge/workers/worker_pool.py", "from bridge.server import server_config", "the workers never import"),
    ],
)
def test_a_planted_violation_breaks_it(tmp_path, module, line, contract):
    root = copy_of_the_repo(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {line}  # noqa\n")  # even inside a function
    done = lint_imports(root)
    assert done.returncode != 0 and "0 broken" not in done.stdout, done.stdout
    report = done.stdout.split("Broken contracts")[-1]
    planted_in = module.removesuffix(".py").replace("/", ".")
    assert contract in report and f"{planted_in} ->" in report, done.stdout


def import_circles(root: Path) -> list[list[str]]:
    """Groups of our modules that import each other, directly or round a loop (imports inside
    functions count): Tarjan's strongly connected components over grimp's import graph."""
    code = (
        "import grimp, json, sys\n"
        "sys.setrecursionlimit(10000)\n"
        f"g = grimp.build_graph(*{PACKAGES!r}, cache_dir=None)\n"
        "index, low, stack, on, circles = {}, {}, [], set(), []\n"
        "def visit(v):\n"
        "    index[v] = low[v] = len(index); stack.append(v); on.add(v)\n"
        "    for w in g.find_modules_directly_imported_by(v):\n"
        "        if w not in index: visit(w); low[v] = min(low[v], low[w])\n"
        "        elif w in on: low[v] = min(low[v], index[w])\n"
        "    if low[v] == index[v]:\n"
        "        group = []\n"
        "        while True:\n"
        "            w = stack.pop(); on.discard(w); group.append(w)\n"
        "            if w == v: break\n"
        "        if len(group) > 1: circles.append(sorted(group))\n"
        "for m in sorted(g.modules):\n"
        "    if m not in index: visit(m)\n"
        "print(json.dumps(circles))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_import_circle_among_our_modules():
    assert import_circles(REPO) == []


def test_a_planted_import_circle_is_found(tmp_path):
    root = copy_of_the_repo(tmp_path)
    path = root / "worldgen/pipelines/base.py"
    # a lazy import counts too: fast_conditioning imports base at the top
    path.write_text(
        path.read_text() + "\n\ndef _planted():\n    from worldgen.pipelines import fast_conditioning  # noqa\n"
    )
    assert ["worldgen.pipelines.base", "worldgen.pipelines.fast_conditioning"] in import_circles(root)


def _source_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / name for name in listed.stdout.split() if name.split("/")[0] in (*PACKAGES, "bench", "scripts")]


def test_no_source_file_is_over_600_lines():
    long = {str(p.relative_to(REPO)): n for p in _source_files() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these by responsibility: {long}"


def test_argparse_lives_only_in_the_cli_bench_and_scripts():
    users = [p for p in _source_files() if "argparse" in p.read_text()]
    outside = [
        str(p.relative_to(REPO))
        for p in users
        if p.relative_to(REPO).parts[0] not in ("lingbot_cli", "bench", "scripts")
    ]
    assert not outside, f"every command's arguments belong in lingbot_cli/: {outside}"
