"""Open a USD file given by a user, or say in one line why it does not open (pxr only).

`Usd.Stage.Open` raises `pxr.Tf.ErrorException` for a file it cannot read (a syntax error, an
empty or truncated file, something that is not USD at all, a missing file) with a multi-line
text of C++ locations; older releases return None instead. Both become a `UsdFileError` naming
the file and the parser's own reason, e.g. "bad.usda:4:1: Expected } ..." or "Sdf crate file
corrupt, possibly truncated".
"""

from __future__ import annotations

import re
from pathlib import Path

from lingbot_isaac.lens import CameraError

# One diagnostic of a Tf.ErrorException: "Error in 'FUNCTION' at line N in file F : 'MESSAGE'"
# (a MESSAGE may hold quotes and newlines: it ends where the next diagnostic or the text does).
_DIAGNOSTIC = re.compile(r"Error in '[^']*' at line \d+ in file \S+ : '(.*?)'\s*(?=\n\s*Error in '|\Z)", re.DOTALL)


class UsdFileError(CameraError):
    """A USD file cannot be opened (names the file and why)."""


def usd_reason(error: BaseException) -> str:
    """The most telling line of a pxr error: the parser's own message before "Failed to open layer"."""
    messages = [" ".join(m.split()) for m in _DIAGNOSTIC.findall(str(error))]
    specific = [m for m in messages if not m.startswith("Failed to open layer")]
    return (specific or messages or [" ".join(str(error).split()) or type(error).__name__])[0]


def open_stage(path: Path | str, what: str = "USD stage", load_payloads: bool = True):
    """`Usd.Stage.Open(path)`, or a UsdFileError: "PATH: not a readable USD stage (REASON); FIX"."""
    from pxr import Tf, Usd

    path = Path(path)
    if not path.is_file():
        raise UsdFileError(f"{path}: no such {what} file")
    fix = "check that it is a complete .usd/.usda/.usdc file (open it in usdview or Isaac Sim)"
    if path.stat().st_size == 0:
        raise UsdFileError(f"{path}: an empty file (0 bytes), not a {what}; {fix}")
    try:
        stage = Usd.Stage.Open(str(path), Usd.Stage.LoadAll if load_payloads else Usd.Stage.LoadNone)
    except Tf.ErrorException as exc:
        raise UsdFileError(f"{path}: not a readable {what} ({usd_reason(exc)}); {fix}") from None
    if stage is None:
        raise UsdFileError(f"{path}: USD could not open this {what}; {fix}")
    return stage
