"""One rule for the DiT, umT5 and VAE config.json parsers (worldgen.models.config_json): the keys real
releases carry load silently; any other key gets the same warning, naming the file and the key."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from worldgen.errors import CheckpointError
from worldgen.models.config_json import ConfigKeyWarning
from worldgen.models.dit_config import DiTConfig
from worldgen.models.t5 import T5Config
from worldgen.models.vae_config import VAEConfig

# What diffusers' save_config writes for the reference's WanModel (lingbot-world-base-cam experts):
# its register_to_config arguments less ignore_for_config (patch_size, cross_attn_norm, qk_norm,
# text_dim, window_size), plus _class_name and _diffusers_version.
WAN_MODEL = {
    "_class_name": "WanModel",
    "_diffusers_version": "0.35.1",
    "model_type": "i2v",
    "text_len": 512,
    "in_dim": 36,
    "dim": 5120,
    "ffn_dim": 13824,
    "freq_dim": 256,
    "out_dim": 16,
    "num_heads": 40,
    "num_layers": 40,
    "eps": 1e-06,
}


def _write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _silently(parse, path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        return parse(path)


def test_release_shaped_configs_load_silently(tmp_path, golden):
    dit = _silently(DiTConfig.from_json, _write(tmp_path, WAN_MODEL))
    assert (dit.dim, dit.num_layers, dit.patch_size, dit.text_dim, dit.qk_norm) == (5120, 40, (1, 2, 2), 4096, True)
    # the Fast release's own config (WanModelFast: _diffusers_version, control_type) and our goldens
    fast = _silently(
        DiTConfig.from_json, golden / "fast" / "lingbot-world-base-cam" / "lingbot_world_fast" / "config.json"
    )
    assert fast.local_attn_size == -1 and fast.num_layers == 2
    assert _silently(DiTConfig.from_json, golden / "dit" / "bf16_layout" / "config.json").text_dim == 32
    assert _silently(T5Config.from_json, golden / "t5" / "config.json").num_buckets == 32
    assert _silently(VAEConfig.from_json, golden / "vae" / "config.json").dim_mult == (1, 2, 4, 4)


@pytest.mark.parametrize(
    "parse,what,key,base",
    [
        (DiTConfig.from_json, "DiT", "num_layer", WAN_MODEL),
        (T5Config.from_json, "umT5", "num_bucket", "t5"),
        (VAEConfig.from_json, "VAE", "z_dimm", "vae"),
    ],
)
def test_a_misspelled_key_gives_the_same_warning_from_every_parser(tmp_path, golden, parse, what, key, base):
    data = dict(base) if isinstance(base, dict) else json.loads((golden / base / "config.json").read_text())
    path = _write(tmp_path, {**data, key: 3})
    with pytest.warns(ConfigKeyWarning) as caught:
        parse(path)
    (warning,) = caught
    expected = (
        f"{path}: unknown key '{key}' in the {what} config, ignored (a misspelling leaves that field at its default)"
    )
    assert str(warning.message).startswith(expected)


@pytest.mark.parametrize("parse", [DiTConfig.from_json, T5Config.from_json, VAEConfig.from_json])
def test_unreadable_or_incomplete_configs_are_refused_naming_the_file(tmp_path, parse):
    broken = _write(tmp_path, "[1, 2]", "broken.json")
    broken.write_text("{not json")
    with pytest.raises(CheckpointError, match=re.escape(f"{broken}: cannot read the")):
        parse(broken)
    listed = _write(tmp_path, [1, 2], "list.json")
    with pytest.raises(CheckpointError, match=re.escape(f"{listed}: the") + ".*must be a JSON object"):
        parse(listed)
