"""The docs say what the code does: every option, path, config key, default and protocol field they
name is checked here against the code itself (README.md, docs/*.md, config/*.toml)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from bridge.server.server_config import ENGINE_KEYS, ServerConfig, WorkerConfig, load_server_config
from bridge.wire import protocol
from contracts.settings import FIELDS
from lingbot_cli.main import COMMANDS, build_parser
from tests.conftest import REPO

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
CONFIGS = ["extension.toml", *sorted(str(p.relative_to(REPO)) for p in (REPO / "config").glob("*.toml"))]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _text(name: str) -> str:
    return (REPO / name).read_text(encoding="utf-8")


def _options(name: str) -> set[str]:
    """Every option string of a command and of its sub-commands (`keys server` ...)."""
    found, todo = set(), [build_parser(name)[0]]
    while todo:
        parser = todo.pop()
        for action in parser._actions:  # argparse keeps no public list of its actions
            found |= set(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                todo += action.choices.values()
    return found


@pytest.fixture(scope="module")
def options() -> dict[str, set[str]]:
    return {name: _options(name) for name in COMMANDS}


def _wrong_options(doc: str, text: str, options: dict[str, set[str]]) -> list[str]:
    """`lingbot-isaac CMD ... --flag`, "`CMD --flag`", "`replay`/`submit --flag`" and the README's command
    table rows: each flag that is not an option of that command."""
    names = "|".join(COMMANDS)
    wrong = []
    for number, line in enumerate(text.splitlines(), 1):
        uses = [(m[1], FLAG.findall(m[2])) for m in re.finditer(rf"lingbot-isaac ({names})\b([^`]*)", line)]
        uses += [
            (command, [m[2]])
            for m in re.finditer(rf"`((?:{names})(?:`?/`?(?:{names}))*) (--[a-z][a-z0-9-]*)", line)
            for command in re.split(r"`?/`?", m[1])
        ]
        if row := re.match(rf"\| `({names})` \|(.*)", line):
            uses.append((row[1], FLAG.findall(row[2])))
        wrong += [f"{doc}:{number}: {command} has no {flag}" for command, flags in uses for flag in flags
                  if flag not in options[command]]  # fmt: skip
    return wrong


def test_every_option_the_docs_give_a_command_is_one_of_its_options(options):
    wrong = [problem for doc in DOCS for problem in _wrong_options(doc, _text(doc), options)]
    for name in COMMANDS:  # the examples in each command's own --help and module docstring too
        parser, module = build_parser(name)
        wrong += _wrong_options(f"{name} --help", f"{parser.format_help()}\n{module.__doc__ or ''}", options)
    assert not wrong, "\n".join(wrong)


def test_the_check_of_options_sees_a_wrong_one(options):
    planted = (
        "`lingbot-isaac replay EP --follow --steps 4` and `replay`/`submit --device cpu`\n"
        "| `generate` | `--ckpt-dir DIR --no-such-flag` |\n"
        "`submit --follow`, `lingbot-isaac serve --devices cpu,cpu`\n"
    )
    assert _wrong_options("planted", planted, options) == [
        "planted:1: replay has no --follow",
        "planted:1: replay has no --device",
        "planted:1: submit has no --device",
        "planted:2: generate has no --no-such-flag",
    ]


def _ignored(path: Path) -> bool:
    """Whether git ignores `path` (no git here: nothing is)."""
    try:
        return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO).returncode == 0
    except OSError:
        return False


def test_every_repository_path_the_docs_name_exists():
    """`bridge/workers/worker_pool.py`, `comparison/templates/`, `tests/x.py::test_y` ...: each is there."""
    # what the checkout holds, not what running it wrote (out/ after `make demo` is ignored by git)
    tops = {p.name for p in REPO.iterdir() if not p.name.startswith(".") and not _ignored(p)}
    missing = []
    for doc in DOCS + CONFIGS:
        for match in re.finditer(r"(?<![\w./~<-])((?:[\w.-]+/)+[\w.*-]*)(?:::(\w+))?", _text(doc)):
            path, test = match[1].rstrip("."), match[2]
            if path.split("/")[0] not in tops or "*" in path or re.search(r"(^|[/_])[A-Z]+\d*([/_.]|$)", path):
                continue  # not a path of this repository (keys/clients, ~/models/...) or a pattern (data/demo_N/)
            if not (REPO / path).exists():
                missing.append(f"{doc}: {path}")
            elif test and not re.search(rf"^def {test}\(", (REPO / path).read_text(), re.M):
                missing.append(f"{doc}: {path} has no {test}")
    assert not missing, "\n".join(missing)


def _keys_named(toml_text: str) -> dict[str, set[str]]:
    """`key = ...` lines per [table], commented-out ones included (they document a key not set)."""
    tables: dict[str, set[str]] = {}
    table = ""
    for line in toml_text.splitlines():
        if header := re.match(r"\[(\w+)\]", line):
            table = header[1]
        elif key := re.match(r"#?\s*(\w+)\s*=", line):
            tables.setdefault(table, set()).add(key[1])
    return tables


def test_config_server_toml_holds_the_built_in_defaults_and_names_every_key():
    """Its header says "the values below are the built-in defaults": what it sets equals ServerConfig(),
    and every key the server reads is there (set, or commented out with what it does)."""
    path = REPO / "config" / "server.toml"
    assert load_server_config(path) == ServerConfig()
    named = _keys_named(path.read_text())
    expected = {
        "server": {f.name for f in dataclasses.fields(ServerConfig)} - {"limits", "worker", "security"},
        "worker": ({f.name for f in dataclasses.fields(WorkerConfig)} - {"engine"}) | set(ENGINE_KEYS),
        "limits": {f.name for f in dataclasses.fields(protocol.Limits)},
        "security": {"server_secret_key", "client_keys_dir"},
    }
    missing = {table: sorted(keys - named.get(table, set())) for table, keys in expected.items()}
    assert not any(missing.values()), f"config/server.toml does not name {missing}"


def _table_rows(doc: str, heading: str) -> dict[str, str]:
    """First-column name -> the rest of the row, of the first table under `heading` in a doc."""
    section = doc.split(heading, 1)[1]
    rows = {}
    for line in section.splitlines():
        if line.startswith("|"):
            cells = line.split("|")
            if name := re.fullmatch(r"\s*`(\w+)`\s*", cells[1]):
                rows[name[1]] = "|".join(cells[2:])
        elif rows:
            break
    return rows


def test_protocol_doc_names_every_field_frame_and_error_code_of_bridge_protocol():
    doc = _text("docs/protocol.md")
    problems = []
    for heading, schemas in (("## Client -> server", protocol.REQUESTS), ("## Server -> client", protocol.REPLIES)):
        rows = _table_rows(doc, heading)
        if set(rows) != set(schemas):
            problems.append(f"{heading}: the doc has {sorted(rows)}, bridge/wire/protocol.py {sorted(schemas)}")
        for type_, fields in schemas.items():
            problems += [f"{heading} `{type_}`: no `{f}`" for f in fields if f"`{f}`" not in rows.get(type_, "")]
    codes = _table_rows(doc, "### Error codes")
    if list(codes) != list(protocol.ERROR_CODES):
        problems.append(f"error codes: the doc has {list(codes)}, bridge/wire/protocol.py {list(protocol.ERROR_CODES)}")
    frames = doc.split("### Allowed data frames", 1)[1].split("###", 1)[0]
    for type_, specs in protocol.FRAMES.items():
        for name, spec in specs.items():
            row = re.search(rf"^\| `{type_}` \| `{name}`.*$", frames, re.M)
            cap = spec.max_bytes or spec.max_rows
            if row is None or cap not in row[0]:
                problems.append(f"allowed data frames: no row for `{type_}` `{name}` naming its cap {cap}")
    settings = doc.split("`settings` are", 1)[1].split(". They", 1)[0]
    problems += [f"the settings list has no `{f.name}`" for f in FIELDS if f"`{f.name}`" not in settings]
    assert not problems, "\n".join(problems)


def test_protocol_doc_states_the_caps_bridge_protocol_uses():
    """Each "`max_x` (N MiB)" figure of docs/protocol.md is the default in bridge.wire.protocol.Limits."""
    limits = protocol.Limits()
    units = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    stated = re.findall(r"`(max_\w+)` \((\d+)(?: (KiB|MiB|GiB))?\)", _text("docs/protocol.md"))
    assert len(stated) >= 5
    wrong = [f"{name} ({n} {unit})" for name, n, unit in stated if int(n) * units[unit] != getattr(limits, name)]
    assert not wrong, f"docs/protocol.md states {wrong}; bridge.wire.protocol.Limits: {limits}"


def _command_lines(text: str) -> list[str]:
    """Inline code spans (they may wrap) and the lines of fenced blocks (`\\` continuations joined)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    lines = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    for block in blocks:
        lines += block.replace("\\\n", " ").splitlines()
    return lines


