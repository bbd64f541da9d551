"""The provenance record of one rollout: what made it, in one format, written beside the video.

Every path that makes a rollout writes `<video stem>.json` beside the mp4 (`rollout.json` beside
`rollout.mp4`): `generate` directly; the server's worker beside its spooled result, from where the
record travels back with the video and `replay`, `submit`, the Isaac extension and the demo write it
beside theirs, adding the job they ran as. Every report shows it at the top, and the "tiny model:
output is noise" banner follows the record (`is_random_weights`), whichever path made the video.

    {"schema": SCHEMA, "created": "2026-11-23T13:20:00Z", "producer": "generate" | "worker",
     "model": {"family" (contracts.model_families: v1-base, v1-fast, v2-causal-fast, v2-causal-pretrain),
               "variant" (base | fast | causal), "size" (14B, 1.3B), "weights" (tiny | real), "random_weights", "name"},
     "checkpoint": {"path", "layout", "fingerprint", "files", "bytes"},
     "compute": {"device", "device_name", "dtype" (the float type the matmuls ran in: float32 on the
                 CPU), "compute" (the path: exact | fp8 | int8, contracts.engine_options.COMPUTES), "compute_reason",
                 "attention", "decode_overlap" (causal models: whether chunks decoded on a second CUDA stream
                 beside the next chunk's forwards), "vae_dtype", ...},
     "settings": every generation setting used (frame_num = frames generated),
     "requested": the settings as asked, "adjustments": ["81 frames asked, 33 poses: generating 33"],
     "output": {"frames", "height", "width", "fps"}, "inputs": {"prompt", "image", "poses", ...},
     "versions": {"lingbot_isaac", "torch", "python"}, "timings": {"load_s", "text_s", ..., a Fast
                 rollout's "chunks": [{"dit", "encode", "decode", "overlap", "wall"} seconds, one per chunk; a
                 live job's also "poses": the wait for the chunk's poses, in its wall, not its DiT]},
     "memory_plan": the plan as printed, "job": {...} (client side: server, job id, seconds) or null}

Standard library and contracts only (the Isaac side reads and writes it; it never imports torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from contracts import atomic
from contracts.engine_options import canonical_compute

SCHEMA = "lingbot-isaac/provenance/1"
PRODUCERS = ("generate", "worker")
SECTIONS = ("model", "checkpoint", "compute", "settings", "output", "versions", "timings")
# Generation settings a record must state: a number without them cannot be reproduced.
REQUIRED_SETTINGS = ("size", "frame_num", "steps", "shift", "guide_scale", "seed")
TINY_NOTE = (
    "tiny-model output is noise: the 'tiny' preset has random weights, so its video shows nothing "
    "of the scene and its numbers only prove that the pipeline runs end to end."
)
# Files whose content identifies a checkpoint cheaply (configs, shard indexes, tokenizers, notes);
# the weights themselves enter the fingerprint by name and size only (hashing 70 GB takes minutes).
_HASHED_SUFFIXES = (".json", ".txt", ".model", ".md", ".yaml", ".toml")
_HASHED_MAX_BYTES = 16 * 2**20


class ProvenanceError(ValueError):
    """A provenance record that is not one: names the file or field."""


def sidecar_path(video: str | os.PathLike) -> Path:
    """Where a video's record lives: the same name with .json (rollout.mp4 -> rollout.json)."""
    return Path(video).with_suffix(".json")


def checkpoint_fingerprint(root: str | os.PathLike) -> dict[str, Any]:
    """A cheap content fingerprint of a checkpoint folder: sha256 over every file's relative path and
    size, plus the bytes of its small metadata files (configs, indexes, tokenizer). Two folders with
    the same fingerprint hold the same layout, configs and weight files of the same sizes."""
    root = Path(root).expanduser()
    digest = hashlib.sha256()
    files = total = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        size = path.stat().st_size
        relative = path.relative_to(root).as_posix()
        digest.update(f"{relative}\0{size}\n".encode())
        if path.suffix.lower() in _HASHED_SUFFIXES and size <= _HASHED_MAX_BYTES:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        files += 1
        total += size
    return {"fingerprint": f"sha256:{digest.hexdigest()[:32]}", "files": files, "bytes": total}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions(**extra: str | None) -> dict[str, str | None]:
    """The project's, Python's and (without importing it) torch's versions, plus `extra`."""
    found = {"lingbot_isaac": _version("lingbot-isaac"), "python": platform.python_version()}
    found["torch"] = _version("torch")
    found.update(extra)
    return found


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def make_record(
    *,
    producer: str,
    model: dict[str, Any],
    checkpoint: dict[str, Any],
    compute: dict[str, Any],
    settings: dict[str, Any],
    output: dict[str, Any],
    timings: dict[str, Any],
    requested: dict[str, Any] | None = None,
    adjustments: Iterable[str] = (),
    inputs: dict[str, Any] | None = None,
    memory_plan: str | dict | None = None,
    torch_version: str | None = None,
) -> dict[str, Any]:
    """Assemble (and check) the record of one rollout."""
    record = {
        "schema": SCHEMA,
        "created": utc_now(),
        "producer": producer,
        "model": dict(model),
        "checkpoint": dict(checkpoint),
        "compute": dict(compute),
        "settings": dict(settings),
        "requested": dict(requested or {}),
        "adjustments": list(adjustments),
        "output": dict(output),
        "inputs": dict(inputs or {}),
        "versions": versions(**({"torch": torch_version} if torch_version else {})),
        "timings": dict(timings),
        "memory_plan": memory_plan,
        "job": None,
    }
    return check_record(record)


