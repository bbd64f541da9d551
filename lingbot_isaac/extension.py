"""Kit extension entry point: the "LingBot World" menu and window.

Thin on purpose (Isaac Sim extension-template style): lifecycle, menu and the step subscriptions
that feed `session.Session`; the widgets are in `window.py`, the logic in `session.py`,
`recorder.py` and the bridge client; every Kit API name is in `kit_adapter.py`. Importing this
module outside Kit works (the omni import is guarded) so tests can check it.
"""

from __future__ import annotations

from lingbot_isaac import kit_adapter
from lingbot_isaac.session import Session


def _extension_base() -> type:
    """omni.ext.IExt inside Kit; outside Kit the class still imports, it just is not an IExt. Not a
    module-level name: Kit starts every IExt subclass it finds in the module, IExt itself included,
    and then fails to shut that one down (and ours with it; seen in Kit 110.4 by tests/kit)."""
    try:
        import omni.ext
    except ImportError:
        return object
    return omni.ext.IExt


MENU_TITLE = "LingBot World"


class LingBotWorldExtension(_extension_base()):
    """Menu: Record, Stop, Generate rollout, Settings. Window: see `window.LingBotWindow`."""

    def on_startup(self, ext_id: str) -> None:
        from lingbot_isaac.window import LingBotWindow

        self._ext_id = ext_id
        self._session = Session()
        self._capture: kit_adapter.RgbCapture | None = None
        self._step_subscription = None
        self._window = LingBotWindow(self._session)
        self._window.on_record = self._record
        self._window.on_stop = self._stop
        self._window.on_live = self._live
        self._menu = kit_adapter.add_menu(
            MENU_TITLE,
            [
                ("Record", self._window.record),
                ("Stop", self._window.stop),
                ("Generate rollout", self._window.generate),
                ("Settings", lambda: self._window.show(settings=True)),
            ],
            ext_id,
        )
        self._window.show()
        self._ui_subscription = kit_adapter.subscribe_render_step(self._on_update, name="lingbot_isaac.ui")

    def on_shutdown(self) -> None:
        self._release_recording()
        self._ui_subscription = None
        kit_adapter.remove_menu(self._menu)
        self._window.destroy()
        self._window = None
        self._session.shutdown(timeout=1.0)  # bounded: Kit's shutdown never waits on the server

    # -- recording glue -----------------------------------------------------------------------

    def _record(self, camera_path: str) -> None:
        settings = self._session.settings
        self._capture = kit_adapter.RgbCapture(camera_path, settings.width, settings.height)
        try:
            self._session.start_recording(kit_adapter.get_stage(), camera_path, capture=self._capture.read)
        except Exception:
            self._release_recording()
            raise
        if settings.sample_on == "physics":
            self._step_subscription = kit_adapter.subscribe_physics_step(lambda _dt: self._sample())
        # render sampling happens in _on_update
        kit_adapter.timeline().play()

    def _live(self, camera_path: str, prompt: str) -> None:
        """Live: as Record, but the poses stream to a live job while the timeline plays (session.start_live)."""
        settings = self._session.settings
        self._capture = kit_adapter.RgbCapture(camera_path, settings.width, settings.height)
        try:
            self._session.start_live(kit_adapter.get_stage(), camera_path, prompt, capture=self._capture.read)
        except Exception:
            self._release_recording()
            raise
        if settings.sample_on == "physics":
            self._step_subscription = kit_adapter.subscribe_physics_step(lambda _dt: self._sample())
        kit_adapter.timeline().play()

    def _stop(self, prompt: str, name: str) -> None:
        kit_adapter.timeline().pause()
        try:
            if self._session.live:
                self._session.stop_live(name=name)
                return
            self._session.stop_recording(prompt, name=name)
        finally:
            self._release_recording()

    def _release_recording(self) -> None:
        self._step_subscription = None
        if self._capture is not None:
            self._capture.close()
            self._capture = None

    def _sample(self) -> None:
        if kit_adapter.timeline().is_playing():
            self._session.on_step(*kit_adapter.current_time())

    def _on_update(self) -> None:
        if self._capture is not None and self._session.settings.sample_on == "render":
            self._sample()
        if self._window is not None:
            self._window.update()
