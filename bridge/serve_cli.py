"""`lingbot-isaac serve`: run the generation server (ZeroMQ front end, job spool, supervised workers).

Listens on tcp://127.0.0.1:5570 by default; any other address needs CurveZMQ keys
(`lingbot-isaac keys`). Settings come from config/server.toml (see its comments); flags override it.
Prints `listening on ENDPOINT` on stdout once clients can connect; logs go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from bridge.security import SecurityError
from bridge.server import ListenError, Server
from bridge.server_config import ConfigError, load_server_config
from bridge.spool import SpoolError
from contracts.settings import SettingsError

USER_ERRORS = (ConfigError, SecurityError, SpoolError, SettingsError, ListenError)
DEFAULT_CONFIG = Path("config/server.toml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"server TOML (default: {DEFAULT_CONFIG} if it exists, else built-in defaults)",
    )
    parser.add_argument("--bind", help="endpoint to listen on, e.g. tcp://127.0.0.1:5570 (overrides [server] bind)")
    parser.add_argument("--spool-dir", help="folder for accepted jobs and results (overrides [server] spool_dir)")
    parser.add_argument("--ckpt", help="checkpoint folder or 'tiny' (overrides [worker] ckpt)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (overrides [worker] device)")
    parser.add_argument(
        "--devices",
        help="a pool: one warm worker per device, comma-separated, e.g. cuda:0,cuda:1 or cpu,cpu "
        "(overrides [worker] devices)",
    )
    parser.add_argument("--backend", choices=("local", "ray"), help="where workers run (overrides [worker] backend)")
    parser.add_argument("--ray-address", help="backend ray: auto, HOST:PORT or ray://HOST:10001 (overrides [worker] ray_address)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="how much the server logs to stderr")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    path = args.config
    if path is None and DEFAULT_CONFIG.is_file():
        path = DEFAULT_CONFIG
    flags = {
        "server.bind": args.bind,
        "server.spool_dir": args.spool_dir,
        "worker.ckpt": args.ckpt,
        "worker.device": args.device,
        "worker.devices": [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None,
        "worker.backend": args.backend,
        "worker.ray_address": args.ray_address,
    }
    config = load_server_config(path, {k: v for k, v in flags.items() if v is not None})
    server = Server(config)
    print(f"listening on {server.endpoint}", flush=True)
    server.serve_forever()
    return 0
