"""Generation settings: how one rollout is generated, and the named presets.

`FIELDS` is the one table of every setting: its type, its default, its range and what it means. The
dataclass, the strict validator (`GenerationSettings.from_dict`, used at every edge: the server,
the client, the CLIs, the worker) and the help texts all come from it; add a setting by adding a
row. `config/generation.toml` holds named presets as overrides of these defaults (`[tiny]` for the
built-in tiny model); the defaults themselves are stated only here.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from contracts.engine_options import COMPUTE_ALIASES, COMPUTES, MODELS
from contracts.model_frame import MODEL_SIZE, SizeError, parse_size
from contracts.toml_file import read_toml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "config"
PRESETS_FILE = CONFIG_DIR / "generation.toml"
DEFAULT_PRESET = "default"


class SettingsError(ValueError):
    """A generation setting has a value the engine cannot use; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Field:
    """One row of the settings table. `kind`: int | float | str | choice | pair | optional-str | optional-float."""

    name: str
    kind: str
    default: Any
    help: str
    low: float | None = None  # inclusive bounds for numbers (None: unbounded on that side)
    high: float | None = None
    open_low: bool = False  # True: `low` itself is refused (e.g. shift > 0)
    open_high: bool = False
    choices: tuple[Any, ...] = ()
    aliases: tuple[tuple[Any, Any], ...] = ()  # (old spelling, its name in choices): accepted, stored as the name


INT_MAX = 2**63 - 1
# Fast: KV-cache kinds (worldgen.models.kv_cache plans them; "auto" picks the first that fits)
KV_CACHE_MODES = ("auto", "full", "fp8", "rolling")
FIELDS: tuple[Field, ...] = (
    Field(
        "model", "choice", "base", "engine: base (two experts, guided) or fast (causal, chunk by chunk)", choices=MODELS
    ),
    Field("size", "size", MODEL_SIZE, "max area as H*W; the real H, W follow the image's aspect"),
    Field("frame_num", "int", 81, "video frames, 4n+1 (limited by the number of poses)", low=1, high=4097),
    # LingBot-World's i2v-A14B defaults (70 steps, shift 10); [fast40] in generation.toml: 40 / 5
    Field("steps", "int", 70, "denoising steps", low=1, high=1000),
    Field("shift", "float", 10.0, "flow-matching sample shift", low=0.0, high=1000.0, open_low=True),
    Field(
        "guide_scale",
        "pair",
        (5.0, 5.0),
        "classifier-free guidance (low-noise expert, high-noise expert)",
        low=0.0,
        high=100.0,
    ),
    Field(
        "boundary",
        "float",
        0.947,
        "t >= boundary*1000 runs the high-noise expert",
        low=0.0,
        high=1.0,
        open_low=True,
        open_high=True,
    ),
    Field("seed", "int", 42, "random seed of the initial noise", low=0, high=INT_MAX),
    Field("negative_prompt", "optional-str", None, "negative prompt (None: the i2v-A14B default)"),
    Field("fps", "int", 16, "frame rate of the written video", low=1, high=240),
    Field(
        "compute",
        "choice",
        None,
        "per-job compute of the experts: exact (the reference's numerics, in the engine's dtype) or fp8 "
        "(approximate; bf16 = exact, its old name) (None: the engine's choice)",
        choices=(None, *COMPUTES),
        aliases=tuple(COMPUTE_ALIASES.items()),
    ),
    # model = fast only (LingBot-World-Fast; steps, guide_scale, boundary, negative_prompt do not apply)
    Field(
        "kv_cache",
        "choice",
        "auto",
        "fast: KV cache kind: auto (the first that fits the VRAM budget of "
        "full = whole video in bf16 as the reference, fp8 = the same in FP8, rolling = an FP8 window with "
        "an attention sink) or one of them forced",
        choices=KV_CACHE_MODES,
    ),
    Field(
        "attention_frames",
        "int",
        0,
        "fast: latent frames a chunk attends to at most (0: every cached "
        "frame); the reference's --max_attention_size, in frames",
        low=0,
        high=1024,
    ),
    Field(
        "sink_frames",
        "int",
        1,
        "fast: latent frames a rolling KV cache never evicts (attention sink)",
        low=0,
        high=1024,
    ),
    Field(
        "translation_scale",
        "optional-float",
        None,
        "camera travel between latent frames (4 video frames) that the model sees as a step of 1, in the poses' "
        "unit (e.g. the robot's top speed x 4 / fps); fixed for the whole video, so a live job and a batch job "
        "given the same value make the same video (None: batch: the path's largest step; live: the first "
        "moving chunk's largest step, then held)",
        low=1e-6,
        high=1e9,
    ),
    Field(
        "gpus",
        "int",
        1,
        "GPUs for this rollout: 1, or 2. Model base: guidance's conditional and unconditional passes on two GPUs "
        "at once (exact: the same output as one GPU); it costs two of the server's GPUs: it waits until two of its "
        "pool's workers are idle (jobs queued behind it wait too) and holds both while it denoises; it pays off when "
        "the pool has nothing else to run (target <= 0.55x the one-GPU time, docs/benchmarks.md). Models fast and "
        'causal: each chunk\'s forward split over the two GPUs of a worker started with them ([worker] gpus = "0,1"; '
        "live jobs too); a server whose workers have one GPU each refuses it",
        low=1,
        high=2,
    ),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}


