"""A worker on a GPU keeps torch's CPU threads few (`worldgen.worker.host_threads`): its one launching
thread needs a core, and torch's default OpenMP team of one thread per core left it none in a live job."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from worldgen.worker import GPU_WORKER_CPU_THREADS, host_threads


def test_a_gpu_worker_takes_few_cpu_threads_unless_told_otherwise():
    assert host_threads("cuda", {}) == host_threads("cuda:1", {}) == GPU_WORKER_CPU_THREADS
    assert host_threads("cuda:0", {"OMP_NUM_THREADS": "8"}) is None  # the user's (or the pool's) choice
    assert host_threads("cpu", {}) is None  # a CPU worker computes with them: torch's own count


def _engine_threads(device: str) -> int:
    code = (
        "import torch; from contracts.engine_options import EngineOptions; from worldgen.worker import PipelineEngine; "
        f"PipelineEngine(EngineOptions(model='fast', device='{device}')); print(torch.get_num_threads())"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_engine_on_a_gpu_runs_torch_with_few_cpu_threads():
    assert _engine_threads("cuda") == GPU_WORKER_CPU_THREADS
