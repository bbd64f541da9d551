"""The extension inside a real Omniverse Kit 110 (the `omniverse-kit` wheel, headless, CPU).

`make test-kit` builds the Kit venv (.venv-kit, Python 3.12) and runs these; `make test` runs
them too where Python 3.12 is found, and they are skipped (one line: why) where the venv is not
there. `kit_run.py` runs inside Kit; this side makes the stage, starts the tiny-model server and
checks what came out against USD and the server.

Real here: Kit's kernel and extension manager (manifest, dependency solver, module import,
on_startup / on_shutdown), its event dispatcher and update loop, Isaac Sim 6.2's run loop runner
(omni.kit.loop-isaac), the stage (usd-core), the server and its worker. Stand-ins (tests/kit/
standins, each call recorded): omni.ui, omni.kit.menu.utils, omni.kit.actions.core, omni.usd,
omni.timeline, omni.physx, omni.replicator.core (no renderer: a synthetic image), and
omni.kit.uiapp / omni.kit.pipapi (empty: they only have to resolve).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
KIT_VENV = REPO / ".venv-kit"
KIT_PYTHON = KIT_VENV / "bin" / "python"
ISAACSIM_EXTS = KIT_VENV / "isaacsim" / "isaacsim" / "exts"  # isaacsim-core, installed with --target
STANDINS = Path(__file__).with_name("standins")
KIT_RUN = Path(__file__).with_name("kit_run.py")

pytestmark = pytest.mark.kit
if not (KIT_PYTHON.is_file() and ISAACSIM_EXTS.is_dir()):  # one line in the summary, not one per test
    pytest.skip(
        "no Kit venv (.venv-kit): `make test-kit` builds it where Python 3.12 is found (the Kit wheel is cp312 only)",
        allow_module_level=True,
    )

pxr = pytest.importorskip("pxr", reason="usd-core (pxr) is not installed")
from pxr import Gf, Usd, UsdGeom  # noqa: E402

RATE = 60.0  # time codes per second of the stage; the run loop steps 1/60 s
METERS_PER_UNIT = 0.01  # a centimetre stage: the episode must be in metres
W, H, FOCAL, APERTURE = 832, 480, 24.0, 36.0  # the window's default render size


def animated_camera_stage(path: Path) -> Path:
    """A camera on a rig whose yaw is keyed sparsely (0, 90 degrees over 4 s: USD interpolates the
    angle, so the camera moves on an arc) while the camera itself slides along its local x."""
    stage = Usd.Stage.CreateNew(str(path))
    stage.SetTimeCodesPerSecond(RATE)
    stage.SetStartTimeCode(0)
    stage.SetEndTimeCode(4 * RATE)
    UsdGeom.SetStageMetersPerUnit(stage, METERS_PER_UNIT)
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.y)
    rig = UsdGeom.Xform.Define(stage, "/World/Rig")
    yaw = rig.AddRotateYOp()
    yaw.Set(0.0, 0)
    yaw.Set(90.0, 4 * RATE)
    camera = UsdGeom.Camera.Define(stage, "/World/Rig/Camera")
    move = camera.AddTranslateOp()
    move.Set(Gf.Vec3d(0, 150, 400), 0)
    move.Set(Gf.Vec3d(200, 150, 400), 4 * RATE)
    camera.AddRotateXOp().Set(-10.0)
    camera.GetFocalLengthAttr().Set(FOCAL)
    camera.GetHorizontalApertureAttr().Set(APERTURE)
    camera.GetVerticalApertureAttr().Set(APERTURE * H / W)  # square pixels: no NonSquarePixelWarning
    stage.GetRootLayer().Save()
    return path


def docs_layout(root: Path, extension: Path = REPO) -> Path:
    """docs/isaac-sim.md, "Install": `ln -s /path/to/lingbot-isaac ~/kit-exts/lingbot.isaac`."""
    folder = root / "kit-exts"
    folder.mkdir()
    (folder / "lingbot.isaac").symlink_to(extension, target_is_directory=True)
    return folder


def run_kit(
    tmp_path: Path, ext_folder: Path, *args: str, timeout: float = 600
) -> tuple[subprocess.CompletedProcess, dict]:
    """kit_run.py in the Kit venv, with no PYTHONPATH: only Kit's extension manager finds our code."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    opened = tmp_path / "opened.txt"  # the window opens a finished rollout with webbrowser: recorded here
    env.update(
        OMNI_KIT_ACCEPT_EULA="YES",
        OMNI_KIT_ALLOW_ROOT="1",
        ISAAC_PATH=str(ISAACSIM_EXTS.parent),  # as Isaac Sim's pip package sets it: its VERSION file is there
        BROWSER=f"{KIT_PYTHON} -c \"import sys; open('{opened}', 'a').write(sys.argv[1] + '\\n')\" %s",
    )
    report = tmp_path / "report.json"
    command = [str(KIT_PYTHON), str(KIT_RUN), "--ext-folder", str(ext_folder), "--standins", str(STANDINS)]
    command += ["--isaacsim-exts", str(ISAACSIM_EXTS), "--report", str(report), *args]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    (tmp_path / "kit.log").write_text(done.stdout + done.stderr)  # Kit's whole output, to read on a failure
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith("kit: ")))
    return done, (json.loads(report.read_text()) if report.is_file() else {})


