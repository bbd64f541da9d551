"""`lingbot-isaac generate` on the built-in tiny model: a playable mp4 from RGB and grayscale images."""

from __future__ import annotations

import shutil
import subprocess
import sys

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO


def run_cli(*args, env_cache, timeout=240):
    env = {"LINGBOT_ISAAC_CACHE": str(env_cache), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lingbot_cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_frames(path):
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = reader.__next__()
    frames = [np.frombuffer(f, np.uint8) for f in reader]
    return meta, frames


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("mode", ["RGB", "L", "I;16", "RGBA", "P"])
def test_tiny_generate_writes_playable_mp4(lingbot_examples, tmp_path, cache, mode):
    action = tmp_path / "action"
    shutil.copytree(lingbot_examples / "00", action)
    image = Image.open(action / "image.jpg").convert("RGB")
    if mode == "I;16":
        image = Image.fromarray(np.asarray(image.convert("L"), dtype=np.uint16) * 257)
        image.save(action / "image.png")
    elif mode != "RGB":
        image.convert(mode).save(action / "image.png")
    if mode != "RGB":
        (action / "image.jpg").unlink()
    out = tmp_path / "out.mp4"
    result = run_cli("generate", "--action-path", str(action), "-o", str(out), "--quiet", env_cache=cache)
    assert result.returncode == 0, result.stderr
    assert "noise" in result.stderr  # the tiny model says its output is noise
    assert "measured per phase" in result.stderr
    meta, frames = read_frames(out)
    assert meta["fps"] == 16 and meta["codec"].startswith("h264")
    assert len(frames) == 17 and meta["size"] == (160, 80)
    assert not list(tmp_path.glob(".out-*"))  # no temporary left behind


def test_bad_poses_exit_nonzero_and_write_nothing(lingbot_examples, tmp_path, cache):
    action = tmp_path / "action"
    shutil.copytree(lingbot_examples / "00", action)
    poses = np.load(action / "poses.npy")
    poses[3, :3, :3] *= 2.0  # not a rotation any more
    np.save(action / "poses.npy", poses)
    out = tmp_path / "out.mp4"
    result = run_cli("generate", "--action-path", str(action), "-o", str(out), "--quiet", env_cache=cache)
    assert result.returncode == 2
    assert "poses.npy" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_missing_checkpoint_folder_is_a_clear_error(tmp_path, cache, lingbot_examples):
    result = run_cli(
        "generate",
        "--ckpt-dir",
        str(tmp_path / "nope"),
        "--action-path",
        str(lingbot_examples / "00"),
        "-o",
        str(tmp_path / "o.mp4"),
        env_cache=cache,
    )
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_help_explains_the_flags():
    result = subprocess.run(
        [sys.executable, "-m", "lingbot_cli", "generate", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    for flag in ("--ckpt-dir", "--action-path", "--size", "--frame-num", "--guide-scale", "--vram-budget"):
        assert flag in result.stdout


def test_default_settings_are_the_reference_and_fast40_is_a_named_preset():
    """[default] is LingBot-World's own i2v-A14B config (70 steps, shift 10, guidance 5/5);
    today's 40 / 5 stays reachable only by name."""
    from argparse import Namespace

    from contracts.settings import GenerationSettings, load_settings
    from worldgen.generate_cli import settings_from_args

    flags = dict(size=None, frame_num=None, steps=None, shift=None, seed=None, negative_prompt=None, guide_scale=None)
    default = settings_from_args(Namespace(preset=None, **flags), tiny=False)
    assert (default.steps, default.shift, default.guide_scale) == (70, 10.0, (5.0, 5.0))
    assert (default.frame_num, default.size) == (81, "480*832")
    assert default == load_settings() == GenerationSettings()  # the TOML and the built-in defaults agree
    fast = settings_from_args(Namespace(preset="fast40", **{**flags, "seed": 3}), tiny=False)
    assert (fast.steps, fast.shift, fast.seed) == (40, 5.0, 3)


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--gpus", "0,1"], "no CUDA GPU"), (["--compute", "fp8"], "FP8 tensor cores")],
)
def test_gpu_only_paths_refuse_clearly_on_a_cpu_machine(lingbot_examples, tmp_path, cache, flags, message):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out.mp4"
    result = run_cli("generate", "--action-path", str(lingbot_examples / "00"), "-o", str(out), "--quiet", *flags,
                     env_cache=cache)  # fmt: skip
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_tiny_generate_with_the_fast_model(lingbot_examples, tmp_path, cache):
    out = tmp_path / "fast.mp4"
    result = run_cli(
        "generate", "--model", "fast", "--action-path", str(lingbot_examples / "00"), "--frame-num", "25",
        "-o", str(out), "--quiet", env_cache=cache,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "[bf16, Fast]" in result.stderr and "kv cache" in result.stderr
    assert "generating 21 frames" in result.stderr  # 25 frames = 7 latent frames: rounded to whole chunks
    meta, frames = read_frames(out)
    assert len(frames) == 21 and meta["size"] == (160, 80)


def test_fast_model_without_its_folder_is_a_clear_error(tmp_path, cache, lingbot_examples):
    from worldgen.tiny import ensure_tiny_checkpoint

    root = tmp_path / "base"
    shutil.copytree(ensure_tiny_checkpoint("bf16"), root, ignore=shutil.ignore_patterns("lingbot_world_fast*"))
    result = run_cli(
        "generate", "--model", "fast", "--ckpt-dir", str(root), "--action-path", str(lingbot_examples / "00"),
        "-o", str(tmp_path / "x.mp4"), env_cache=cache,
    )  # fmt: skip
    assert result.returncode != 0 and "lingbot_world_fast/" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.mp4").exists()
