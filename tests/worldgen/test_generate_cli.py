"""`lingbot-isaac generate` on the built-in tiny model: a playable mp4 from RGB and grayscale images."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
import sys

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO, run_cli_measured


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
    assert "measured per phase" not in result.stderr and "memory plan" not in result.stderr  # quiet by default
    meta, frames = read_frames(out)
    assert meta["fps"] == 16 and meta["codec"].startswith("h264")
    assert len(frames) == 17 and meta["size"] == (160, 80)
    assert not list(tmp_path.glob(".out-*"))  # no temporary left behind
    assert json.loads(out.with_suffix(".json").read_text())["model"]["random_weights"] is True


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


@pytest.mark.slow
def test_generate_writes_its_provenance_record_and_the_report_shows_it(tmp_path, cache):
    """generate -> rollout.mp4 + rollout.json (0644 under umask 022) -> compare: model, noise banner, every setting."""
    from comparison.report import compare_episode
    from contracts.provenance import REQUIRED_SETTINGS, TINY_NOTE, read_record

    episode = shutil.copytree(REPO / "data" / "sample_room", tmp_path / "ep")
    out = episode / "rollout.mp4"
    result = run_cli(
        "generate",
        "--action-path",
        str(episode),
        "-o",
        str(out),
        "--quiet",
        "--frame-num",
        "81",
        "--steps",
        "2",
        "--seed",
        "7",
        env_cache=cache,
    )
    assert result.returncode == 0, result.stderr
    # one line per adjustment of the request, no raw warning, no "[bf16]" on a CPU computing in float32
    assert "note: 81 frames asked, 33 poses: generating 33" in result.stderr
    assert "UserWarning" not in result.stderr and "[bf16]" not in result.stderr
    assert "computing in float32 on cpu" in result.stderr
    assert "gemm_4bit_forward" not in result.stderr  # bitsandbytes' harmless CPU-kernel notice is hidden
    record, note = read_record(out)
    assert note is None and record["producer"] == "generate"
    assert record["model"]["random_weights"] is True and record["model"]["weights"] == "tiny"
    assert record["settings"]["frame_num"] == 33 and record["requested"]["frame_num"] == 81
    assert record["settings"]["steps"] == 2 and record["settings"]["seed"] == 7
    assert record["checkpoint"]["fingerprint"].startswith("sha256:") and record["checkpoint"]["files"] > 5
    assert record["versions"]["torch"] and record["timings"]["denoise_s"] > 0 and "chunks" not in record["timings"]
    for path in (out, out.with_suffix(".json")):
        assert path.stat().st_mode & 0o777 == 0o644, path  # the process umask (022), not mkstemp's 0600

    page = html.unescape(compare_episode(episode, out, tmp_path / "report").read_text())
    top = page[: page.index("<h2>")]
    assert "tiny (random weights)" in top and TINY_NOTE in top
    for key in REQUIRED_SETTINGS:
        assert f"setting: {key}" in top
    assert "81 frames asked, 33 poses: generating 33" in top


@pytest.mark.parametrize("case", ["missing image", "bad poses", "bad setting", "too few frames"])
def test_bad_input_fails_in_a_second_without_loading_a_model(lingbot_examples, tmp_path, cache, case):
    """Checked before anything heavy: the checkpoint path does not exist, so a model load (or even the
    layout check) would fail with "does not exist" instead; -X importtime shows what was imported."""
    action = shutil.copytree(lingbot_examples / "00", tmp_path / "action")
    args = ["--action-path", str(action)]
    expected = {
        "missing image": "nope.png: image file not found",
        "bad poses": "poses.npy",
        "bad setting": "steps must be in [1, 1000] (got 0)",
        "too few frames": "frame_num 3 is too small",
    }[case]
    if case == "missing image":
        args += ["--image", str(tmp_path / "nope.png")]
    elif case == "bad poses":
        poses = np.load(action / "poses.npy")
        poses[3, :3, :3] *= 2.0
        np.save(action / "poses.npy", poses)
    elif case == "bad setting":
        args += ["--steps", "0"]
    else:
        args += ["--frame-num", "3"]
    env = {"LINGBOT_ISAAC_CACHE": str(cache), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    result = run_cli_measured(
        ["generate", *args, "--ckpt-dir", str(tmp_path / "no-such-checkpoint"), "-o", str(tmp_path / "o.mp4")], env=env
    )
    errors = result.errors
    assert result.returncode == 2 and errors[-1].startswith("error: ") and expected in errors[-1], errors
    assert "does not exist" not in result.stderr, "the checkpoint was looked at before the input"
    assert not {"torch", "worldgen.pipelines.base", "worldgen.runtime.checkpoint", "bitsandbytes"} & result.imported, (
        "a model was on its way"
    )
    assert result.cpu_s < 2.0, f"{result.cpu_s:.2f} s of CPU ({result.wall_s:.2f} s wall on a shared machine)"
    assert not (tmp_path / "o.mp4").exists()


def test_default_settings_are_the_reference_and_fast40_is_a_named_preset():
    """[default] is LingBot-World's own i2v-A14B config (70 steps, shift 10, guidance 5/5);
    today's 40 / 5 stays reachable only by name."""
    from argparse import Namespace

    from contracts.settings import GenerationSettings, load_settings
    from lingbot_cli.generate import settings_from_args

    flags = dict(size=None, frame_num=None, steps=None, shift=None, seed=None, negative_prompt=None, guide_scale=None)
    default = settings_from_args(Namespace(preset=None, **flags), tiny=False)
    assert (default.steps, default.shift, default.guide_scale) == (70, 10.0, (5.0, 5.0))
    assert (default.frame_num, default.size) == (81, "480*832")
    assert default == load_settings() == GenerationSettings()  # the TOML and the built-in defaults agree
    fast = settings_from_args(Namespace(preset="fast40", **{**flags, "seed": 3}), tiny=False)
    assert (fast.steps, fast.shift, fast.seed) == (40, 5.0, 3)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpus", "0,1"], "no CUDA GPU"),
        (["--compute", "fp8"], "FP8 tensor cores"),
        (["--device", "cuda"], "device cuda: this machine has no CUDA GPU"),
        (["--device", "cuda:1"], "device cuda:1: this machine has no CUDA GPU"),
    ],
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
        "-o", str(out), "--quiet", "--verbose", env_cache=cache,  # --verbose: the plan, with its kv cache
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Fast, bf16 checkpoint layout" in result.stderr and "kv cache" in result.stderr
    assert "its output is noise" in result.stderr  # the tiny model says so, whichever model runs
    # 25 frames = 7 latent frames: rounded to whole chunks, said in one line (no raw UserWarning)
    assert "generating 21 frames" in result.stderr and "UserWarning" not in result.stderr
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["model"]["variant"] == "fast" and record["settings"]["frame_num"] == 21
    assert any("generating 21 frames" in line for line in record["adjustments"])
    # the record holds the Fast plan that ran (its DiT loop and this job's KV cache), not the base's experts
    assert "Fast DiT resident" in record["memory_plan"] and "kv cache" in record["memory_plan"]
    assert "experts" not in record["memory_plan"]
    # each chunk's seconds, where a live job's time went on the worker's side: 21 frames = 2 chunks
    chunks = record["timings"]["chunks"]
    assert len(chunks) == 2 and all(c["dit"] > 0 and c["decode"] > 0 for c in chunks)
    assert all(abs(c["wall"] - c["dit"] - c["encode"] - c["decode"]) <= 0.002 for c in chunks)
    meta, frames = read_frames(out)
    assert len(frames) == 21 and meta["size"] == (160, 80)


def test_fast_model_without_its_folder_is_a_clear_error(tmp_path, cache, lingbot_examples):
    from worldgen.runtime.tiny import ensure_tiny_checkpoint

    root = tmp_path / "base"
    shutil.copytree(ensure_tiny_checkpoint("bf16"), root, ignore=shutil.ignore_patterns("lingbot_world_fast*"))
    result = run_cli(
        "generate", "--model", "fast", "--ckpt-dir", str(root), "--action-path", str(lingbot_examples / "00"),
        "-o", str(tmp_path / "x.mp4"), env_cache=cache,
    )  # fmt: skip
    assert result.returncode != 0 and "lingbot_world_fast/" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.mp4").exists()