def usd_camera(stage: Usd.Stage, time_code: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """USD's own evaluation of the camera at `time_code`: position (metres), forward and down axes
    (USD cameras look along -Z with +Y up; an episode's OpenCV axes are +Z forward, +Y down)."""
    matrix = UsdGeom.Xformable(stage.GetPrimAtPath("/World/Rig/Camera")).ComputeLocalToWorldTransform(time_code)
    rows = np.array([[matrix[i][j] for j in range(4)] for i in range(4)])  # Gf: row vectors
    x, y, z = (rows[i, :3] / np.linalg.norm(rows[i, :3]) for i in range(3))
    return rows[3, :3] * METERS_PER_UNIT, -z, -y


def check_episode(report: dict, what: str, stage: Usd.Stage, start: float):
    """The episode one Record / Stop wrote, against USD's own evaluation of the camera at the
    episode's times (sim_time_start + k / 16 s), the rule of the headless USD path."""
    from contracts.episode import read_episode

    steps = report[what]
    assert steps["timeline_ticks"] == 80 and steps["recording_line"].startswith("Recording: 70 steps")
    folder = steps["saved_line"].removeprefix("Saved ")
    episode = read_episode(folder)
    extra = episode.meta.extra
    # 80 updates, the first two before the renderer's first image: 78 samples, 2 / 60 s after `start`
    assert extra["sim_steps"] == 78 and extra["sim_time_start"] == pytest.approx(start + 2 / RATE)
    # 77 / 60 s = 1.28 s of samples -> 16 fps, 4n+1 frames: 21 (1.25 s); the job asks for 17
    assert episode.frame_count == 21 and episode.meta.meters_per_unit == METERS_PER_UNIT
    assert episode.meta.camera_prim == "/World/Rig/Camera" and episode.meta.generation == {"frame_num": 17}
    times = extra["sim_time_start"] + np.asarray(episode.meta.sim_times)
    assert np.allclose(np.diff(times), 1 / 16)
    position_error = axis_error = 0.0
    for pose, seconds in zip(episode.poses, times, strict=True):
        position, forward, down = usd_camera(stage, seconds * RATE)
        position_error = max(position_error, np.abs(pose[:3, 3] - position).max())
        axis_error = max(axis_error, np.abs(pose[:3, 2] - forward).max(), np.abs(pose[:3, 1] - down).max())
    print(
        f"checked {what}: {episode.frame_count} frames at 16 fps from {extra['sim_steps']} samples; against USD's "
        f"evaluation of the camera: positions within {position_error:.1e} m, axes within {axis_error:.1e}"
    )
    assert position_error < 1e-4 and axis_error < 1e-4  # metres; sampled every 1/60 s, resampled
    swept = np.degrees(np.arccos(np.clip(episode.poses[0][:3, 2] @ episode.poses[-1][:3, 2], -1, 1)))
    assert 25 < swept < 30  # 1.25 s of a 90-degree-in-4-s yaw (about 28 degrees): the camera really turned
    fx = W * FOCAL / APERTURE
    assert np.allclose(np.load(Path(folder) / "intrinsics.npy"), [fx, fx, W / 2, H / 2], atol=1e-3)
    return episode


@pytest.mark.slow
def test_the_extension_records_and_generates_inside_kit(tmp_path, tiny_server):
    from contracts.episode import ROLLOUT_INFO
    from contracts.video import read_mp4

    stage_path = animated_camera_stage(tmp_path / "room.usda")
    episodes = tmp_path / "episodes"
    done, report = run_kit(
        tmp_path,
        docs_layout(tmp_path),
        *("--stage", str(stage_path), "--episodes", str(episodes), "--server", tiny_server.endpoint),
        *("--frames", "17", "--record-updates", "80"),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    kit_errors = [line for line in (done.stdout + done.stderr).splitlines() if "[Error]" in line]
    assert not kit_errors, kit_errors

    # Kit's extension manager found the manifest through the symlinked folder and imported our module
    assert report["ext_id"] == "lingbot.isaac-0.1.0"
    assert Path(report["module_file"]) == tmp_path / "kit-exts/lingbot.isaac/lingbot_isaac/extension.py"
    assert report["kit_version"].startswith("110.4")
    assert report["menu"] == ["Record", "Stop", "Generate rollout", "Settings"]
    assert report["isaac_sim_version"] == "6.2.0"  # through Isaac Sim 6.2's own isaacsim.core.version
    # the first app update ran the extension's update subscription: the window drew its status line
    assert report["status_after_first_update"] == [
        "Pick a camera, write a prompt, press Record and play the simulation."
    ]
    assert report["camera"] == "/World/Rig/Camera"

    # Record / Stop, on render steps (the default) and on physics steps: the timeline advanced by
    # Kit's update loop, 80 updates of 1/60 s each time; the render product's first image came on
    # the 2nd update after Record (its warm-up), and every update from then on is one sample
    stage = Usd.Stage.Open(str(stage_path))
    render = check_episode(report, "render_steps", stage, start=1 / RATE)
    assert Path(report["episode"]) == episodes / "Camera"
    # the same again on physics steps, from where the timeline was paused (80 updates later)
    check_episode(report, "physics_steps", stage, start=81 / RATE)
    assert Path(report["physics_episode"]) == episodes / "physics" / "Camera"
    image = render.image().astype(float)  # the render product's first frame (synthetic: R along x, G along y)
    assert image.shape == (H, W, 3)
    assert np.abs(image[:, :, 0] - np.linspace(0, 255, W)[None, :]).mean() < 4
    assert np.abs(image[:, :, 1] - np.linspace(0, 255, H)[:, None]).mean() < 4

    # Generate: the job ran on the server, the window followed it and opened the result
    lines = report["job_lines"]
    assert lines[-1] == f"Rollout written: {episodes / 'Camera' / 'rollout.mp4'}", lines
    # the window draws the newest status once a frame, so short phases (queued, text) may not show
    assert lines[0] == f"Connecting to {tiny_server.endpoint} ..." and any(line.startswith("Denoise") for line in lines)
    progress = report["progress"]
    assert progress[-1] == 1.0 and 0 < min(v for v in progress if v > 0) < 1  # steps in between
    frames, _ = read_mp4(episodes / "Camera" / "rollout.mp4")
    assert len(frames) == 17
    record = json.loads((episodes / "Camera" / ROLLOUT_INFO).read_text())
    assert record["job"]["client"] == "extension" and record["settings"]["frame_num"] == 17
    assert (tmp_path / "opened.txt").read_text().splitlines()[0] == (episodes / "Camera" / "rollout.mp4").as_uri()
    print(f"checked the job's result: rollout.mp4 of {len(frames)} frames, rollout.json from the extension, opened")

    # shutdown with a job in flight: bounded, and everything the extension made is gone
    assert report["in_flight_line"].startswith("Denoise"), report["in_flight_line"]
    assert report["on_shutdown_s"] < 1.0
    assert report["after_shutdown"] == {"menu": False, "window_destroyed": True, "enabled": False}
    assert report["status_lines_after_shutdown"] == []  # the update subscription went with it
    assert report["kit_shutdown_rc"] == 0
    # ... and the job it left was cancelled on the server (the session's cancel, from on_shutdown)
    jobs = (tiny_server.workdir / "spool" / "jobs").iterdir()
    assert sorted(json.loads((job / "state.json").read_text())["state"] for job in jobs) == ["cancelled", "done"]
    print(f"checked the shutdown: on_shutdown {report['on_shutdown_s']:.2f} s (< 1 s), the job left cancelled")

    # every stand-in call the extension made is one its docstring lists (Kit's documented API)
    calls = report["calls"]
    assert calls["omni.kit.menu.utils"] == [
        "omni.kit.menu.utils.MenuItemDescription",
        "omni.kit.menu.utils.add_menu_items",
        "omni.kit.menu.utils.remove_menu_items",
    ]
    assert calls["omni.kit.actions.core"] == [
        "omni.kit.actions.core.ActionRegistry.deregister_all_actions_for_extension",
        "omni.kit.actions.core.ActionRegistry.register_action",
        "omni.kit.actions.core.get_action_registry",
    ]
    assert calls["omni.replicator.core"] == [
        "omni.replicator.core.Annotator.attach",
        "omni.replicator.core.Annotator.detach",
        "omni.replicator.core.Annotator.get_data",
        "omni.replicator.core.AnnotatorRegistry.get_annotator",
        "omni.replicator.core.RenderProduct.destroy",
        "omni.replicator.core.create.render_product",
    ]
    timeline_calls = {c.rsplit(".", 1)[-1] for c in calls["omni.timeline"]}
    assert {"get_timeline_interface", "play", "pause", "is_playing", "get_current_time"} <= timeline_calls
    assert "get_time_codes_per_seconds" in timeline_calls
    assert {"omni.usd.get_context", "omni.usd.UsdContext.get_stage"} <= set(calls["omni.usd"])
    for name, used in calls.items():
        doc = (STANDINS / name / Path(*name.split(".")) / "__init__.py").read_text().split('"""')[1]
        for call in used:
            assert call.rsplit(".", 1)[-1] in doc, f"{call} is not in the {name} stand-in's list of calls"


@pytest.mark.parametrize(
    ("break_it", "kit_says"),
    [
        (
            lambda text: text.replace('name = "lingbot_isaac.extension"', 'name = "lingbot_isaac.extensio"'),
            ["[Error] [omni.ext._impl.custom_importer] Failed to import python module lingbot_isaac.extensio."],
        ),
        (
            lambda text: text.replace('"omni.usd" = {}', '"omni.usd" = {}\n"omni.not.an.extension" = {}'),
            [
                "[Error] [omni.ext.plugin] Failed to resolve extension dependencies.",
                "No versions of omni.not.an.extension that satisfies: lingbot.isaac-0.1.0 depends on omni.not.an.extension",
            ],
        ),
    ],
    ids=["wrong-module-name", "missing-dependency"],
)
def test_a_broken_manifest_fails_with_kits_own_message(tmp_path, break_it, kit_says):
    extension = tmp_path / "checkout"  # the repository as Kit sees it, with a broken manifest
    (extension / "config").mkdir(parents=True)
    for name in ("lingbot_isaac", "bridge", "contracts", "README.md"):
        (extension / name).symlink_to(REPO / name)
    manifest = (REPO / "config" / "extension.toml").read_text()
    broken = break_it(manifest)
    assert broken != manifest
    (extension / "config" / "extension.toml").write_text(broken)
    done, report = run_kit(tmp_path, docs_layout(tmp_path, extension), "--startup-only", timeout=120)
    assert done.returncode == 3 and not report, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kit: FAILED: lingbot.isaac did not start" in done.stdout
    output = done.stdout + done.stderr
    for message in kit_says:
        assert message in output, output[-3000:]
    print("Kit said:", *kit_says, sep="\n  ")


def test_the_kit_venv_has_no_torch_and_no_repository_on_its_path():
    code = "import importlib.util, sys; print(importlib.util.find_spec('torch'), importlib.util.find_spec('lingbot_isaac'))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(KIT_PYTHON), "-c", code], cwd="/", env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None"]
