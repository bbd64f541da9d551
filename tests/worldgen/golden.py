"""The reference golden files (`../shared/golden`, see its README), read one way: each part's
folder holds `io.safetensors` (the inputs and outputs) and either a model (`config.json` and its
weights) or the cases it was run on (`cases.json`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def golden_model(folder: Path, config_cls, model_cls, weights: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """(the reference's model in eval mode, built from its config.json and weights file, io tensors)."""
    config = config_cls.from_json(folder / "config.json")
    with torch.device("meta"):
        model = model_cls(config)
    model.load_state_dict(torch.load(folder / weights, weights_only=True), assign=True)
    return model.eval(), load_file(folder / "io.safetensors")


def golden_cases(folder: Path) -> tuple[dict[str, dict], dict[str, torch.Tensor]]:
    """({tag: case} of cases.json, io tensors)."""
    cases = json.loads((folder / "cases.json").read_text())
    return {case["tag"]: case for case in cases["cases"]}, load_file(folder / "io.safetensors")
