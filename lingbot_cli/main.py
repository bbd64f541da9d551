"""`lingbot-isaac <command> ...`: one entry point for the whole project.

Every subcommand's arguments live here, in lingbot_cli/ (one module a command, over the plain
functions its package exposes), and a module is imported only when its command runs, so
`lingbot-isaac replay` never imports torch and `lingbot-isaac generate` never imports zmq.
A subcommand module provides `add_arguments(parser)`, `run(args) -> int` and may list in
`USER_ERRORS` the exception types that mean bad input: those print one clear line and exit 2
instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

# name -> (module, one-line help). Keep the help short: `lingbot-isaac COMMAND --help` says more.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("lingbot_cli.demo", "run the whole loop on the built-in sample: serve, replay, compare, report"),
    "generate": ("lingbot_cli.generate", "image + prompt + camera poses -> video (no server)"),
    "serve": ("lingbot_cli.serve", "run the ZeroMQ generation server"),
    "submit": ("lingbot_cli.submit", "send one episode folder to a server and save the rollout mp4"),
    "replay": ("lingbot_cli.replay", "send recorded episodes / USD / HDF5 trajectories to a server"),
    "compare": ("lingbot_cli.compare", "sim frames vs world-model rollout: side-by-side video and report"),
    "quantize": ("lingbot_cli.quantize", "convert the original bf16 release into the NF4 layout"),
    "keys": ("lingbot_cli.keys", "create CurveZMQ key pairs for non-loopback servers"),
    "doctor": ("lingbot_cli.doctor", "check the installation, GPU and a checkpoint folder"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: lingbot-isaac COMMAND [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {helptext}" for name, (_, helptext) in COMMANDS.items()]
    lines += ["", "Run `lingbot-isaac COMMAND --help` for the options of one command."]
    return "\n".join(lines)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (examples keep their lines); each option's default said once:
    appended as "(default: X)" unless its help already says what the default is, or there is none to say
    (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default in (argparse.SUPPRESS, [])
        if "default" in text or nothing:
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The parser of one subcommand (and its module), exactly as `lingbot-isaac NAME` builds it."""
    module_name, helptext = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(
        prog=f"lingbot-isaac {name}",
        description=(module.__doc__ or helptext).strip().split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    module.add_arguments(parser)
    return parser, module


# Warnings of these packages are messages to the user: one plain line, without the Python source
# line `warnings` shows by default. Other libraries' warnings keep their usual form.
OWN_PACKAGES = ("contracts", "lingbot_isaac", "bridge", "worldgen", "comparison", "lingbot_cli")


def plain_warning(message, category, filename, lineno, line=None) -> str:
    """`warnings.formatwarning` for the command line: "warning: MESSAGE" for our own warnings."""
    if category.__module__.split(".")[0] in OWN_PACKAGES:
        return f"warning: {message}\n"
    return _python_formatwarning(message, category, filename, lineno, line)


_python_formatwarning = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warnings.formatwarning = plain_warning
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"lingbot-isaac: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    parser, module = build_parser(name)
    args = parser.parse_args(rest)
    user_errors = tuple(getattr(module, "USER_ERRORS", ()))
    try:
        return int(module.run(args) or 0)
    except user_errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
