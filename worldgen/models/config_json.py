"""A model's `config.json` read into its dataclass: the one rule for every config (DiT, umT5, VAE).

- A key the dataclass has is used (a JSON list becomes a tuple where the field is a tuple).
- A key in RELEASE_KEYS is ignored silently: real releases write it but it is no constructor argument
  of ours. diffusers' `save_config` adds `_class_name` and `_diffusers_version` (LingBot-World's
  `config.json` files are diffusers ConfigMixin configs: `WanModel`, `WanModelFast`), and copies saved
  after `from_pretrained` may carry `_name_or_path` / `_use_default_values`; LingBot-World-Fast's
  `WanModelFast` registers `control_type` (cam | act), which the reference picks from the checkpoint
  path anyway.
- Any other key is a warning (`ConfigKeyWarning`) naming the file and the key, and is ignored: a
  misspelled key falls back to the default, which the warning says; refusing could break a release
  config whose extra keys we have not seen.
- A required key missing, a file that is not JSON or not an object: `CheckpointError` naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import typing
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from worldgen.errors import CheckpointError

RELEASE_KEYS = frozenset({"_class_name", "_diffusers_version", "_name_or_path", "_use_default_values", "control_type"})


class ConfigKeyWarning(UserWarning):
    """A config.json key that is neither a field nor a known release-only key."""


def read_config(cls: type, path: str | Path, what: str, optional: Iterable[str] | None = None) -> Any:
    """`cls(**keys of path)` under the rule above. `what` names the model in messages ("DiT");
    `optional`: the fields a config may leave out (default: those with a default value)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read the {what} config ({exc}); re-download config.json") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: the {what} config must be a JSON object (got {type(data).__name__})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if optional is None:
        optional = {n for n, f in fields.items() if f.default is not dataclasses.MISSING}
    missing = sorted(set(fields) - set(data) - set(optional))
    if missing:
        raise CheckpointError(f"{path}: the {what} config lacks {missing}; is this the right model folder?")
    for key in sorted(set(data) - set(fields) - RELEASE_KEYS):
        warnings.warn(
            f"{path}: unknown key {key!r} in the {what} config, ignored (a misspelling leaves that field at "
            f"its default); known keys: {sorted(fields)}",
            ConfigKeyWarning,
            stacklevel=3,
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key in fields:
            is_tuple = typing.get_origin(hints[key]) is tuple
            kwargs[key] = tuple(value) if is_tuple and isinstance(value, list) else value
    return cls(**kwargs)
