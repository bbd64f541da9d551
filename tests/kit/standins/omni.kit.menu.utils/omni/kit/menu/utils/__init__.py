"""Test stand-in for Kit SDK's omni.kit.menu.utils (not on the package index).

The calls `lingbot_isaac.kit_adapter` makes, as Kit's menu API documents them
(docs.omniverse.nvidia.com/kit/docs/omni.kit.menu.utils): `MenuItemDescription(name=,
onclick_action=(extension_id, action_id))` or `MenuItemDescription(name=, onclick_fn=)`,
`add_menu_items(items, menu_name)`, `remove_menu_items(items, menu_name)`. Every call is appended
to `CALLS`; `MENUS` is the menu bar. `click(menu_name, item_name)` is what a user's click does:
the item's action through omni.kit.actions.core, or its `onclick_fn`.
"""

from __future__ import annotations

from collections.abc import Callable

CALLS: list[str] = []
MENUS: dict[str, list[MenuItemDescription]] = {}


class MenuItemDescription:
    def __init__(
        self,
        name: str = "",
        onclick_action: tuple[str, str] | None = None,
        onclick_fn: Callable[[], None] | None = None,
        **kwargs,
    ) -> None:
        CALLS.append("omni.kit.menu.utils.MenuItemDescription")
        self.name, self.onclick_action, self.onclick_fn = name, onclick_action, onclick_fn


def add_menu_items(menu_list: list[MenuItemDescription], name: str, menu_index: int = 0, **kwargs) -> None:
    CALLS.append("omni.kit.menu.utils.add_menu_items")
    MENUS.setdefault(name, []).extend(menu_list)


def remove_menu_items(menu_list: list[MenuItemDescription], name: str, **kwargs) -> None:
    CALLS.append("omni.kit.menu.utils.remove_menu_items")
    items = MENUS.get(name, [])
    for item in menu_list:
        items.remove(item)  # ValueError if it was never added, as a wrong handle would be
    if not items:
        MENUS.pop(name, None)


def click(menu_name: str, item_name: str) -> None:
    """A user's click on a menu item (not an omni.kit.menu.utils call: what the menu bar does)."""
    item = next(item for item in MENUS[menu_name] if item.name == item_name)
    if item.onclick_action is not None:
        from omni.kit.actions.core import execute_action

        execute_action(*item.onclick_action)
    else:
        item.onclick_fn()