def _check(spec: Field, value: Any) -> Any:
    """`value` checked against one row of the table (strict: no coercion of strings or bools)."""
    name = spec.name
    if spec.kind == "choice":
        aliases = dict(spec.aliases)
        if isinstance(value, bool) or (value not in spec.choices and not (isinstance(value, str) and value in aliases)):
            shown = ", ".join("null" if c is None else repr(c) for c in spec.choices)
            also = "".join(f" ({old!r} = {new!r})" for old, new in aliases.items())
            raise SettingsError(f"{name} must be one of {shown}{also} (got {value!r})")
        return aliases.get(value, value) if isinstance(value, str) else value
    if spec.kind in ("str", "size", "optional-str"):
        if value is None and spec.kind == "optional-str":
            return None
        if not isinstance(value, str):
            raise SettingsError(f"{name} must be a string (got {type(value).__name__} {value!r:.60})")
        if spec.kind == "size":
            try:
                parse_size(value, name)
            except SizeError as exc:
                raise SettingsError(str(exc)) from None
        return value
    if spec.kind == "pair":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = (value, value)
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise SettingsError(f"{name} must be one number or [low, high] (got {value!r:.60})")
        return tuple(
            _number(Field(f"{name}[{i}]", "float", None, "", spec.low, spec.high), v) for i, v in enumerate(value)
        )
    if value is None and spec.kind == "optional-float":
        return None
    return _number(spec, value)


