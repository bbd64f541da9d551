"""Isaac Lab's own dataset code (2.x and 3.x), loaded from the wheels `make test` installs.

`make test` puts `isaaclab==2.3.2` and `isaaclab==3.0.0` (`--no-deps`) into `.venv/isaaclab/2` and
`.venv/isaaclab/3`. Importing the `isaaclab` package needs Isaac Sim, so only the files we use are
loaded, under a private name per version: `utils/datasets/*` (`HDF5DatasetFileHandler`,
`EpisodeData`) and `utils/math.py` (`convert_camera_frame_orientation_convention`), which import
only h5py, numpy and torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

ISAACLAB_ROOT = Path(sys.prefix) / "isaaclab"
# Where each wheel keeps isaaclab/utils (the 2.3.2 wheel ships the source tree as it is).
UTILS_DIRS = ("isaaclab/utils", "isaaclab/source/isaaclab/isaaclab/utils")
QUAT_ORDER = {"2": "wxyz", "3": "xyzw"}  # the generations' quaternion order


def isaaclab(generation: str) -> types.SimpleNamespace:
    """`handler`, `episode_data` and `math` modules of Isaac Lab `generation` ("2" or "3")."""
    name = f"_isaaclab{generation}_utils"
    if name not in sys.modules:
        root = ISAACLAB_ROOT / generation
        utils = next((root / d for d in UTILS_DIRS if (root / d / "datasets").is_dir()), None)
        if utils is None:
            pytest.skip(f"Isaac Lab {generation}.x wheel not installed in {root}; run `make test` (it installs it)")
        pytest.importorskip("torch", reason="Isaac Lab's dataset code needs torch")
        package = types.ModuleType(name)
        package.__path__ = [str(utils)]
        sys.modules[name] = package
        datasets = types.ModuleType(f"{name}.datasets")  # skip its __init__ (lazy_loader, Isaac Sim)
        datasets.__path__ = [str(utils / "datasets")]
        sys.modules[datasets.__name__] = datasets
    return types.SimpleNamespace(
        handler=importlib.import_module(f"{name}.datasets.hdf5_dataset_file_handler"),
        episode_data=importlib.import_module(f"{name}.datasets.episode_data"),
        math=importlib.import_module(f"{name}.math"),
        quat_order=QUAT_ORDER[generation],
    )
