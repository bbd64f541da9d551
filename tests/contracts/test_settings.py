"""contracts.settings: one table of fields; a strict validator naming the field; presets over defaults."""

from __future__ import annotations

import dataclasses

import pytest

from contracts import settings as settings_module
from contracts.settings import FIELDS, GenerationSettings, SettingsError, check_partial, load_settings


def test_dataclass_defaults_come_from_the_table():
    defaults = GenerationSettings()
    assert [f.name for f in dataclasses.fields(GenerationSettings)] == [f.name for f in FIELDS]
    for spec in FIELDS:
        assert getattr(defaults, spec.name) == spec.default


def test_round_trip_and_replace():
    settings = GenerationSettings(size="96*160", guide_scale=(3, 4), compute="fp8", model="fast")
    again = GenerationSettings.from_dict(settings.to_dict())
    assert again == settings and again.guide_scale == (3.0, 4.0) and again.height_width == (96, 160)
    assert settings.replace(steps=7).steps == 7


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("steps", True, "steps must be an integer"),
        ("steps", 4.0, "steps must be an integer"),
        ("steps", "4", "steps must be an integer"),
        ("frame_num", 10**30, "frame_num must be in"),
        ("frame_num", 1e30, "frame_num must be an integer"),
        ("steps", 0, "steps must be in [1, 1000]"),
        ("seed", -1, "seed must be in"),
        ("seed", 2**64, "seed must be in"),
        ("fps", 0, "fps must be in"),
        ("fps", 10_000, "fps must be in"),
        ("shift", 0.0, "shift must be in (0"),
        ("shift", float("inf"), "shift must be finite"),
        ("shift", "5", "shift must be a number"),
        ("boundary", 1.0, "boundary must be in (0, 1)"),
        ("guide_scale", [1, 2, 3], "guide_scale must be one number or [low, high]"),
        ("guide_scale", [1, "2"], "guide_scale[1] must be a number"),
        ("negative_prompt", {"text": "blur"}, "negative_prompt must be a string"),
        ("negative_prompt", 3, "negative_prompt must be a string"),
        ("size", 480, "size must be a string"),
        ("size", "480x", "size must look like"),
        ("size", "8*8", "too small"),
        ("model", "turbo", "model must be one of"),
        ("compute", "int4", "compute must be one of"),
    ],
)
def test_every_field_is_checked_for_type_and_range(field, value, words):
    with pytest.raises(SettingsError) as info:
        GenerationSettings.from_dict({field: value})
    assert words in str(info.value)


def test_unknown_keys_and_non_dicts_are_refused():
    with pytest.raises(SettingsError, match=r"unknown generation setting\(s\) \['stepz'\]"):
        check_partial({"stepz": 3})
    with pytest.raises(SettingsError, match="must be a table"):
        GenerationSettings.from_dict([("steps", 3)])


def test_a_number_guide_scale_is_used_for_both_experts():
    assert GenerationSettings(guide_scale=4).guide_scale == (4.0, 4.0)


def test_presets_override_the_defaults_and_are_checked(tmp_path):
    tiny = load_settings(preset="tiny")
    assert tiny.size != GenerationSettings().size and tiny.seed == GenerationSettings().seed
    assert load_settings() == GenerationSettings()  # [default] is the table's defaults
    bad = tmp_path / "gen.toml"
    bad.write_text('[fast]\nsteps = "many"\n')
    with pytest.raises(SettingsError, match=r"gen.toml \[fast\].*steps must be an integer"):
        load_settings(bad, "fast")
    with pytest.raises(SettingsError, match=r"no \[nope\] preset"):
        load_settings(preset="nope")


def test_the_presets_file_states_no_default_twice():
    """The defaults live in the table only: [default] in config/generation.toml overrides nothing."""
    assert settings_module.load_presets()["default"] == {}
