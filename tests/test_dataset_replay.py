"""Whole datasets through `lingbot-isaac replay`: demo selection, a bounded window that backs off on
`busy`, resume after the client is killed, and the dataset report at the end.

The datasets are Isaac Lab HDF5 files written by Isaac Lab 3's own `HDF5DatasetFileHandler` when
`make test` installed its wheel (tests/isaac/isaaclab_real.py), else by the same layout written
here with h5py (format_version 1, xyzw quaternions, `success` per demo).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from lingbot_cli.main import main as cli
from tests.bridge.conftest import REPO, TINY, ServerPool, standin_command, wait_for
from tests.room_render import look_at

h5py = pytest.importorskip("h5py", reason="h5py is not installed")
# Isaac Lab's math module compiles its helpers with torch.jit.script, which torch 2.13 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

RATE = 30.0
H, W = 96, 160
K = np.array([[120.0, 0.0, 80.0], [0.0, 120.0, 48.0], [0.0, 0.0, 1.0]])
PROMPT = "a wrist camera sweeps over a table"
SMALL = ["--size", "48*80", "--frame-num", "5", "--steps", "2"]


def demo_poses(index: int, steps: int) -> np.ndarray:
    t = np.arange(steps) / RATE
    eyes = np.stack([0.6 * np.cos(t + index), 0.6 * np.sin(t + index), 0.5 + 0.1 * t], axis=1)
    targets = np.stack([0.1 * np.sin(3 * t), 0.05 * t, 0.0 * t], axis=1)
    return np.stack([look_at(e, g) for e, g in zip(eyes, targets, strict=True)])


def _isaaclab3():
    from tests.isaac.isaaclab_real import ISAACLAB_ROOT

    if not (ISAACLAB_ROOT / "3").is_dir():
        return None
    pytest.importorskip("torch")
    from tests.isaac.isaaclab_real import isaaclab

    return isaaclab("3")


def write_lab_dataset(path: Path, demos: int, steps: int = 24, failed: tuple[int, ...] = ()) -> str:
    """An Isaac Lab dataset of `demos` demos (camera pose terms + rgb); returns who wrote it."""
    frames = np.random.default_rng(0).integers(0, 256, (steps, H, W, 3), dtype=np.uint8)
    lab = _isaaclab3()
    if lab is not None:
        import torch

        handler = lab.handler.HDF5DatasetFileHandler()
        handler.create(str(path), env_name="Isaac-Stack-Cube-Franka-IK-Rel-Visuomotor-v0")
        for index in range(demos):
            poses = demo_poses(index, steps)
            quat = Rotation.from_matrix(poses[:, :3, :3]).as_quat()  # x, y, z, w: Isaac Lab 3's order
            episode = lab.episode_data.EpisodeData()
            for step in range(steps):
                episode.add("obs/wrist_cam_pos_w", torch.tensor(poses[step, :3, 3], dtype=torch.float32))
                episode.add("obs/wrist_cam_quat_w_ros", torch.tensor(quat[step], dtype=torch.float32))
                episode.add("obs/wrist_cam_intrinsic_matrices", torch.tensor(K, dtype=torch.float32))
                episode.add("obs/wrist_cam", torch.from_numpy(frames[step]))
                episode.add("actions", torch.zeros(7))
            episode.success = index not in failed
            episode.pre_export()
            handler.write_episode(episode)
        handler.flush()
        handler.close()
        return "isaaclab"
    with h5py.File(path, "w") as h5:
        h5.attrs["format_version"] = 1
        data = h5.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Isaac-Stack-Cube-Franka-IK-Rel-Visuomotor-v0"})
        for index in range(demos):
            poses = demo_poses(index, steps)
            demo = data.create_group(f"demo_{index}")
            demo.attrs["num_samples"] = steps
            demo.attrs["success"] = index not in failed
            demo["actions"] = np.zeros((steps, 7), np.float32)
            obs = demo.create_group("obs")
            obs["wrist_cam_pos_w"] = poses[:, :3, 3].astype(np.float32)
            obs["wrist_cam_quat_w_ros"] = Rotation.from_matrix(poses[:, :3, :3]).as_quat().astype(np.float32)
            obs["wrist_cam_intrinsic_matrices"] = np.broadcast_to(K, (steps, 3, 3)).astype(np.float32)
            obs["wrist_cam_rgb"] = frames
    return "h5py"


def replay_args(dataset: Path, out: Path, endpoint: str | None, *extra: str) -> list[str]:
    args = ["replay", str(dataset), "--rate", str(RATE), "--prompt", PROMPT, "--out", str(out), *extra]
    return [*args, "--server", endpoint] if endpoint else args


def test_demo_selection(tmp_path, capsys):
    write_lab_dataset(tmp_path / "lab.hdf5", demos=6, failed=(1, 4))
    cases = {"all": 6, "successful": 4, "0-2": 3, "1,3-5": 4}
    for spec, count in cases.items():
        out = tmp_path / f"out-{spec}"
        assert cli(replay_args(tmp_path / "lab.hdf5", out, None, "--export-only", "--demos", spec)) == 0
        assert len(list(out.iterdir())) == count, spec
    assert {p.name for p in (tmp_path / "out-successful").iterdir()} == {f"lab-demo_{i}" for i in (0, 2, 3, 5)}
    capsys.readouterr()
    assert cli(replay_args(tmp_path / "lab.hdf5", tmp_path / "x", None, "--export-only", "--demos", "9-")) == 2
    assert "--demos '9-'" in capsys.readouterr().err
    assert cli(replay_args(tmp_path / "lab.hdf5", tmp_path / "x", None, "--export-only", "--demos", "50-60")) == 2
    assert "no demo" in capsys.readouterr().err


def test_window_backs_off_on_busy_and_finishes_every_episode(tmp_path):
    """A server that holds one waiting job per client: the batch gets `busy` and waits, never fails.

    The busy condition is made, not hoped for: another user's job holds the one worker until the
    replay client has said it was told `busy` (its first job waits in the queue, the cap is 1)."""
    write_lab_dataset(tmp_path / "lab.hdf5", demos=6)
    pool = ServerPool(tmp_path / "servers")
    release = tmp_path / "release-the-worker"
    replay = None
    try:
        server = pool.start(worker=standin_command(step_s=0.02, hold_until=release), max_queue_per_client=1)
        from bridge.client.client import Client
        from bridge.client.episode_payload import EpisodePayload
        from tests.bridge.conftest import make_episode

        other = Client(server.endpoint, timeout=10)  # another user's job holds the one worker
        hog = other.submit(EpisodePayload.from_dir(make_episode(tmp_path / "hog")), {"steps": 5})
        out = tmp_path / "out"
        replay = subprocess.Popen(
            [sys.executable, "-m", "lingbot_cli", *replay_args(tmp_path / "lab.hdf5", out, server.endpoint,
                                                               "--window", "5", "--steps", "3")],
            cwd=REPO, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        stderr: list[str] = []  # read as it comes (the progress bar ends its lines with \r)
        reader = threading.Thread(target=_read_all, args=(replay.stderr, stderr), daemon=True)
        reader.start()
        told_busy = "the server is busy"
        wait_for(lambda: told_busy in "".join(stderr) or replay.poll() is not None, 90, what="the client told busy")
        assert "the server is busy (you already have 1 jobs waiting" in "".join(stderr), "".join(stderr)[-3000:]
        assert not hog.done()  # the worker was still held: the client met the cap, not a slow machine
        release.touch()
        assert replay.wait(timeout=120) == 0
        reader.join(timeout=10)
        err = "".join(stderr)
        assert replay.returncode == 0, err[-3000:]
        assert sorted(p.parent.name for p in out.glob("*/rollout.mp4")) == [f"lab-demo_{i}" for i in range(6)]
        assert not list(out.glob("*/rollout.pending.json"))
        assert ": failed:" not in err  # busy was waited out, not reported as a failure
        assert "the server was busy" in err
        assert hog.result(timeout=30) and other.close() is None
        assert "replay: 100%" in err and "6/6" in err  # one bar over the dataset
        jobs = {json.loads(p.read_text())["job"]["id"] for p in out.glob("*/rollout.json")}
        assert len(jobs) == 6
    finally:
        if replay is not None and replay.poll() is None:
            replay.kill()
        pool.close()


def _read_all(stream, into: list[str]) -> None:
    while chunk := stream.read(1):
        into.append(chunk)


def _spool_names(server) -> list[str]:
    return [json.loads((d / "job.json").read_text())["name"] for d in (server.workdir / "spool" / "jobs").iterdir()]


@pytest.mark.slow
def test_forty_demo_dataset_interrupted_resumed_and_reported(tmp_path):
    """Acceptance: 40 demos through 2 tiny-model workers; the client is SIGKILLed half-way and rerun;
    finished episodes are not redone, jobs left on the server are collected, and the dataset
    report's numbers equal the per-episode reports'."""
    writer = write_lab_dataset(tmp_path / "lab.hdf5", demos=40)
    pool = ServerPool(tmp_path / "servers")
    try:
        server = pool.start(worker=TINY, worker_keys={"devices": ["cpu", "cpu"]}).wait_loaded(180, "two tiny workers")
        out = tmp_path / "out"
        command = [sys.executable, "-m", "lingbot_cli", *replay_args(tmp_path / "lab.hdf5", out, server.endpoint,
                                                                      *SMALL, "--window", "6")]  # fmt: skip
        # its output goes to a file: a pipe nobody reads would block the client once full
        with open(tmp_path / "first-client.log", "wb") as log:
            first = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: len(list(out.glob("*/rollout.mp4"))) >= 10, 300, interval=0.2, what="10 rollouts")
        except AssertionError as error:
            client_log = (tmp_path / "first-client.log").read_text(errors="replace")
            raise AssertionError(f"{error}\nclient:\n{client_log[-3000:]}\nserver:\n{server.log()[-3000:]}") from None
        os.killpg(first.pid, signal.SIGKILL)  # the client dies; the server and its jobs go on
        first.wait(timeout=10)
        finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/rollout.mp4")}
        pending = {p.parent.name for p in out.glob("*/rollout.pending.json")} - set(finished)
        assert 10 <= len(finished) < 40 and pending, (len(finished), pending)
        time.sleep(1.0)

        second = subprocess.run([*command, "--report", str(tmp_path / "report")], cwd=REPO,
                                capture_output=True, text=True, timeout=900)  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        assert f"{len(finished)} of 40 episode(s) already have rollout.mp4: skipped" in second.stderr
        videos = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/rollout.mp4")}
        assert sorted(videos) == sorted(f"lab-demo_{i}" for i in range(40))
        assert all(videos[name] == mtime for name, mtime in finished.items())  # not redone
        names = _spool_names(server)
        for name in [*finished, *pending]:  # finished: skipped; pending: followed again, not resubmitted
            assert names.count(name) == 1, (name, names.count(name))
        assert len(set(names)) == 40

        dataset = json.loads((tmp_path / "report" / "dataset.json").read_text())
        assert dataset["totals"]["episodes"] == 40 and dataset["totals"]["compared"] == 40
        assert dataset["tiny_model"] is True
        for row in dataset["episodes"]:
            report = json.loads((tmp_path / "report" / row["report_json"]).read_text())
            rollout = report["camera_fidelity"]["rollout"]["summary"]
            assert row["rotation_error_deg"] == rollout["first_to_k"]["rotation_error_deg"]["median"]
            assert row["translation_error_deg"] == rollout["first_to_k"]["translation_error_deg"]["median"]
            assert row["estimation_failures"] == rollout["first_to_k"]["failed"] + rollout["consecutive"]["failed"]
            assert row["psnr_db"] == report["image_metrics"]["summary"]["psnr_db"]["mean"]
            assert row["ssim"] == report["image_metrics"]["summary"]["ssim"]["mean"]
            assert isinstance(row["psnr_db"], float) and isinstance(row["ssim"], float)  # the demos' frames
        assert (tmp_path / "report" / "dataset.html").is_file()
    finally:
        pool.close()
    print(f"dataset written by {writer}")


def test_demo_camera_frames_give_the_dataset_report_psnr_and_ssim(tmp_path):
    """An Isaac Lab dataset's image term is each episode's sim video: the dataset report has PSNR and
    SSIM for every demo, equal to the demo's own report."""
    writer = write_lab_dataset(tmp_path / "lab.hdf5", demos=3)
    pool = ServerPool(tmp_path / "servers")
    try:
        server = pool.start(worker=TINY)
        out, report_dir = tmp_path / "out", tmp_path / "report"
        done = subprocess.run(
            [sys.executable, "-m", "lingbot_cli", *replay_args(tmp_path / "lab.hdf5", out, server.endpoint, *SMALL,
                                                               "--report", str(report_dir), "--no-progress")],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        pool.close()
    for i in range(3):  # one sim frame per pose (0.77 s at 16 fps)
        folder = out / f"lab-demo_{i}"
        assert len(list((folder / "frames").glob("*.jpg"))) == len(np.load(folder / "poses.npy")) == 13
    dataset = json.loads((report_dir / "dataset.json").read_text())
    assert dataset["totals"]["compared"] == 3
    for row in dataset["episodes"]:
        report = json.loads((report_dir / row["report_json"]).read_text())
        image = report["image_metrics"]["summary"]
        assert isinstance(row["psnr_db"], float) and isinstance(row["ssim"], float), row
        assert row["psnr_db"] == image["psnr_db"]["mean"] and row["ssim"] == image["ssim"]["mean"]
        assert report["compared_frames"] == 5  # the rollout's 5 frames against the first 5 sim frames
    psnr = dataset["totals"]["across_episodes"]["psnr_db"]
    assert psnr["mean"] == pytest.approx(np.mean([r["psnr_db"] for r in dataset["episodes"]]))
    print(f"dataset written by {writer}")


def test_episode_json_paths_pick_episode_folders_and_clashing_names_are_refused(tmp_path, capsys):
    import shutil

    sample = REPO / "data" / "sample_room"
    for folder in ("a/run1/ep", "a/run2/ep2", "b/ep"):
        shutil.copytree(sample, tmp_path / folder)
    sources = sorted(str(p) for p in tmp_path.glob("a/**/episode.json"))  # what the shell makes of a/**/episode.json
    assert len(sources) == 2
    assert cli(["replay", *sources, "--export-only", "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ep", "ep2"]
    capsys.readouterr()
    clash = [str(tmp_path / "a/run1/ep/episode.json"), str(tmp_path / "b/ep/episode.json")]
    assert cli(["replay", *clash, "--export-only", "--out", str(tmp_path / "out2")]) == 2
    assert "would both write" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()
