"""Reading a TOML config file: the one reader (config/server.toml, config/generation.toml,
config/isaac.toml), so every one of them refuses a missing, unreadable or malformed file the same
way, with a message that names the file.

stdlib only (`tomllib`; `tomli` before Python 3.11). Each caller passes its own error class, so the
CLI that reads the file reports the mistake as its own bad input (exit 2) and not as a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class TomlError(ValueError):
    """A TOML file is missing, unreadable or not valid TOML; the message names the file."""


def read_toml(
    path: str | os.PathLike,
    what: str = "TOML file",
    fix: str = "",
    error: type[Exception] = TomlError,
) -> dict[str, Any]:
    """The tables of the TOML file at `path`.

    Raises `error` naming the file: "{what} {path} not found ({fix})" when there is no such file,
    "{path}: cannot be read: ..." when it cannot be opened, "{path}: not valid TOML: ..." (with
    TOML's line and column) when it does not parse.
    """
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path} not found" + (f" ({fix})" if fix else ""))
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # UTF-8 is part of TOML
        raise error(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read: {exc.strerror or exc}") from None