def check_record(record: Any, where: str = "provenance record") -> dict[str, Any]:
    """Raise ProvenanceError naming the field when `record` is not a complete record; return it."""
    if not isinstance(record, dict):
        raise ProvenanceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if record.get("schema") != SCHEMA:
        raise ProvenanceError(f"{where}: schema {record.get('schema')!r}, expected {SCHEMA!r}")
    if record.get("producer") not in PRODUCERS:
        raise ProvenanceError(f"{where}: producer {record.get('producer')!r}, expected one of {PRODUCERS}")
    for section in SECTIONS:
        if not isinstance(record.get(section), dict):
            raise ProvenanceError(f"{where}: {section!r} is missing or not an object")
    model = record["model"]
    for key in ("family", "variant", "weights", "random_weights", "name"):
        if key not in model:
            raise ProvenanceError(f"{where}: model.{key} is missing")
    missing = [key for key in REQUIRED_SETTINGS if record["settings"].get(key) is None]
    if missing:
        raise ProvenanceError(f"{where}: settings {missing} are missing; every setting used must be recorded")
    return record


def with_job(record: dict[str, Any] | None, job: dict[str, Any]) -> dict[str, Any] | None:
    """The record as a client writes it beside its copy of the video: plus the job it ran as."""
    if record is None:
        return None
    return {**record, "job": {**(record.get("job") or {}), **job}}


def to_json(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n").encode("utf-8")


def write_record(video: str | os.PathLike, record: dict[str, Any]) -> Path:
    """Write `record` beside `video` (temp file, fsync, rename, fsync the folder): never half a record."""
    path = sidecar_path(video)
    return atomic.write_bytes(path, to_json(check_record(record, str(path))))


def read_record(video: str | os.PathLike) -> tuple[dict[str, Any] | None, str | None]:
    """The record beside `video` and, when there is a file that is not a record, a note saying why.

    (None, None): no sidecar at all. Reports show the note instead of failing: the video is still
    worth comparing, but nobody can say what made it."""
    path = sidecar_path(video)
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return check_record(data, path.name), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path.name} beside the rollout is not readable JSON ({exc}); ignored."
    except ProvenanceError as exc:
        return None, f"{exc}; ignored."


def is_random_weights(record: dict[str, Any] | None) -> bool:
    """Whether the video came from random weights (the tiny model): reports then show TINY_NOTE."""
    return bool(record and record.get("model", {}).get("random_weights"))


def model_label(record: dict[str, Any] | None) -> str:
    """One line naming the model, e.g. 'lingbot-world base, tiny (random weights), base checkpoint layout'."""
    if not record:
        return "unknown (no provenance record beside the rollout)"
    model = record["model"]
    return f"{model.get('family')} {model.get('variant')}, {model.get('name')}"


def compute_label(compute: dict[str, Any]) -> str:
    """How the matmuls ran, e.g. 'exact in float32 on cpu; attention sdpa, text_encoder cpu' or
    'fp8 (approximate) in bfloat16 on cuda:0 (NVIDIA H100 80GB HBM3); ...'. Records written before
    the path was named 'exact' say 'bf16' for it: shown as exact, beside the dtype they recorded."""
    rest = dict(compute)
    path = canonical_compute(rest.pop("compute", None))
    dtype, device, name = rest.pop("dtype", None), rest.pop("device", None), rest.pop("device_name", None)
    head = " ".join(
        part
        for part in (
            {"fp8": "fp8 (approximate)"}.get(path, path),
            f"in {dtype}" if dtype else None,
            f"on {device}" if device else None,
            f"({name})" if name and name != device else None,
        )
        if part
    )
    tail = ", ".join(f"{k} {v}" for k, v in rest.items() if v is not None)
    return "; ".join(part for part in (head, tail) if part) or "not recorded"


def summary_rows(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows for the top of a report: model, checkpoint, compute, every setting, versions."""
    model, ckpt, compute = record["model"], record["checkpoint"], record["compute"]
    output, versions_ = record["output"], record["versions"]
    rows = [
        ("model", model_label(record)),
        ("weights", "random (tiny model)" if model.get("random_weights") else str(model.get("weights"))),
        ("checkpoint", f"{ckpt.get('path')} ({ckpt.get('layout')} layout)"),
        ("fingerprint", f"{ckpt.get('fingerprint')} over {ckpt.get('files')} files, {ckpt.get('bytes')} bytes"),
        ("compute", compute_label(compute)),
    ]
    rows += [(f"setting: {key}", _text(value)) for key, value in record["settings"].items()]
    if output:
        rows.append(
            (
                "output",
                f"{output.get('frames')} frames {output.get('width')}x{output.get('height')} "
                f"at {output.get('fps')} fps",
            )
        )
    first = (record.get("inputs") or {}).get("first_frame")
    if first:  # a real photo instead of the sim's render changes what the rollout means (issue 15)
        what = "photo (not the sim's render)" if first.get("source") == "photo" else "the episode's image"
        rows.append(("first frame", f"{what}: {first.get('path')}"))
    rows += [("adjusted", line) for line in record.get("adjustments") or []]
    rows.append(("versions", ", ".join(f"{k} {v}" for k, v in versions_.items() if v)))
    rows.append(("made by", f"{record['producer']} on {record['created']}"))
    job = record.get("job")
    if job:
        rows.append(("job", ", ".join(f"{k} {_text(v)}" for k, v in job.items() if v is not None)))
    return rows


def _text(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)
