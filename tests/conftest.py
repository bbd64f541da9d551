"""Shared test fixtures: where the reference material lives."""

from __future__ import annotations

from pathlib import Path

import pytest

import os

REPO = Path(__file__).resolve().parent.parent
# ../shared beside the checkout; LINGBOT_ISAAC_SHARED points elsewhere (e.g. a copy on the GPU machine)
SHARED = Path(os.environ.get("LINGBOT_ISAAC_SHARED", REPO.parent / "shared"))
GOLDEN = SHARED / "golden"


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
