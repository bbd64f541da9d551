"""Test stand-in for Kit SDK's omni.timeline (not on the package index).

The calls `lingbot_isaac.kit_adapter` makes, as Kit's timeline API documents them
(docs.omniverse.nvidia.com/kit/docs/omni.timeline): `get_timeline_interface()` and on it `play()`,
`pause()`, `is_playing()`, `get_current_time()` (seconds), `get_time_codes_per_seconds()`; plus what
omni.usd calls when it opens a stage (`set_time_codes_per_second`, `set_start_time`,
`set_end_time`, `set_current_time`). Every call is appended to `CALLS`.

Like the real timeline, it is ticked by Kit's update loop: while playing, each app update's
pre-update event advances the current time by that update's `dt` (the run loop's step: with
omni.kit.loop-isaac in manual mode, a fixed 1/60 s). It does not loop at the end time.
"""

from __future__ import annotations

import carb.eventdispatcher
import omni.ext
import omni.kit.app

CALLS: list[str] = []


class Timeline:
    def __init__(self) -> None:
        self._playing = False
        self._time = 0.0
        self._time_codes_per_second = 60.0
        self._start, self._end = 0.0, 0.0
        self.ticks = 0  # updates that advanced the time

    def _call(self, name: str) -> None:
        CALLS.append(f"omni.timeline.Timeline.{name}")

    def play(self) -> None:
        self._call("play")
        self._playing = True

    def pause(self) -> None:
        self._call("pause")
        self._playing = False

    def stop(self) -> None:
        self._call("stop")
        self._playing, self._time = False, self._start

    def is_playing(self) -> bool:
        self._call("is_playing")
        return self._playing

    def get_current_time(self) -> float:
        self._call("get_current_time")
        return self._time

    def set_current_time(self, time: float) -> None:
        self._call("set_current_time")
        self._time = float(time)

    def get_time_codes_per_seconds(self) -> float:
        self._call("get_time_codes_per_seconds")
        return self._time_codes_per_second

    def set_time_codes_per_second(self, time_codes_per_second: float) -> None:
        self._call("set_time_codes_per_second")
        self._time_codes_per_second = float(time_codes_per_second)

    def set_start_time(self, start_time: float) -> None:
        self._call("set_start_time")
        self._start = float(start_time)

    def set_end_time(self, end_time: float) -> None:
        self._call("set_end_time")
        self._end = float(end_time)

    def _tick(self, event) -> None:
        if self._playing:
            self._time += float(event.payload["dt"])
            self.ticks += 1


_TIMELINE = Timeline()


def get_timeline_interface() -> Timeline:
    CALLS.append("omni.timeline.get_timeline_interface")
    return _TIMELINE


class TimelineExtension(omni.ext.IExt):
    def on_startup(self, ext_id: str) -> None:
        self._tick = carb.eventdispatcher.get_eventdispatcher().observe_event(
            observer_name="omni.timeline stand-in",
            event_name=omni.kit.app.GLOBAL_EVENT_PRE_UPDATE,
            on_event=_TIMELINE._tick,
        )

    def on_shutdown(self) -> None:
        self._tick = None
