"""Generation settings: one dataclass shared by the Isaac side, the bridge and the engine.

Defaults live in `config/generation.toml`; this module holds the same values so the package works
without the config folder (an installed wheel, a worker on another machine).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"


class SettingsError(ValueError):
    """A generation setting has a value the engine cannot use."""


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How one rollout is generated. Field names match the `generate` CLI flags."""

    size: str = "480*832"  # "H*W": the max area; the real H, W follow the image aspect
    frame_num: int = 81  # 4n+1; limited by the number of poses
    steps: int = 70  # LingBot-World's i2v-A14B default ([fast40] in generation.toml: 40 / 5)
    shift: float = 10.0
    guide_scale: tuple[float, float] = (5.0, 5.0)  # (low-noise expert, high-noise expert)
    boundary: float = 0.947  # t >= boundary*1000 -> high-noise expert
    seed: int = 42
    negative_prompt: str | None = None  # None: the i2v-A14B default
    fps: int = 16

    def __post_init__(self) -> None:
        self.height_width  # noqa: B018  (parses and validates size)
        if self.frame_num < 1:
            raise SettingsError(f"frame_num must be >= 1 (got {self.frame_num})")
        if self.steps < 1:
            raise SettingsError(f"steps must be >= 1 (got {self.steps})")
        if self.shift <= 0:
            raise SettingsError(f"shift must be > 0 (got {self.shift})")
        if len(self.guide_scale) != 2:
            raise SettingsError(f"guide_scale must be (low, high) (got {self.guide_scale!r})")
        if not 0.0 < self.boundary < 1.0:
            raise SettingsError(f"boundary must be in (0, 1) (got {self.boundary})")
        if self.fps < 1:
            raise SettingsError(f"fps must be >= 1 (got {self.fps})")

    @property
    def height_width(self) -> tuple[int, int]:
        try:
            h, w = (int(v) for v in self.size.replace("x", "*").split("*"))
        except ValueError:
            raise SettingsError(f"size must look like '480*832' (H*W), got {self.size!r}") from None
        if h < 16 or w < 16:
            raise SettingsError(f"size {self.size!r} is too small: both sides must be >= 16")
        return h, w

    @property
    def max_area(self) -> int:
        h, w = self.height_width
        return h * w

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["guide_scale"] = list(self.guide_scale)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"unknown generation setting(s) {unknown}; known: {sorted(known)}")
        data = dict(data)
        if "guide_scale" in data:
            data["guide_scale"] = parse_guide_scale(data["guide_scale"])
        types = {"frame_num": int, "steps": int, "seed": int, "fps": int, "shift": float, "boundary": float}
        for key, kind in types.items():
            if key in data:
                try:
                    data[key] = kind(data[key])
                except (TypeError, ValueError):
                    raise SettingsError(f"{key} must be a {kind.__name__} (got {data[key]!r})") from None
        return cls(**data)

    def replace(self, **changes: Any) -> GenerationSettings:
        return self.from_dict({**self.to_dict(), **changes})


def parse_guide_scale(value: Any) -> tuple[float, float]:
    """One value (used for both experts) or "low,high" / [low, high]."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if isinstance(value, (int, float)):
        value = [value]
    try:
        values = [float(v) for v in value]
    except (TypeError, ValueError):
        raise SettingsError(f"guide_scale must be one number or 'low,high' (got {value!r})") from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2:
        raise SettingsError(f"guide_scale must be one number or 'low,high' (got {value!r})")
    return values[0], values[1]


def load_settings(path: Path | None = None, preset: str = "default") -> GenerationSettings:
    """Read `[preset]` of a generation TOML (default: config/generation.toml) over the defaults."""
    path = path or CONFIG_DIR / "generation.toml"
    if not path.exists():
        return GenerationSettings()
    with open(path, "rb") as f:
        table = tomllib.load(f)
    if preset not in table:
        raise SettingsError(f"{path}: no [{preset}] table (have {sorted(table)})")
    return GenerationSettings.from_dict(table[preset])
