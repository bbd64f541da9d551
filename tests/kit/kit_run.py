"""Runs inside a real Omniverse Kit (the `omniverse-kit` wheel, Python 3.12, headless): loads the
extension `lingbot.isaac` as docs/isaac-sim.md tells users, then uses it as a user would.

Started by tests/kit/test_kit.py with the Kit venv's Python and no PYTHONPATH: everything of this
repository that runs here was found and imported by Kit's extension manager through the
`--ext-folder` / `--enable` pair. Kit's update loop is Isaac Sim's own run loop runner
(omni.kit.loop-isaac, from the isaacsim-core wheel) in manual mode: each `app.update()` is one
frame of a fixed 1/60 s. What happens is printed one line a step and written to `--report` (JSON).

Steps (`--startup-only` stops after 1): 1. start Kit with the extension enabled; 2. one update
(the extension's update subscription draws the window); 3. open the stage, press *Find*, fill
the window's fields; 4. menu *Record*, `--record-updates` updates, menu *Stop*; 5. menu
*Generate rollout*, updates until the window shows the result; 6. *Settings > Sample on physics
steps*, *Record* / *Stop* again; 7. *Generate rollout* again, and while that job runs, disable
the extension (its on_shutdown), timed; 8. Kit's own shutdown.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EXTENSION = "lingbot.isaac"
MENU = "LingBot World"


def say(line: str) -> None:
    print(f"kit: {line}", flush=True)


def start_kit(args: argparse.Namespace):
    os.environ.setdefault("OMNI_KIT_ACCEPT_EULA", "YES")
    import omni.kit_app

    app = omni.kit_app.KitApp()
    kit_args = [
        "--no-window",
        # The extension, exactly as docs/isaac-sim.md says: a folder that holds `lingbot.isaac`.
        *("--ext-folder", str(args.ext_folder), "--enable", EXTENSION),
        # Kit SDK stand-ins (tests/kit/standins) and Isaac Sim 6.2's own extensions (isaacsim-core).
        *("--ext-folder", str(args.standins), "--ext-folder", str(args.isaacsim_exts)),
        # Isaac Sim's run loop runner: app.update() steps one frame of a fixed dt (manual mode).
        *("--enable", "omni.kit.loop-isaac", "--/app/runLoops/main/manualModeEnabled=true"),
        # Isaac Sim's version query (reads $ISAAC_PATH/VERSION, as Isaac Sim's pip package sets it)
        *("--enable", "isaacsim.core.version"),
        "--/app/runLoops/main/rateLimitEnabled=false",
        "--/app/fastShutdown=false",  # run every extension's on_shutdown, then return
        "--/app/extensions/registryEnabled=false",  # no extension registry: only the folders above
    ]
    started = time.monotonic()
    app.startup(kit_args)
    return app, time.monotonic() - started


def widgets(kind: str) -> list:
    import omni.ui as ui

    return [w for w in ui.WIDGETS if type(w).__name__ == kind]


def after_label(text: str, kind: str):
    """The first `kind` widget after the label `text`: the field a user types into."""
    import omni.ui as ui

    start = next(i for i, w in enumerate(ui.WIDGETS) if type(w).__name__ == "Label" and w.text == text)
    return next(w for w in ui.WIDGETS[start + 1 :] if type(w).__name__ == kind)


def button(text: str):
    return next(w for w in reversed(widgets("Button")) if w.text == text)


def calls() -> dict[str, list[str]]:
    names = [
        "omni.ui",
        "omni.kit.menu.utils",
        "omni.kit.actions.core",
        "omni.usd",
        "omni.timeline",
        "omni.physx",
        "omni.replicator.core",
    ]
    return {name: sorted(set(sys.modules[name].CALLS)) for name in names if name in sys.modules}


def run(args: argparse.Namespace) -> dict:
    report: dict = {}
    app, startup_s = start_kit(args)
    manager = app.extension_manager
    ext_id = manager.get_enabled_extension_id(EXTENSION)
    module = sys.modules.get("lingbot_isaac.extension")
    menu_utils = sys.modules.get("omni.kit.menu.utils")  # a stand-in: there once Kit enabled it
    if not ext_id or module is None or menu_utils is None or MENU not in menu_utils.MENUS:
        say(f"FAILED: {EXTENSION} did not start (enabled id {ext_id!r}); Kit's log above says why")
        app.shutdown()
        sys.exit(3)
    report.update(
        ext_id=ext_id,
        module_file=module.__file__,
        startup_s=startup_s,
        kit_version=app._app.get_kit_version(),
        menu=[item.name for item in menu_utils.MENUS[MENU]],
        isaac_sim_version=sys.modules["lingbot_isaac.kit_adapter"].isaac_sim_version(),
    )
    say(f"Kit {report['kit_version']} started in {startup_s:.2f} s; {ext_id} on_startup ran ({module.__file__})")
    say(f"menu {MENU!r}: {report['menu']}; kit_adapter.isaac_sim_version(): {report['isaac_sim_version']!r}")
    if not args.startup_only:
        try:
            use_the_extension(app, args, report)
        except BaseException:
            report["calls"] = calls()
            app.shutdown()  # Kit's own teardown, then the traceback
            raise
    report["calls"] = calls()
    started = time.monotonic()
    report["kit_shutdown_rc"] = app.shutdown()
    say(f"Kit shut down (rc {report['kit_shutdown_rc']}) in {time.monotonic() - started:.2f} s")
    return report


def use_the_extension(app, args: argparse.Namespace, report: dict) -> None:
    """Steps 2 to 7 (module docstring), as a user would do them."""
    import omni.kit.menu.utils as menu_utils
    import omni.timeline
    import omni.ui as ui
    import omni.usd

    status = next(w for w in widgets("Label") if w.word_wrap and w.height == 0)  # the window's status line
    before = len(status.texts)
    app.update()
    report["status_after_first_update"] = status.texts[before:]
    say(f"one update: the extension's update subscription drew the status line {status.texts[-1]!r}")

    # -- a user opens the stage and fills in the window ----------------------------------------------
    assert omni.usd.get_context().open_stage(str(args.stage))
    button("Find").call_clicked_fn()
    camera = after_label("Camera prim", "StringField").model.as_string
    after_label("Prompt (the scene and how the camera moves)", "StringField").model.set_value(args.prompt)
    after_label("Frames (4n+1)", "IntField").model.set_value(args.frames)
    after_label("Server", "StringField").model.set_value(args.server or "tcp://127.0.0.1:9")
    after_label("Episodes folder", "StringField").model.set_value(str(args.episodes))
    report["camera"] = camera
    say(f"stage {args.stage.name} opened; Find picked the camera {camera}")

    # -- Record / Stop through the menu -------------------------------------------------------------
    timeline = omni.timeline.get_timeline_interface()

    def record(what: str) -> str | None:
        ticks = timeline.ticks
        menu_utils.click(MENU, "Record")
        for _ in range(args.record_updates):
            app.update()
        recording_line = status.texts[-1]
        menu_utils.click(MENU, "Stop")
        app.update()  # the window draws the session's new status on the next update
        report[what] = {"timeline_ticks": timeline.ticks - ticks, "recording_line": recording_line}
        report[what]["saved_line"] = status.texts[-1]
        say(f"menu Record, {args.record_updates} updates ({recording_line!r}), menu Stop: {status.texts[-1]!r}")
        return status.texts[-1].removeprefix("Saved ") if status.texts[-1].startswith("Saved ") else None

    report["episode"] = record("render_steps")
    if report["episode"] is None or not args.server:
        return

    # -- Generate through the menu; the window follows the job ----------------------------------------
    progress = next(w for w in widgets("ProgressBar"))
    values: list[float] = []
    progress.model.add_value_changed_fn(lambda model: values.append(model.as_float))
    mark = len(status.texts)
    menu_utils.click(MENU, "Generate rollout")
    deadline = time.monotonic() + args.job_timeout
    while time.monotonic() < deadline and not status.texts[-1].startswith(("Rollout written", "Generation failed")):
        app.update()
        time.sleep(0.01)
    report.update(job_lines=status.texts[mark:], progress=list(values))
    say(
        f"menu Generate rollout: the window showed {len(status.texts) - mark} status lines, ending {status.texts[-1]!r}"
    )
    say(f"progress bar: {[round(v, 2) for v in values]}")

    # -- Settings > Sample on physics steps: the recorder follows omni.physx's step events -----------
    after_label("Sample on physics steps", "CheckBox").model.set_value(True)
    after_label("Episodes folder", "StringField").model.set_value(str(args.episodes / "physics"))
    report["physics_episode"] = record("physics_steps")

    # -- a job in flight when the extension shuts down ------------------------------------------------
    mark = len(status.texts)
    menu_utils.click(MENU, "Generate rollout")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not status.texts[-1].startswith("Denoise"):  # the job is running
        app.update()
        time.sleep(0.01)
    in_flight = status.texts[-1]
    extension_class = sys.modules["lingbot_isaac.extension"].LingBotWorldExtension
    on_shutdown, timed = extension_class.on_shutdown, {}

    def timed_on_shutdown(self) -> None:  # times the extension's own on_shutdown inside Kit's disable
        started = time.monotonic()
        on_shutdown(self)
        timed["s"] = time.monotonic() - started

    extension_class.on_shutdown = timed_on_shutdown
    started = time.monotonic()
    app.extension_manager.set_extension_enabled_immediate(EXTENSION, False)
    disable_s = time.monotonic() - started
    report.update(in_flight_line=in_flight, on_shutdown_s=timed["s"], disable_s=disable_s)
    report["after_shutdown"] = {
        "menu": MENU in menu_utils.MENUS,
        "window_destroyed": all(w.destroyed for w in ui.WINDOWS),
        "enabled": app.extension_manager.is_extension_enabled(EXTENSION),
    }
    updates_before = len(status.texts)
    for _ in range(5):  # the update subscription is gone with the extension
        app.update()
    report["status_lines_after_shutdown"] = status.texts[updates_before:]
    say(
        f"extension disabled while the window showed {in_flight!r}: its on_shutdown took "
        f"{timed['s'] * 1000:.0f} ms, Kit's whole disable {disable_s * 1000:.0f} ms"
    )
    for name, used in calls().items():
        say(f"{name} stand-in calls: {', '.join(used)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ext-folder", type=Path, required=True, help="the folder holding lingbot.isaac")
    parser.add_argument("--standins", type=Path, required=True)
    parser.add_argument("--isaacsim-exts", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--startup-only", action="store_true")
    parser.add_argument("--stage", type=Path)
    parser.add_argument("--episodes", type=Path)
    parser.add_argument("--server")
    parser.add_argument("--prompt", default="A camera circles a small room.")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--record-updates", type=int, default=80)
    parser.add_argument("--job-timeout", type=float, default=300.0)
    args = parser.parse_args()
    report = run(args)
    args.report.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
