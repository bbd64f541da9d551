"""Each contract is defined once (issue 13 acceptance).

One rule changed in one place -- `contracts.episode.RIGID_TOLERANCE` -- is seen by the Isaac
export, the client, the server's door and spool, and the engine. And the source tree holds one
definition of each episode validation rule, of the model frame and of the settings defaults.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bridge.client.client_errors import PayloadError
from bridge.client.episode_payload import EpisodePayload
from bridge.server.spool import Spool
from bridge.wire import protocol
from contracts import episode
from contracts.episode import EpisodeError, EpisodeMeta, write_episode
from tests.conftest import files_matching

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("contracts", "lingbot_isaac", "bridge", "worldgen", "comparison", "lingbot_cli")
INTRINSICS = np.tile(np.float32([500, 500, 416, 240]), (9, 1))


def almost_rigid(offset: float) -> np.ndarray:
    """Nine forward-walking poses; pose 4's last row is [offset, 0, 0, 1]."""
    poses = np.repeat(np.eye(4, dtype=np.float32)[None], 9, axis=0)
    poses[:, 2, 3] = np.linspace(0, 1, 9)
    poses[4, 3, 0] = offset
    return poses


def png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def verdicts(tmp_path: Path, poses: np.ndarray) -> dict[str, bool]:
    """Does each consumer of the episode format accept these poses?"""
    from worldgen.errors import InputError
    from worldgen.pipelines.camera import validate_action

    def accepts(check, *errors) -> bool:
        try:
            check()
        except errors:
            return False
        return True

    spool = Spool(tmp_path / f"spool-{len(list(tmp_path.iterdir()))}")
    out = {
        "isaac export": accepts(
            lambda: write_episode(
                tmp_path / f"ep-{len(list(tmp_path.iterdir()))}",
                poses,
                [50, 50, 32, 24],
                np.zeros((48, 64, 3), np.uint8),
                "p",
                EpisodeMeta((48, 64)),
            ),  # fmt: skip
            EpisodeError,
        ),
        "client": accepts(lambda: EpisodePayload(png(), poses, INTRINSICS, "p"), PayloadError),
        "server door": accepts(lambda: protocol.check_episode_arrays(poses, INTRINSICS), protocol.ProtocolError),
        "spool": accepts(
            lambda: spool.accept(
                client="c", rid="r", prompt="p", image=png(), poses=poses, intrinsics=INTRINSICS, settings={}
            ),  # fmt: skip
            EpisodeError,
        ),
        "engine": accepts(lambda: validate_action(poses, INTRINSICS), InputError),
    }
    spool.close()
    return out


def test_the_rigid_tolerance_is_one_constant_seen_everywhere(tmp_path, monkeypatch):
    poses = almost_rigid(5e-4)
    assert verdicts(tmp_path, almost_rigid(0.0)) == dict.fromkeys(verdicts(tmp_path, poses), True)
    assert set(verdicts(tmp_path, poses).values()) == {False}  # 5e-4 > RIGID_TOLERANCE: all refuse
    monkeypatch.setattr(episode, "RIGID_TOLERANCE", 1e-3)  # the one place
    assert set(verdicts(tmp_path, poses).values()) == {True}  # ...and all of them follow


def python_sources() -> list[Path]:
    return [p for package in PACKAGES for p in (REPO / package).rglob("*.py")]


@pytest.mark.parametrize(
    "name",
    ["RIGID_TOLERANCE", "ROTATION_TOLERANCE", "MIN_POSES", "GENERATE_MIN_POSES", "MODEL_HEIGHT", "MODEL_WIDTH",
     "SCHEMA_VERSION", "JPEG_MAGIC", "PNG_MAGIC", "IMAGE_NAMES", "COMPUTES", "ATTENTIONS", "MODELS"],
)  # fmt: skip
def test_one_definition_of_each_rule(name):
    assignment = re.compile(rf"^\s*{name}\s*(:[^=]*)?=(?!=)", re.M)
    where = [str(p.relative_to(REPO)) for p in python_sources() if assignment.search(p.read_text())]
    # a name bound to the contract's own (`BACKENDS = ATTENTIONS`) is a use, not a definition
    alias = re.compile(rf"^\s*{name}\s*=\s*[A-Za-z_][\w.]*\s*(#.*)?$", re.M)
    definitions = [w for w in where if not alias.search((REPO / w).read_text())]
    assert len(definitions) == 1 and definitions[0].startswith("contracts/"), where


def test_the_model_frame_is_written_down_once():
    literal = re.compile(r"^[^#\n]*(=|\()\s*\(?\s*480\s*,\s*832\b|^\s*\w+\s*(:\s*int)?\s*=\s*(480|832)\s*(#|$)", re.M)
    where = [str(p.relative_to(REPO)) for p in python_sources() if literal.search(p.read_text())]
    assert where == ["contracts/model_frame.py"]


def test_the_settings_defaults_are_stated_once():
    from contracts.settings import FIELDS, load_presets

    assert load_presets()["default"] == {}  # config/generation.toml's [default] restates nothing
    defining = re.compile(r"^class GenerationSettings\b|^\s*FIELDS\s*(:[^=]*)?=", re.M)
    where = sorted(str(p.relative_to(REPO)) for p in python_sources() if defining.search(p.read_text()))
    assert where == ["contracts/settings.py"] and len(FIELDS) >= 11


def test_benches_and_scripts_take_their_defaults_from_contracts():
    """No bench or script restates a generation default or the model frame (steps, shift, sizes, frame
    counts): they import contracts.settings / contracts.model_frame or name a preset."""
    literal = (
        r"default\s*=\s*(?:480|832|81|70|40|17|4)\b"  # argparse defaults: frame sides, frame counts, steps
        r"|default\s*=\s*\"\d+\*\d+\""  # a size string
        r"|\b(?:steps|shift|frame_num|size)\s*=\s*(?:\d|\"\d)"  # a setting passed as a literal
    )
    where = files_matching(literal, ("bench", "scripts"))
    assert where == []


def test_the_endpoint_and_the_request_timeout_are_stated_once():
    """contracts.connection holds the loopback endpoint and the client's per-request timeout; no
    client, CLI, Isaac session or script restates them (they used to, in five places each)."""
    from contracts import connection

    assert protocol.DEFAULT_PORT == connection.DEFAULT_PORT
    restated = r"[\"']tcp://127\.0\.0\.1:\d+[\"']|timeout\s*(:\s*float\s*)?=\s*10\.0|default=10\.0|\b5570\b(?!\S*\s*(by default|the default))"
    code = [p for p in files_matching(restated, PACKAGES + ("scripts",)) if p != "contracts/connection.py"]
    assert code == []
    # the Isaac window's frame count starts from the settings default, not a literal of its own
    window = (REPO / "lingbot_isaac" / "window.py").read_text()
    assert 'settings.frame_num or FIELD_BY_NAME["frame_num"].default' in window and "or 81" not in window