def test_every_option_the_docs_give_a_script_is_one_of_its_options():
    """`python3 bench/bench_fast.py ... --frames 81`, `scripts/isaac_record_and_generate.py --keep-frames`:
    each flag is an argparse option of that script (its source, or a sibling module it imports its command
    line from, says "--flag")."""

    def source_of(script: str) -> str:
        text = (REPO / script).read_text()
        siblings = re.findall(r"^from (scripts|bench)\.(\w+) import", text, re.MULTILINE)
        return text + "".join((REPO / folder / f"{name}.py").read_text() for folder, name in siblings)

    wrong = []
    for doc in DOCS:
        for command in (c for line in _command_lines(_text(doc)) for c in re.split(r"&&|;|\|", line)):
            for script, rest in re.findall(r"((?:scripts|bench)/\w+\.py)(.*)", command):
                source = source_of(script)
                wrong += [f"{doc}: {script} {flag}" for flag in FLAG.findall(rest) if f'"{flag}"' not in source]
    assert not wrong, "\n".join(wrong)


def test_protocol_doc_names_every_worker_pipe_message():
    from bridge.workers import worker_protocol

    pipe = _text("docs/protocol.md").split("## The worker pipe", 1)[1]
    missing = [m for m in (*worker_protocol.TO_WORKER, *worker_protocol.FROM_WORKER) if f"`{m}`" not in pipe]
    assert not missing, f'docs/protocol.md, "The worker pipe", does not name {missing}'


