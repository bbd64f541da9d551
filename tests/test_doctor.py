"""`lingbot-isaac doctor` as a user runs it (a real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO, pythonpath_with_repo

# After doctor ran, bitsandbytes' CPU backend logs what it logs on import on CPUs with AVX512-BF16
# (this machine may have none): the same logger, the same words.
DOCTOR_THEN_BNB_NOTICE = (
    "import logging, sys\n"
    "from lingbot_cli.main import main\n"
    "code = main(['doctor', '--ckpt-dir', 'tiny'])\n"
    "logging.getLogger('bitsandbytes.backends.cpu.ops').warning(\n"
    "    'Failed to load CPU gemm_4bit_forward from kernels-community: No module named kernels')\n"
    "sys.exit(code)\n"
)


def test_doctor_knows_the_built_in_tiny_model_and_hides_the_harmless_bitsandbytes_notice(tmp_path):
    env = {**os.environ, "PYTHONPATH": pythonpath_with_repo(), "LINGBOT_ISAAC_CACHE": str(tmp_path / "cache")}
    env.pop("LINGBOT_ISAAC_VERBOSE", None)
    result = subprocess.run(
        [sys.executable, "-c", DOCTOR_THEN_BNB_NOTICE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert "ckpt     tiny: the built-in tiny model" in result.stdout, result.stdout + result.stderr
    assert "does not exist" not in result.stdout and "PROBLEM" not in result.stdout
    assert "bf16 layout, experts ['high', 'low']" in result.stdout
    assert "gemm_4bit_forward" not in result.stdout + result.stderr