def _number(spec: Field, value: Any) -> Any:
    name = spec.name
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(f"{name} must be an integer (got {type(value).__name__} {value!r:.60})")
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{name} must be a number (got {type(value).__name__} {value!r:.60})")
        if not math.isfinite(value):
            raise SettingsError(f"{name} must be finite (got {value!r})")
        value = float(value)
    too_low = spec.low is not None and (value <= spec.low if spec.open_low else value < spec.low)
    too_high = spec.high is not None and (value >= spec.high if spec.open_high else value > spec.high)
    if too_low or too_high:
        left = "(" if spec.open_low else "["
        right = ")" if spec.open_high else "]"
        low = "-inf" if spec.low is None else f"{spec.low:g}"
        high = "inf" if spec.high is None else f"{spec.high:g}"
        raise SettingsError(f"{name} must be in {left}{low}, {high}{right} (got {value!r})")
    return value


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """How one rollout is generated. Field names match the CLI flags; see `FIELDS` for each."""

    model: str = FIELD_BY_NAME["model"].default
    size: str = FIELD_BY_NAME["size"].default
    frame_num: int = FIELD_BY_NAME["frame_num"].default
    steps: int = FIELD_BY_NAME["steps"].default
    shift: float = FIELD_BY_NAME["shift"].default
    guide_scale: tuple[float, float] = FIELD_BY_NAME["guide_scale"].default
    boundary: float = FIELD_BY_NAME["boundary"].default
    seed: int = FIELD_BY_NAME["seed"].default
    negative_prompt: str | None = FIELD_BY_NAME["negative_prompt"].default
    fps: int = FIELD_BY_NAME["fps"].default
    compute: str | None = FIELD_BY_NAME["compute"].default
    kv_cache: str = FIELD_BY_NAME["kv_cache"].default
    attention_frames: int = FIELD_BY_NAME["attention_frames"].default
    sink_frames: int = FIELD_BY_NAME["sink_frames"].default
    translation_scale: float | None = FIELD_BY_NAME["translation_scale"].default
    gpus: int = FIELD_BY_NAME["gpus"].default

    def __post_init__(self) -> None:
        for spec in FIELDS:
            object.__setattr__(self, spec.name, _check(spec, getattr(self, spec.name)))

    @property
    def height_width(self) -> tuple[int, int]:
        return parse_size(self.size)

    @property
    def max_area(self) -> int:
        height, width = self.height_width
        return height * width

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["guide_scale"] = list(self.guide_scale)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "generation settings") -> GenerationSettings:
        """The strict validator: unknown keys, wrong types and out-of-range values raise
        SettingsError naming the field. Missing keys take the defaults."""
        return cls(**check_partial(data, where))

    def replace(self, **changes: Any) -> GenerationSettings:
        return self.from_dict({**self.to_dict(), **changes})


def check_partial(data: Any, where: str = "generation settings") -> dict[str, Any]:
    """Validate a partial settings dict (e.g. a job's overrides of a preset); return it normalised."""
    if not isinstance(data, dict):
        raise SettingsError(f"{where} must be a table/object of settings (got {type(data).__name__})")
    unknown = sorted(str(k) for k in set(data) - set(FIELD_BY_NAME))
    if unknown:
        raise SettingsError(f"unknown generation setting(s) {unknown}; known: {sorted(FIELD_BY_NAME)}")
    checked = {key: _check(FIELD_BY_NAME[key], value) for key, value in data.items()}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in checked.items()}  # wire form


def job_settings(episode_generation: dict[str, Any] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """A job's settings: the episode's own (episode.json `generation`) under the caller's overrides
    (command line, Settings panel); checked, and partial: the server's preset fills the rest."""
    return check_partial({**(episode_generation or {}), **overrides})


def parse_guide_scale(value: Any) -> tuple[float, float]:
    """Command-line form: one value (used for both experts) or "low,high"."""
    parts = [v for v in str(value).split(",") if v.strip()]
    try:
        numbers = [float(v) for v in parts]
    except ValueError:
        raise SettingsError(f"guide_scale must be one number or 'low,high' (got {value!r})") from None
    if len(numbers) not in (1, 2):
        raise SettingsError(f"guide_scale must be one number or 'low,high' (got {value!r})")
    return _check(FIELD_BY_NAME["guide_scale"], numbers * 2 if len(numbers) == 1 else numbers)


def load_presets(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every `[preset]` table of a generation TOML (default: config/generation.toml), checked."""
    path = Path(path) if path else PRESETS_FILE
    if path == PRESETS_FILE and not path.is_file():  # an installed package without the config folder
        return {DEFAULT_PRESET: {}}  # defaults only
    table = read_toml(path, "generation presets file", error=SettingsError)
    presets = {}
    for name, values in table.items():
        try:
            presets[name] = check_partial(values, f"{path} [{name}]")
        except SettingsError as exc:
            raise SettingsError(f"{path} [{name}]: {exc}") from None
    presets.setdefault(DEFAULT_PRESET, {})
    return presets


def load_settings(path: Path | None = None, preset: str = DEFAULT_PRESET) -> GenerationSettings:
    """The defaults with `[preset]` of a generation TOML (default: config/generation.toml) over them."""
    presets = load_presets(path)
    if preset not in presets:
        raise SettingsError(f"{path or PRESETS_FILE}: no [{preset}] preset (have {sorted(presets)})")
    return GenerationSettings(**presets[preset])