def test_isaac_sim_doc_states_the_window_defaults_the_session_uses():
    from lingbot_isaac.session import SessionSettings

    doc, settings = " ".join(_text("docs/isaac-sim.md").split()), SessionSettings()  # wrapping aside
    assert f"after {settings.max_seconds:g} s of sim time (`SessionSettings.max_seconds`" in doc
    assert f"render size (default {settings.width}x{settings.height}," in doc
    assert "Record on render steps (default)" in doc and settings.sample_on == "render"
    assert settings.server == f"tcp://127.0.0.1:{protocol.DEFAULT_PORT}"


# The README is a user's guide (issue 51): short, no wall of prose, and every command and link in it true.
README_MOST_LINES = 200
PARAGRAPH_MOST_LINES = 12
LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+[.)])\s")
FENCE = re.compile(r"^\s*```")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _long_paragraphs(doc: str, text: str, most: int = PARAGRAPH_MOST_LINES) -> list[str]:
    """Paragraphs over `most` lines: runs of prose lines, i.e. not in a code block (fenced, or indented after a
    blank line), a table, a list (an item and its lines up to the next blank one) or a heading."""
    problems, run, first = [], 0, 0
    fenced = listed = indented = False
    lines = [*text.splitlines(), ""]
    for number, line in enumerate(lines, 1):
        after_blank = number == 1 or not lines[number - 2].strip()
        if FENCE.match(line):
            fenced, prose = not fenced, False
        elif fenced:
            prose = False
        elif not line.strip():
            listed = indented = prose = False
        else:
            indented = indented or (after_blank and line.startswith(("    ", "\t")))
            listed = listed or bool(LIST_ITEM.match(line))
            prose = not (indented or listed or line.startswith(("|", "#")))
        if prose:
            run, first = run + 1, first if run else number
        else:
            if run > most:
                problems.append(f"{doc}:{first}: a paragraph of {run} lines (at most {most})")
            run = 0
    return problems


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lowercase, punctuation but hyphens and spaces dropped,
    spaces to hyphens; a repeated one gets -1, -2 ... Headings inside code blocks are not headings."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def _broken_links(doc: str, text: str) -> list[str]:
    """Relative links `[x](path)` to a file that is not there, and `[x](file.md#anchor)` to no heading of it."""
    wrong = []
    for target in LINK.findall(re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: ...
        path, _, anchor = target.partition("#")
        file = (REPO / doc).parent / path
        if path and not file.exists():
            wrong.append(f"{doc}: {target}: no such file")
        elif anchor and not path and anchor not in _anchors(text):
            wrong.append(f"{doc}: {target}: no such heading in {doc}")
        elif anchor and path and file.suffix == ".md" and anchor not in _anchors(file.read_text(encoding="utf-8")):
            wrong.append(f"{doc}: {target}: no such heading in {path}")
    return wrong


def _wrong_commands(doc: str, text: str, options: dict[str, set[str]]) -> list[str]:
    """`lingbot-isaac WORD ...` in code blocks and spans (a block's `\\` continuations joined): WORD is a command
    (or an upper-case placeholder such as COMMAND) and every --flag after it is one of its options."""
    wrong = []
    for line in _command_lines(text):
        for command in re.split(r"&&|;|\|", re.sub(r"\s#.*", "", line)):
            for name, rest in re.findall(r"(?:^|[\s/])lingbot-isaac\s+([\w-]+)(.*)", command):
                if name.isupper() or name.startswith("-"):
                    continue
                if name not in options:
                    wrong.append(f"{doc}: lingbot-isaac {name}: no such command")
                    continue
                wrong += [f"{doc}: {name} has no {flag}" for flag in FLAG.findall(rest) if flag not in options[name]]
    return wrong


def _readme_problems(text: str, options: dict[str, set[str]], doc: str = "README.md") -> list[str]:
    lines = len(text.splitlines())
    problems = [f"{doc}: {lines} lines (at most {README_MOST_LINES})"] if lines > README_MOST_LINES else []
    return problems + _long_paragraphs(doc, text) + _broken_links(doc, text) + _wrong_commands(doc, text, options)


def test_the_readme_is_a_short_guide_whose_commands_and_links_are_true(options):
    problems = _readme_problems(_text("README.md"), options)
    for doc in DOCS[1:]:  # the other docs' links and commands must hold too (their length is their own)
        problems += _broken_links(doc, _text(doc)) + _wrong_commands(doc, _text(doc), options)
    assert not problems, "\n".join(problems)


def test_the_readme_checks_see_each_planted_violation(options):
    prose = "\n".join(f"line {i} of a paragraph" for i in range(1, 14))
    planted = "\n".join(
        [
            "# Title",
            "",
            prose,  # 13 lines: too long
            "",
            "\n".join(f"- item {i}" for i in range(13)),  # a list, a table and a code block may be longer
            "",
            "\n".join("| a | b |" for _ in range(13)),
            "",
            "```bash",
            "\n".join("make demo" for _ in range(13)),
            "lingbot-isaac frobnicate --x",
            "lingbot-isaac serve --ckpt tiny \\",
            "    --no-such-flag 1   # a flag on a continuation line",
            "lingbot-isaac COMMAND --help && lingbot-isaac replay data/sample_room --live --model fast",
            "```",
            "",
            prose.replace("line 13 of a paragraph", ""),  # 12 lines: fine
            "",
            "[ok](docs/benchmarks.md#session-27-lingbot-world-20-on-the-h200-issue-52) [ok](#title)"
            " [ok](https://example.com/x) [gone](docs/no-such.md) [bad](docs/benchmarks.md#no-such-heading)"
            " [bad](#no-such-title) `lingbot-isaac generate --ckpt-dir tiny --no-such-option`",
        ]
    )
    planted += "\n" * (README_MOST_LINES - len(planted.splitlines())) + "\nthe line over the limit"
    assert _readme_problems(planted, options) == [
        "README.md: 201 lines (at most 200)",
        "README.md:3: a paragraph of 13 lines (at most 12)",
        "README.md: docs/no-such.md: no such file",
        "README.md: docs/benchmarks.md#no-such-heading: no such heading in docs/benchmarks.md",
        "README.md: #no-such-title: no such heading in README.md",
        "README.md: generate has no --no-such-option",
        "README.md: lingbot-isaac frobnicate: no such command",
        "README.md: serve has no --no-such-flag",
    ]


def test_anchors_follow_githubs_rule():
    text = "# Session 27: LingBot-World 2.0 (issue 52)\n```\n# not a heading\n```\n## Headless: `lingbot-isaac replay`\n## Use\n## Use\n"
    assert _anchors(text) == {"session-27-lingbot-world-20-issue-52", "headless-lingbot-isaac-replay", "use", "use-1"}
