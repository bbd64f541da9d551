"""Test stand-in for Kit SDK's omni.kit.actions.core (not on the package index).

The calls `lingbot_isaac.kit_adapter.add_menu` / `remove_menu` make, as Kit's actions API documents
them (docs.omniverse.nvidia.com/kit/docs/omni.kit.actions.core): `get_action_registry()`,
`ActionRegistry.register_action(extension_id, action_id, fn, display_name=...)`,
`ActionRegistry.deregister_all_actions_for_extension(extension_id)`; and what Kit's menu does
when an item with `onclick_action=(extension_id, action_id)` is clicked:
`execute_action(extension_id, action_id)`. Every call is appended to `CALLS`.
"""

from __future__ import annotations

from collections.abc import Callable

CALLS: list[str] = []


class Action:
    def __init__(self, extension_id: str, action_id: str, fn: Callable, display_name: str = "") -> None:
        self.extension_id, self.id, self.display_name, self._fn = extension_id, action_id, display_name, fn

    def execute(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


class ActionRegistry:
    def __init__(self) -> None:
        self.actions: dict[tuple[str, str], Action] = {}

    def register_action(self, extension_id: str, action_id: str, fn: Callable, display_name: str = "", **kwargs):
        CALLS.append("omni.kit.actions.core.ActionRegistry.register_action")
        action = Action(extension_id, action_id, fn, display_name)
        self.actions[(extension_id, action_id)] = action
        return action

    def get_action(self, extension_id: str, action_id: str) -> Action | None:
        return self.actions.get((extension_id, action_id))

    def deregister_all_actions_for_extension(self, extension_id: str) -> None:
        CALLS.append("omni.kit.actions.core.ActionRegistry.deregister_all_actions_for_extension")
        for key in [key for key in self.actions if key[0] == extension_id]:
            del self.actions[key]


_REGISTRY = ActionRegistry()


def get_action_registry() -> ActionRegistry:
    CALLS.append("omni.kit.actions.core.get_action_registry")
    return _REGISTRY


def execute_action(extension_id: str, action_id: str, *args, **kwargs):
    """What a menu click on an `onclick_action` item runs; an unknown action raises, as Kit logs."""
    action = _REGISTRY.get_action(extension_id, action_id)
    if action is None:
        raise KeyError(f"no action {action_id!r} registered by {extension_id!r}")
    return action.execute(*args, **kwargs)
