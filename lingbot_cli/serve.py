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

from bridge.server.serve import serve
from bridge.server.server import ListenError
from bridge.server.server_config import ConfigError, ServerConfig, load_server_config
from bridge.server.spool import SpoolError
from bridge.wire.security import SecurityError
from contracts.checkpoint_layout import check_checkpoint
from contracts.connection import DEFAULT_ENDPOINT
from contracts.engine_options import (
    ATTENTION_HELP,
    ATTENTIONS,
    COMPUTE_CHOICES,
    DEVICE_HELP,
    DTYPES,
    FP8_HELP,
    MODELS,
    EngineOptions,
)
from contracts.errors import CheckpointError
from contracts.settings import SettingsError, load_settings

USER_ERRORS = (ConfigError, SecurityError, SpoolError, SettingsError, ListenError, CheckpointError)
DEFAULT_CONFIG = Path("config/server.toml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"server TOML (default: {DEFAULT_CONFIG} if it exists, else built-in defaults)",
    )
    parser.add_argument(
        "--bind",
        help=f"endpoint to listen on (default: [server] bind, else {DEFAULT_ENDPOINT}; overrides [server] bind)",
    )
    parser.add_argument("--spool-dir", help="folder for accepted jobs and results (overrides [server] spool_dir)")
    parser.add_argument(
        "--preset",
        help="[preset] of config/generation.toml under each job's settings (overrides [server] generation_preset)",
    )
    parser.add_argument("--ckpt", help="checkpoint folder or 'tiny' (overrides [worker] ckpt)")
    parser.add_argument("--device", help=f"{DEVICE_HELP} (overrides [worker] device)")
    parser.add_argument(
        "--devices",
        help="a pool: one warm worker per device, comma-separated, e.g. cuda:0,cuda:1 or cpu,cpu "
        "(overrides [worker] devices)",
    )
    engine = parser.add_argument_group("engine options (override [worker]; sent to each worker as data)")
    engine.add_argument(
        "--model",
        choices=MODELS,
        help="base (two experts), fast (LingBot-World-Fast, or a 2.0 causal-fast folder) or causal (a 2.0 "
        f"causal-pretrain folder) (overrides [worker] model; default: {EngineOptions.model})",
    )
    engine.add_argument(
        "--assets-dir",
        help="a LingBot-World 2.0 1.3B download's umT5, VAE and tokenizer: the 14B causal-fast folder (overrides "
        "[worker] assets_dir; default: beside --ckpt, or a sibling folder that has them)",
    )
    engine.add_argument(
        "--dtype", choices=DTYPES, help="compute dtype of the DiT and T5 (default: bf16 on CUDA, fp32 on CPU)"
    )
    engine.add_argument(
        "--compute",
        choices=COMPUTE_CHOICES,
        help="how the experts' matmuls run: exact (bf16 is its old name) = the reference's numerics in --dtype; "
        "fp8 = FP8 GEMMs; int8 = W8A8 GEMMs and 8-bit attention (GPUs without FP8: RTX 30xx, A100); auto = the "
        "card decides. " + FP8_HELP + " (default: exact; a job's own compute setting overrides it)",
    )
    engine.add_argument(
        "--gpus",
        metavar="I,J",
        help="one worker whose every rollout runs on two GPUs, e.g. 0,1: model base runs each step's two guidance "
        "passes at once, models fast and causal (live jobs too) split each chunk forward over both (exact: the same "
        "output as one GPU) (overrides [worker] gpus; replaces --device; not with a --devices pool)",
    )
    engine.add_argument("--attention", choices=ATTENTIONS, help=ATTENTION_HELP)
    engine.add_argument("--vram-budget", type=float, metavar="GB", help="GPU memory budget per worker (default: none)")
    engine.add_argument(
        "--t5-on-cpu", action="store_true", default=None, help="run umT5 on the CPU, streamed (no GPU memory)"
    )
    parser.add_argument("--backend", choices=("local", "ray"), help="where workers run (overrides [worker] backend)")
    parser.add_argument(
        "--ray-address", help="backend ray: auto, HOST:PORT or ray://HOST:10001 (overrides [worker] ray_address)"
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="how much the server logs to stderr",
    )


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
        "server.generation_preset": args.preset,
        "worker.ckpt": args.ckpt,
        "worker.device": args.device,
        "worker.devices": [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None,
        "worker.model": args.model,
        "worker.assets_dir": args.assets_dir,
        "worker.dtype": args.dtype,
        "worker.compute": args.compute,
        "worker.gpus": args.gpus,
        "worker.attention": args.attention,
        "worker.vram_budget_gb": args.vram_budget,
        "worker.t5_on_cpu": args.t5_on_cpu,
        "worker.backend": args.backend,
        "worker.ray_address": args.ray_address,
    }
    config = load_server_config(path, {k: v for k, v in flags.items() if v is not None})
    check_worker_checkpoint(config)
    if not config.security.curve:
        logging.getLogger("bridge.server.server").warning(
            "no CurveZMQ keys: clients are told apart only by their connection (or, over ipc://, their "
            "process), so one process can take several clients' share; a server shared by several users "
            "needs keys (lingbot-isaac keys; docs/protocol.md, Security)"
        )
    return serve(config)


def check_worker_checkpoint(config: ServerConfig) -> None:
    """The checkpoint layout of the model the workers load (`[worker] model`), read before the server
    binds: a typo'd or half-downloaded folder ends `serve` at once with the message `generate` prints,
    instead of a worker failing to start. The preset's model, where it is the other one and missing
    (a Fast-only folder under the default preset), is a warning: jobs that name the workers' model run.
    A custom worker command, or Ray workers (whose nodes hold the checkpoint), are not checked here."""
    worker = config.worker
    if worker.command or worker.backend != "local":
        return
    engine_model = worker.engine.model or "base"
    assets = worker.engine.assets_dir
    check_checkpoint(worker.engine.ckpt, engine_model, assets)  # the model the workers load: without it nothing runs
    preset = load_settings(config.generation_config, config.preset())
    if preset.model != engine_model:
        try:  # a folder with only the engine's model serves that model alone (worldgen.worker)
            check_checkpoint(worker.engine.ckpt, preset.model, assets)
        except CheckpointError as exc:
            logging.getLogger("bridge.server.server").warning(
                f"jobs that leave the model to the preset ({preset.model}) will fail: {exc}; jobs that ask for "
                f"model {engine_model} run (set model in each job's settings, or a preset with model = "
                f'"{engine_model}" as generation_preset)'
            )
