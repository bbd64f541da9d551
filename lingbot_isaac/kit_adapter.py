"""The one place that knows Isaac Sim / Kit API names (4.x `omni.isaac.*`, 4.5/5.x/6.x `isaacsim.*`).

Every omni/isaacsim/carb import happens inside a function, so importing this module works
anywhere; calling into it needs a running Kit. Each function tries the current API first and
falls back to the older one; `docs/isaac-sim.md` lists what is used and in which versions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np


def _first_module(*names: str):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(f"none of {names} can be imported: is this running inside Isaac Sim?")


def isaac_sim_version() -> str | None:
    """'6.0.0', '5.1.0', '4.5.0', ... or None when unknown."""
    try:
        module = _first_module("isaacsim.core.version", "omni.isaac.version")
        version = module.get_version()
    except (ImportError, AttributeError):
        return None
    # get_version() returns (core, prerelease, major, minor, patch, ..., buildtag); core is "5.1.0".
    if isinstance(version, (tuple, list)) and version:
        return str(version[0])
    return str(version)


def simulation_app_class():
    """SimulationApp: `isaacsim.SimulationApp` (4.0+) or `omni.isaac.kit.SimulationApp` (older)."""
    try:
        from isaacsim import SimulationApp
    except ImportError:
        from omni.isaac.kit import SimulationApp
    return SimulationApp


# -- stage, timeline, selection ----------------------------------------------------------------


def get_stage():
    import omni.usd

    return omni.usd.get_context().get_stage()


def selected_prim_paths() -> list[str]:
    import omni.usd

    return list(omni.usd.get_context().get_selection().get_selected_prim_paths())


def timeline():
    import omni.timeline

    return omni.timeline.get_timeline_interface()


def current_time() -> tuple[float, float]:
    """(sim seconds, USD time code) of the timeline now."""
    line = timeline()
    seconds = float(line.get_current_time())
    return seconds, seconds * float(line.get_time_codes_per_seconds())


# -- step subscriptions (keep the returned handle; drop it to unsubscribe) -----------------------


def subscribe_render_step(callback: Callable[[], None], name: str = "lingbot_isaac"):
    """Call `callback()` once per app update (Kit 106+: carb.eventdispatcher; older: update stream)."""
    import omni.kit.app

    try:
        import carb.eventdispatcher

        return carb.eventdispatcher.get_eventdispatcher().observe_event(
            observer_name=name,
            event_name=omni.kit.app.GLOBAL_EVENT_UPDATE,
            on_event=lambda _event: callback(),
        )
    except (ImportError, AttributeError):
        stream = omni.kit.app.get_app().get_update_event_stream()
        return stream.create_subscription_to_pop(lambda _event: callback(), name=name)


def subscribe_physics_step(callback: Callable[[float], None]):
    """Call `callback(dt)` after every physics step (omni.physx, all versions)."""
    import omni.physx

    return omni.physx.get_physx_interface().subscribe_physics_step_events(callback)


# -- the camera's RGB through a replicator render product --------------------------------------


class RgbCapture:
    """A render product on a camera prim with an `rgb` annotator; `read()` gives uint8 RGBA or None."""

    def __init__(self, camera_path: str, width: int, height: int) -> None:
        import omni.replicator.core as rep

        self._render_product = rep.create.render_product(camera_path, (int(width), int(height)))
        self._annotator = rep.AnnotatorRegistry.get_annotator("rgb")
        self._annotator.attach([self._render_product])

    def read(self) -> np.ndarray | None:
        data = self._annotator.get_data()
        if data is None:
            return None
        array = np.asarray(data)
        return array if array.size else None

    def close(self) -> None:
        try:
            self._annotator.detach()
        finally:
            self._render_product.destroy()


# -- menu -------------------------------------------------------------------------------------


def add_menu(title: str, items: list[tuple[str, Callable[[], None]]], ext_id: str) -> Any:
    """A top-level menu `title` with (label, callback) items; returns a handle for `remove_menu`."""
    from omni.kit.menu.utils import MenuItemDescription, add_menu_items

    try:  # Kit 105+: menu items run registered actions
        import omni.kit.actions.core as actions

        registry = actions.get_action_registry()
        descriptions = []
        for label, callback in items:
            action_id = "lingbot_" + label.lower().replace(" ", "_")
            registry.register_action(ext_id, action_id, lambda cb=callback: cb(), display_name=label)
            descriptions.append(MenuItemDescription(name=label, onclick_action=(ext_id, action_id)))
    except ImportError:
        descriptions = [
            MenuItemDescription(name=label, onclick_fn=lambda cb=callback: cb()) for label, callback in items
        ]
        registry = None
    add_menu_items(descriptions, title)
    return (title, descriptions, registry, ext_id)


def remove_menu(handle: Any) -> None:
    from omni.kit.menu.utils import remove_menu_items

    title, descriptions, registry, ext_id = handle
    remove_menu_items(descriptions, title)
    if registry is not None:
        registry.deregister_all_actions_for_extension(ext_id)


def log_warn(message: str) -> None:
    try:
        import carb

        carb.log_warn(f"[lingbot_isaac] {message}")
    except ImportError:
        print(f"[lingbot_isaac] {message}")
