"""Test stand-in for omni.replicator.core (in Kit's extension registry, not on the package index):
no renderer, a synthetic image.

The calls `lingbot_isaac.kit_adapter.RgbCapture` makes, as Replicator's API documents them
(docs.omniverse.nvidia.com/py/replicator): `create.render_product(camera_path, (w, h))`,
`AnnotatorRegistry.get_annotator("rgb")`, `Annotator.attach([render_product])`,
`Annotator.get_data()`, `Annotator.detach()`, `RenderProduct.destroy()`. Every call is appended
to `CALLS`.

`get_data()` gives an empty array for the first `WARMUP_UPDATES` app updates after `attach`, as
a real render product does before its first frame, then uint8 RGBA [h, w, 4]: red rises along x,
green along y, blue is the app update number x 8 (mod 256), so a test can tell which update's
image was kept. A camera path that is not a prim of the open stage raises, as in Kit.
"""

from __future__ import annotations

import numpy as np
import omni.kit.app
import omni.usd

CALLS: list[str] = []
WARMUP_UPDATES = 2


class RenderProduct:
    def __init__(self, camera: str, resolution: tuple[int, int]) -> None:
        self.camera, self.resolution = camera, (int(resolution[0]), int(resolution[1]))
        self.path = f"/Render/RenderProduct_{camera.strip('/').replace('/', '_')}"
        self.destroyed = False

    def destroy(self) -> None:
        CALLS.append("omni.replicator.core.RenderProduct.destroy")
        self.destroyed = True


class _Create:
    def render_product(self, camera: str, resolution: tuple[int, int], **kwargs) -> RenderProduct:
        CALLS.append("omni.replicator.core.create.render_product")
        stage = omni.usd.get_context().get_stage()
        if stage is None or not stage.GetPrimAtPath(camera):
            raise ValueError(f"render_product: no camera prim at {camera!r}")
        return RenderProduct(camera, resolution)


create = _Create()


def image(width: int, height: int, update: int) -> np.ndarray:
    """The synthetic RGBA frame of app update `update`."""
    rgba = np.empty((height, width, 4), np.uint8)
    rgba[..., 0] = (np.arange(width) * 255 // max(width - 1, 1))[None, :]
    rgba[..., 1] = (np.arange(height) * 255 // max(height - 1, 1))[:, None]
    rgba[..., 2] = (update * 8) % 256
    rgba[..., 3] = 255
    return rgba


class Annotator:
    def __init__(self, name: str) -> None:
        self.name = name
        self._products: list[RenderProduct] = []
        self._attached_at = 0

    def attach(self, render_products: list[RenderProduct]) -> None:
        CALLS.append("omni.replicator.core.Annotator.attach")
        self._products = list(render_products)
        self._attached_at = omni.kit.app.get_app().get_update_number()

    def detach(self) -> None:
        CALLS.append("omni.replicator.core.Annotator.detach")
        self._products = []

    def get_data(self) -> np.ndarray:
        CALLS.append("omni.replicator.core.Annotator.get_data")
        update = omni.kit.app.get_app().get_update_number()
        if not self._products or self._products[0].destroyed or update - self._attached_at < WARMUP_UPDATES:
            return np.empty((0,), np.uint8)
        width, height = self._products[0].resolution
        return image(width, height, update)


class AnnotatorRegistry:
    @staticmethod
    def get_annotator(name: str, **kwargs) -> Annotator:
        CALLS.append("omni.replicator.core.AnnotatorRegistry.get_annotator")
        if name != "rgb":
            raise ValueError(f"this stand-in has only the rgb annotator (asked: {name!r})")
        return Annotator(name)
