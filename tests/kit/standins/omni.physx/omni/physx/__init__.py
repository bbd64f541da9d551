"""Test stand-in for omni.physx (Isaac Sim 6.2's real one, in isaacsim-extscache-physics, needs
Kit SDK's C++ omni.usd.libs, usdrt and GPU foundation extensions, none of which are on the
package index).

The call `lingbot_isaac.kit_adapter.subscribe_physics_step` makes, as the omni.physx API documents
it (docs.omniverse.nvidia.com/kit/docs/omni_physics): `get_physx_interface()`,
`PhysX.subscribe_physics_step_events(fn(dt))`, returning a subscription that ends when released.
Every call is appended to `CALLS`. While the timeline plays, each app update is one physics step
of the update's `dt`, called after the timeline has advanced (no substeps).
"""

from __future__ import annotations

import weakref

import carb.eventdispatcher
import omni.ext
import omni.kit.app
import omni.timeline

CALLS: list[str] = []


class Subscription:
    def __init__(self, fn) -> None:
        self.fn = fn


class PhysX:
    def __init__(self) -> None:
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self.steps = 0

    def subscribe_physics_step_events(self, fn) -> Subscription:
        CALLS.append("omni.physx.PhysX.subscribe_physics_step_events")
        subscription = Subscription(fn)
        self._subscriptions.add(subscription)  # weak: dropping the handle unsubscribes, as carb's do
        return subscription

    def _step(self, event) -> None:
        if not omni.timeline._TIMELINE._playing:
            return
        self.steps += 1
        for subscription in list(self._subscriptions):
            subscription.fn(float(event.payload["dt"]))


_PHYSX = PhysX()


def get_physx_interface() -> PhysX:
    CALLS.append("omni.physx.get_physx_interface")
    return _PHYSX


class PhysXExtension(omni.ext.IExt):
    def on_startup(self, ext_id: str) -> None:
        self._step = carb.eventdispatcher.get_eventdispatcher().observe_event(
            observer_name="omni.physx stand-in", event_name=omni.kit.app.GLOBAL_EVENT_UPDATE, on_event=_PHYSX._step
        )

    def on_shutdown(self) -> None:
        self._step = None
