"""Test stand-in for Kit SDK's omni.usd (not on the package index): a real pxr stage (usd-core).

The calls `lingbot_isaac.kit_adapter` and the window make, as Kit's omni.usd API documents them
(docs.omniverse.nvidia.com/kit/docs/omni.usd): `get_context()`, `UsdContext.get_stage()`,
`UsdContext.get_selection().get_selected_prim_paths()`; and what a user's File > Open does:
`UsdContext.open_stage(url)` (which, as in Kit, sets the timeline's time codes per second and
range from the stage, then dispatches the stage's OPENED event). Isaac Sim 6.2's own
isaacsim.core.deprecation_manager (which isaacsim.core.version needs) observes that event:
`UsdContext.stage_event_name(StageEventType.OPENED)`. Every call is appended to `CALLS`.
"""

from __future__ import annotations

from enum import IntEnum

import carb.eventdispatcher
import omni.timeline
from pxr import Usd

CALLS: list[str] = []


class StageEventType(IntEnum):
    SAVED = 0
    SAVE_FAILED = 1
    OPENING = 2
    OPENED = 3
    OPEN_FAILED = 4
    CLOSING = 5
    CLOSED = 6


class Selection:
    def __init__(self) -> None:
        self._paths: list[str] = []

    def get_selected_prim_paths(self) -> list[str]:
        CALLS.append("omni.usd.Selection.get_selected_prim_paths")
        return list(self._paths)

    def set_selected_prim_paths(self, paths: list[str], expand_in_stage: bool = False) -> None:
        CALLS.append("omni.usd.Selection.set_selected_prim_paths")
        self._paths = list(paths)


class UsdContext:
    def __init__(self) -> None:
        self._stage: Usd.Stage | None = None
        self._selection = Selection()

    def get_stage(self) -> Usd.Stage | None:
        CALLS.append("omni.usd.UsdContext.get_stage")
        return self._stage

    def get_selection(self) -> Selection:
        CALLS.append("omni.usd.UsdContext.get_selection")
        return self._selection

    def open_stage(self, url: str) -> bool:
        CALLS.append("omni.usd.UsdContext.open_stage")
        self._stage = Usd.Stage.Open(url)
        timeline = omni.timeline.get_timeline_interface()
        rate = self._stage.GetTimeCodesPerSecond()
        timeline.set_time_codes_per_second(rate)
        timeline.set_start_time(self._stage.GetStartTimeCode() / rate)
        timeline.set_end_time(self._stage.GetEndTimeCode() / rate)
        timeline.set_current_time(self._stage.GetStartTimeCode() / rate)
        carb.eventdispatcher.get_eventdispatcher().dispatch_event(self.stage_event_name(StageEventType.OPENED))
        return bool(self._stage)

    def stage_event_name(self, event_type: StageEventType) -> str:
        CALLS.append("omni.usd.UsdContext.stage_event_name")
        return f"omni.usd:stage_event:{event_type.name}"


_CONTEXT = UsdContext()


def get_context(name: str = "") -> UsdContext:
    CALLS.append("omni.usd.get_context")
    return _CONTEXT
