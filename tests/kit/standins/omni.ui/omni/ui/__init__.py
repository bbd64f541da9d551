"""Test stand-in for Kit SDK's omni.ui (not on the package index): no drawing, only the widget tree.

The calls `lingbot_isaac.window` makes, as Kit's omni.ui API reference documents them
(docs.omniverse.nvidia.com/kit/docs/omni.ui): `Window(title, width=, height=, visible=)` with
`.frame`, `.visible`, `.destroy()`; containers `VStack(spacing=, height=)`, `HStack(height=)`,
`Frame(height=)` (`.clear()`), `CollapsableFrame(title, collapsed=)`, each a `with` block that
adds the widgets built inside it; `Label(text, width=, height=, word_wrap=)` (`.text`,
`.set_style({...})`), `StringField(model, multiline=, height=)`, `IntField(model, width=)`,
`CheckBox(model)`, `ComboBox(index, *items)` (`.model.get_item_value_model().as_int`,
`.model.add_item_changed_fn(fn(model, item))`), `Button(text, width=, clicked_fn=)`
(`.call_clicked_fn()`), `ProgressBar(model, height=)`, `Spacer(width=)`, `Image(height=,
fill_policy=)` (`.source_url`, `.height`), `Pixel(n)`, `FillPolicy.PRESERVE_ASPECT_FIT`;
models `SimpleStringModel`, `SimpleIntModel`, `SimpleFloatModel`, `SimpleBoolModel` (each
`(value)`, with `as_string` / `as_int` / `as_float` / `as_bool` and `set_value`). Anything else raises AttributeError or TypeError, as a missing API would in Kit.

Every call is appended to `CALLS` (its API name); `WIDGETS` holds every widget in creation order
so the test can type into fields and press buttons as a user would.
"""

from __future__ import annotations

from enum import Enum

CALLS: list[str] = []
WIDGETS: list[Widget] = []
_PARENTS: list[Container] = []


def _called(name: str) -> None:
    CALLS.append(f"omni.ui.{name}")


class FillPolicy(Enum):
    STRETCH = 0
    PRESERVE_ASPECT_FIT = 1
    PRESERVE_ASPECT_CROP = 2


class Length:
    def __init__(self, value: float) -> None:
        self.value = value


def Pixel(value: float) -> Length:  # noqa: N802  (omni.ui's name)
    _called("Pixel")
    return Length(value)


# -- models ---------------------------------------------------------------------------------------


class _SimpleModel:
    _kind = ""

    def __init__(self, value=None) -> None:
        _called(f"Simple{self._kind}Model")
        self._value = self._convert(value if value is not None else "" if self._kind == "String" else 0)
        self._changed: list = []

    def _convert(self, value):
        return {"String": str, "Int": int, "Float": float, "Bool": bool}[self._kind](value)

    def set_value(self, value) -> None:
        _called(f"Simple{self._kind}Model.set_value")
        self._value = self._convert(value)
        for fn in self._changed:
            fn(self)

    def get_value_as_string(self) -> str:
        return str(self._value)

    @property
    def as_string(self) -> str:
        _called(f"Simple{self._kind}Model.as_string")
        return str(self._value)

    @property
    def as_int(self) -> int:
        _called(f"Simple{self._kind}Model.as_int")
        return int(self._value)

    @property
    def as_float(self) -> float:
        _called(f"Simple{self._kind}Model.as_float")
        return float(self._value)

    @property
    def as_bool(self) -> bool:
        _called(f"Simple{self._kind}Model.as_bool")
        return bool(self._value)

    def add_value_changed_fn(self, fn) -> None:
        self._changed.append(fn)


class SimpleStringModel(_SimpleModel):
    _kind = "String"


class SimpleIntModel(_SimpleModel):
    _kind = "Int"


class SimpleFloatModel(_SimpleModel):
    _kind = "Float"


class SimpleBoolModel(_SimpleModel):
    _kind = "Bool"


class _ComboBoxModel:
    """ComboBox's item model: the chosen index is `get_item_value_model().as_int`."""

    def __init__(self, index: int, items: tuple[str, ...]) -> None:
        self.items = items
        self._index = SimpleIntModel(index)
        self._item_changed: list = []

    def get_item_value_model(self, item=None, column_id: int = 0) -> SimpleIntModel:
        _called("ComboBox.model.get_item_value_model")
        return self._index

    def add_item_changed_fn(self, fn) -> None:
        _called("ComboBox.model.add_item_changed_fn")
        self._item_changed.append(fn)

    def _choose(self, index: int) -> None:  # a user picking an entry
        self._index.set_value(index)
        for fn in self._item_changed:
            fn(self, None)


