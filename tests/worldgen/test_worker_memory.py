"""The worker's health memory figures come from the one metering home (worldgen.runtime.metering), which is
the only code that reads this process's /proc figures; the worker's protocol side stays torch-free."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO, files_matching


def test_only_metering_reads_this_process_proc_status():
    where = files_matching(r"/proc/self/")
    assert where == ["worldgen/runtime/metering.py"]


def test_worker_health_memory_is_the_metering_figures_without_torch():
    code = (
        "import sys; from worldgen import worker; from worldgen.runtime import metering; "
        "info = worker.memory_info(); rss = metering.rss_gib(); peak = metering.peak_rss_gib(); "
        "assert 'torch' not in sys.modules, 'the worker protocol side imported torch'; "
        "assert set(info) == {'rss_mb', 'peak_rss_mb'}, info; "
        "assert abs(info['rss_mb'] - rss * 1024) < 64 and info['peak_rss_mb'] <= peak * 1024 + 1, (info, rss, peak); "
        "assert 0 < info['rss_mb'] <= info['peak_rss_mb'], info"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
