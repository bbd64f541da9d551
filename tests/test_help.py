"""`lingbot-isaac COMMAND --help`: every option of every command has help, and each default is said once."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from contracts.engine_options import ATTENTION_HELP, ATTENTIONS, FP8_HELP
from contracts.settings import FIELD_BY_NAME
from lingbot_cli.main import COMMANDS, build_parser
from tests.conftest import REPO, files_matching


def _parsers(parser: argparse.ArgumentParser):
    """The parser and every sub-command parser under it (`keys server`, `keys client` ...)."""
    yield parser
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_states_its_default_once(name):
    problems = []
    for parser in _parsers(build_parser(name)[0]):
        problems += _check(parser)
    assert not problems, "\n".join(problems)


def _check(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flag = f"{parser.prog}: " + ("/".join(action.option_strings) or action.dest)
        if not action.help or action.help == argparse.SUPPRESS:
            problems.append(f"{flag}: no help")
            continue
        text = formatter._expand_help(action)  # the help exactly as --help prints it
        meaningful = not (
            action.default is None or action.default is False or action.default in ([], argparse.SUPPRESS)
        )
        if text.count("default:") > 1:  # "(default: a free one) (default: 0)"
            problems.append(f"{flag}: the default is said {text.count('default:')} times: {text!r}")
        if meaningful and "default" not in text and (action.option_strings or action.nargs in ("?", "*")):
            problems.append(f"{flag}: default {action.default!r} not said: {text!r}")
    return problems


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_option_without_a_default_value_says_what_happens_without_it(name):
    """A number or a generation setting left out still has a value (a preset's, the server's, "no limit"):
    its help, or its group's title, says which, or that it overrides a config key (config/server.toml
    states those defaults: tests/test_docs.py). Paths, prompts and modes need no such line."""
    problems = []
    for parser in _parsers(build_parser(name)[0]):
        formatter = parser._get_formatter()
        titles = {id(a): group.title or "" for group in parser._action_groups for a in group._group_actions}
        for action in parser._actions:
            numeric = action.type in (int, float)
            if not action.option_strings or action.default is not None or action.nargs == 0:
                continue
            said = formatter._expand_help(action) + titles.get(id(action), "")
            if (numeric or action.dest in FIELD_BY_NAME) and "default" not in said and "overrides [" not in said:
                problems.append(f"{parser.prog} {'/'.join(action.option_strings)}: what is it when not given?")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_prints_and_exits_0(name):
    result = subprocess.run(
        [sys.executable, "-m", "lingbot_cli", name, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and f"usage: lingbot-isaac {name}" in result.stdout, result.stderr
    assert "Failed to load" not in result.stderr and not result.stderr.strip(), result.stderr


@pytest.mark.parametrize("name", ["generate", "serve", "replay"])
def test_every_compute_help_says_what_fp8_costs_in_the_measured_words(name):
    """The three --compute helps carry contracts' one wording of fp8's measured cost and distance."""
    (compute,) = [a for a in build_parser(name)[0]._actions if "--compute" in a.option_strings]
    assert FP8_HELP in compute.help
    assert "2.33 s against 3.11 s exact (0.75x" in FP8_HELP  # docs/benchmarks.md: NF4 + fp8 vs NF4 exact
    assert files_matching(r"0\.75x|2\.33 s") == ["contracts/engine_options.py"]  # no copy of the figures


@pytest.mark.parametrize("name", ["generate", "serve"])
def test_every_attention_help_is_the_one_wording_with_its_kernels(name):
    """generate's and serve's --attention: contracts' one help, which names every kernel it offers."""
    (option,) = [a for a in build_parser(name)[0]._actions if "--attention" in a.option_strings]
    assert option.help == ATTENTION_HELP and tuple(option.choices) == ATTENTIONS
    assert all(f"{kernel}" in ATTENTION_HELP for kernel in ATTENTIONS) and "flash-attn-4" in ATTENTION_HELP
