"""The "LingBot World" omni.ui window: widgets only; every decision is in `session.Session`.

Imported by `extension.py` inside Kit only (it imports omni.ui at the top).
"""

from __future__ import annotations

import webbrowser
from pathlib import Path

import omni.ui as ui

from contracts.settings import FIELD_BY_NAME
from lingbot_isaac import kit_adapter
from lingbot_isaac.session import ChunkPreview, Session, gpu_choices, model_choices, safe_name

TITLE = "LingBot World"
FAILED_COLOR = 0xFF5050FF  # omni.ui colours are 0xAABBGGRR: a light red for failures and refusals


class LingBotWindow:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._cameras: list[str] = []
        self._last_serial = -1
        self._opened: Path | None = None
        # Fast jobs: the session hands each finished chunk over on its worker thread; the window
        # keeps the newest and draws it on the UI thread (update), never from that thread.
        self._chunk: ChunkPreview | None = None
        self._shown_chunk: ChunkPreview | None = None
        session.on_chunk = self._keep_chunk
        self._models = model_choices()  # (label, value): the server's choice, then contracts' models
        self._gpus = gpu_choices()  # (label, value): the server's choice, 1, 2 (contracts' `gpus` range)
        settings = session.settings
        self.camera = ui.SimpleStringModel("")
        self.prompt = ui.SimpleStringModel("")
        self.frames = ui.SimpleIntModel(settings.frame_num or FIELD_BY_NAME["frame_num"].default)
        self.server = ui.SimpleStringModel(settings.server)
        self.output = ui.SimpleStringModel(str(settings.output_dir))
        self.width = ui.SimpleIntModel(settings.width)
        self.height = ui.SimpleIntModel(settings.height)
        self.physics = ui.SimpleBoolModel(settings.sample_on == "physics")
        self.keep_frames = ui.SimpleBoolModel(settings.keep_sim_frames)
        self.first_frame = ui.SimpleStringModel(str(settings.first_frame or ""))
        self.photo_intrinsics = ui.SimpleStringModel(settings.photo_intrinsics or "")
        self.progress = ui.SimpleFloatModel(0.0)
        self.model_index = next((i for i, (_, value) in enumerate(self._models) if value == settings.model), 0)
        self.gpus_index = next((i for i, (_, value) in enumerate(self._gpus) if value == settings.gpus), 0)
        self.window = ui.Window(TITLE, width=460, height=720, visible=False)
        self._build()

    # -- layout -------------------------------------------------------------------------------

    def _build(self) -> None:
        with self.window.frame, ui.VStack(spacing=6, height=0):
            with ui.HStack(height=22):
                ui.Label("Camera prim", width=100)
                ui.StringField(self.camera)
                ui.Button("Selected", width=70, clicked_fn=self._use_selection)
            with ui.HStack(height=22):
                ui.Spacer(width=100)
                self._combo_frame = ui.Frame(height=22)
                ui.Button("Find", width=70, clicked_fn=self.refresh_cameras)
            ui.Label("Prompt (the scene and how the camera moves)", height=18)
            ui.StringField(self.prompt, multiline=True, height=70)
            with ui.HStack(height=22):
                ui.Label("Frames (4n+1)", width=100)
                ui.IntField(self.frames, width=80)
                ui.Spacer(width=20)
                ui.Label("Model", width=50)  # base | fast per job; the server's choice sends nothing
                self.model_combo = ui.ComboBox(self.model_index, *(label for label, _ in self._models))
                self.model_combo.model.add_item_changed_fn(lambda model, _item: self._pick_model(model))
            with ui.HStack(height=22):
                ui.Label("GPUs", width=100)  # 2: guidance's two passes on two of the server's GPUs (base)
                self.gpus_combo = ui.ComboBox(self.gpus_index, *(label for label, _ in self._gpus))
                self.gpus_combo.model.add_item_changed_fn(lambda model, _item: self._pick_gpus(model))
            with ui.HStack(height=22):
                ui.Label("First frame photo", width=100)  # optional: the real camera at the start pose
                ui.StringField(self.first_frame)
            with ui.HStack(height=22):
                ui.Label("Photo fx,fy,cx,cy", width=100)  # optional: in the photo's pixels
                ui.StringField(self.photo_intrinsics)
            with ui.HStack(height=26):
                ui.Button("Record", clicked_fn=self.record)
                ui.Button("Live", width=50, clicked_fn=self.live)  # model fast: chunks while the sim plays
                ui.Button("Stop", clicked_fn=self.stop)
                ui.Button("Generate rollout", clicked_fn=self.generate)
                ui.Button("Cancel", width=60, clicked_fn=self.session.cancel)
            # height 0: as tall as its wrapped text, so a server's refusal is shown whole
            self.status_label = ui.Label("", word_wrap=True, height=0)
            ui.ProgressBar(self.progress, height=16)
            # Fast jobs: the newest finished chunk (its last frame) while the next is made
            self.chunk_label = ui.Label("", height=18)
            self.chunk_image = ui.Image(height=0, fill_policy=ui.FillPolicy.PRESERVE_ASPECT_FIT)
            with ui.HStack(height=22):
                ui.Label("Result", width=60)
                self.result_label = ui.Label("", word_wrap=True)
                ui.Button("Open", width=60, clicked_fn=self._open_result)
            self.settings_frame = ui.CollapsableFrame("Settings", collapsed=True)
            with self.settings_frame, ui.VStack(spacing=4, height=0):
                self._row("Server", lambda: ui.StringField(self.server))
                self._row("Episodes folder", lambda: ui.StringField(self.output))
                self._row("Render size W, H", self._size_fields)
                self._row("Sample on physics steps", lambda: ui.CheckBox(self.physics))
                self._row("Keep every sim frame", lambda: ui.CheckBox(self.keep_frames))
        self.refresh_cameras()

    @staticmethod
    def _row(label: str, build) -> None:
        with ui.HStack(height=22):
            ui.Label(label, width=160)
            build()

    def _size_fields(self) -> None:
        ui.IntField(self.width, width=70)
        ui.IntField(self.height, width=70)

    # -- actions ------------------------------------------------------------------------------

    def show(self, settings: bool = False) -> None:
        self.window.visible = True
        if settings:
            self.settings_frame.collapsed = False

    def refresh_cameras(self) -> None:
        from lingbot_isaac.camera import find_cameras

        stage = kit_adapter.get_stage()
        self._cameras = [c for c in find_cameras(stage) if not c.startswith("/OmniverseKit_")] if stage else []
        self._combo_frame.clear()
        with self._combo_frame:
            combo = ui.ComboBox(0, *(self._cameras or ["(no cameras on the stage)"]))
            combo.model.add_item_changed_fn(lambda model, _item: self._pick_camera(model))
        if self._cameras and not self.camera.as_string:
            self.camera.set_value(self._cameras[0])

    def _pick_camera(self, model) -> None:
        index = model.get_item_value_model().as_int
        if 0 <= index < len(self._cameras):
            self.camera.set_value(self._cameras[index])

    def _pick_model(self, model) -> None:
        self.model_index = model.get_item_value_model().as_int

    def _pick_gpus(self, model) -> None:
        self.gpus_index = model.get_item_value_model().as_int

    def _keep_chunk(self, preview: ChunkPreview) -> None:
        """The session's on_chunk (its worker thread): keep it; update() draws it."""
        self._chunk = preview

    def _use_selection(self) -> None:
        selected = kit_adapter.selected_prim_paths()
        if selected:
            self.camera.set_value(selected[0])

    def _apply_settings(self) -> None:
        settings = self.session.settings
        settings.server = self.server.as_string.strip()
        settings.output_dir = Path(self.output.as_string.strip()).expanduser()
        settings.width, settings.height = self.width.as_int, self.height.as_int
        settings.sample_on = "physics" if self.physics.as_bool else "render"
        settings.keep_sim_frames = self.keep_frames.as_bool
        settings.frame_num = self.frames.as_int or None
        settings.model = self._models[self.model_index][1] if 0 <= self.model_index < len(self._models) else None
        settings.gpus = self._gpus[self.gpus_index][1] if 0 <= self.gpus_index < len(self._gpus) else None
        photo = self.first_frame.as_string.strip()
        settings.first_frame = Path(photo).expanduser() if photo else None
        settings.photo_intrinsics = self.photo_intrinsics.as_string.strip() or None

    def record(self) -> None:
        self._apply_settings()
        self._guard(lambda: self.on_record(self.camera.as_string.strip()))

    def live(self) -> None:
        self._apply_settings()
        self._chunk = None
        self._show_chunk(None)
        self._guard(lambda: self.on_live(self.camera.as_string.strip(), self.prompt.as_string))

    def stop(self) -> None:
        name = safe_name(self.camera.as_string.rsplit("/", 1)[-1])
        self._guard(lambda: self.on_stop(self.prompt.as_string, name))

    def generate(self) -> None:
        self._apply_settings()
        self._chunk = None  # the previews of an earlier job go
        self._show_chunk(None)
        self._guard(self.session.generate)

    # set by the extension: the Kit glue (subscriptions, capture) lives there
    on_record = staticmethod(lambda camera: None)
    on_stop = staticmethod(lambda prompt, name: None)
    on_live = staticmethod(lambda camera, prompt: None)

    def _guard(self, action) -> None:
        try:
            action()
        except Exception as exc:  # show it in the window; the log has the rest
            self._show_status(f"{type(exc).__name__}: {exc}", failed=True)
            kit_adapter.log_warn(str(exc))

    def _open_result(self) -> None:
        status = self.session.status()
        target = status.report or status.result
        if target is not None:
            webbrowser.open(Path(target).resolve().as_uri())

    # -- per frame ----------------------------------------------------------------------------

    def update(self) -> None:
        """Called every app update: redraw the status when it changed; open results once."""
        chunk = self._chunk
        if chunk is not self._shown_chunk:
            self._show_chunk(chunk)
        status = self.session.status()
        if status.serial == self._last_serial:
            return
        self._last_serial = status.serial
        self._show_status(status.message, failed=status.state == "failed")
        self.progress.set_value(status.progress)
        shown = status.report or status.result or status.episode
        self.result_label.text = str(shown) if shown else ""
        if status.state == "done" and status.result is not None and self._opened != status.result:
            self._opened = status.result
            self._open_result()

    def _show_status(self, message: str, failed: bool) -> None:
        """The status line; failures (a refused setting names the setting and why) in red."""
        self.status_label.text = message
        self.status_label.set_style({"color": FAILED_COLOR} if failed else {})

    def _show_chunk(self, chunk: ChunkPreview | None) -> None:
        self._shown_chunk = chunk
        self.chunk_label.text = f"{chunk.label} ({chunk.video.name})" if chunk else ""
        if chunk is not None and chunk.image is not None:
            self.chunk_image.source_url = str(chunk.image)  # a new file per chunk: never a cached one
            self.chunk_image.height = ui.Pixel(180)
        else:
            self.chunk_image.height = ui.Pixel(0)

    def destroy(self) -> None:
        self.session.on_chunk = None
        self.window.destroy()