# -- widgets --------------------------------------------------------------------------------------


class Widget:
    def __init__(self, width=None, height=None) -> None:
        self.width, self.height = width, height
        self.parent = _PARENTS[-1] if _PARENTS else None
        if self.parent is not None:
            self.parent.children.append(self)
        WIDGETS.append(self)


class Container(Widget):
    def __init__(self, width=None, height=None) -> None:
        super().__init__(width, height)
        self.children: list[Widget] = []

    def __enter__(self):
        _PARENTS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _PARENTS.pop()

    def clear(self) -> None:
        _called(f"{type(self).__name__}.clear")
        self.children.clear()


class VStack(Container):
    def __init__(self, spacing: float = 0, width=None, height=None) -> None:
        _called("VStack")
        super().__init__(width, height)


class HStack(Container):
    def __init__(self, spacing: float = 0, width=None, height=None) -> None:
        _called("HStack")
        super().__init__(width, height)


class Frame(Container):
    def __init__(self, width=None, height=None) -> None:
        _called("Frame")
        super().__init__(width, height)


class CollapsableFrame(Container):
    def __init__(self, title: str = "", collapsed: bool = False, width=None, height=None) -> None:
        _called("CollapsableFrame")
        super().__init__(width, height)
        self.title, self.collapsed = title, collapsed


class Label(Widget):
    def __init__(self, text: str = "", width=None, height=None, word_wrap: bool = False) -> None:
        _called("Label")
        super().__init__(width, height)
        self.text, self.word_wrap, self.style = text, word_wrap, {}
        self.texts = [text]  # every text it has shown, for the test

    def __setattr__(self, name, value) -> None:
        if name == "text" and "texts" in self.__dict__:
            _called("Label.text")
            self.texts.append(value)
        super().__setattr__(name, value)

    def set_style(self, style: dict) -> None:
        _called("Label.set_style")
        self.style = dict(style)


class StringField(Widget):
    def __init__(self, model: SimpleStringModel | None = None, multiline: bool = False, width=None, height=None):
        _called("StringField")
        super().__init__(width, height)
        self.model, self.multiline = model or SimpleStringModel(""), multiline


class IntField(Widget):
    def __init__(self, model: SimpleIntModel | None = None, width=None, height=None) -> None:
        _called("IntField")
        super().__init__(width, height)
        self.model = model or SimpleIntModel(0)


class CheckBox(Widget):
    def __init__(self, model: SimpleBoolModel | None = None, width=None, height=None) -> None:
        _called("CheckBox")
        super().__init__(width, height)
        self.model = model or SimpleBoolModel(False)


class ComboBox(Widget):
    def __init__(self, index: int = 0, *items: str, width=None, height=None) -> None:
        _called("ComboBox")
        super().__init__(width, height)
        self.model = _ComboBoxModel(index, items)


class Button(Widget):
    def __init__(self, text: str = "", width=None, height=None, clicked_fn=None) -> None:
        _called("Button")
        super().__init__(width, height)
        self.text, self._clicked_fn = text, clicked_fn

    def call_clicked_fn(self) -> None:
        _called("Button.call_clicked_fn")
        if self._clicked_fn is not None:
            self._clicked_fn()


class ProgressBar(Widget):
    def __init__(self, model: SimpleFloatModel | None = None, width=None, height=None) -> None:
        _called("ProgressBar")
        super().__init__(width, height)
        self.model = model or SimpleFloatModel(0.0)


class Spacer(Widget):
    def __init__(self, width=None, height=None) -> None:
        _called("Spacer")
        super().__init__(width, height)


class Image(Widget):
    def __init__(self, source_url: str = "", width=None, height=None, fill_policy=FillPolicy.STRETCH) -> None:
        _called("Image")
        super().__init__(width, height)
        self.source_url, self.fill_policy = source_url, fill_policy


class Window:
    def __init__(self, title: str, width: float = 400, height: float = 600, visible: bool = True) -> None:
        _called("Window")
        self.title, self.width, self.height, self.visible = title, width, height, visible
        _PARENTS.clear()
        self.frame = Frame()
        self.destroyed = False
        WINDOWS.append(self)

    def destroy(self) -> None:
        _called("Window.destroy")
        self.destroyed = True


WINDOWS: list[Window] = []
