"""The layering contract (pyproject.toml [tool.importlinter]) holds, and fails on a planted violation.

`lint-imports` (import-linter) builds the import graph of our packages (direct and indirect
imports, also those inside functions) and checks every contract: contracts imports none of ours,
nothing on the Isaac side imports torch, OpenCV or worldgen, worldgen never imports zmq, omni or
bridge (but the worker protocol), the comparison imports none of the others.
"""

from __future__ import annotations

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
        ("bridge/fair_queue.py", "from worldgen import camera", "never imports torch, OpenCV or worldgen"),
        ("contracts/model_frame.py", "import bridge.protocol", "contracts is the bottom layer"),
        ("worldgen/scheduler.py", "import zmq", "worldgen knows no ZeroMQ"),
        ("comparison/metrics.py", "from lingbot_isaac import camera", "comparison stands alone"),
        ("lingbot_isaac/session.py", "from comparison import report", "lingbot_isaac asks the CLI"),
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
