"""The cache root (LINGBOT_ISAAC_CACHE, else ~/.cache/lingbot-isaac) has one home: worldgen.runtime.tiny.cache_root."""

from __future__ import annotations

from tests.conftest import files_matching
from worldgen.pipelines.text_cache import default_cache_dir
from worldgen.runtime.tiny import cache_root


def test_the_cache_root_is_read_in_one_place(tmp_path, monkeypatch):
    assert files_matching(r"LINGBOT_ISAAC_CACHE\"") == ["worldgen/runtime/tiny.py"]
    monkeypatch.setenv("LINGBOT_ISAAC_CACHE", str(tmp_path))  # the user's setting, as a shell sets it
    assert cache_root() == tmp_path and default_cache_dir() == tmp_path / "text-embeddings"
