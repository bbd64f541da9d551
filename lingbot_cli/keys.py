"""`lingbot-isaac keys`: create CurveZMQ key pairs for a server that listens beyond loopback.

    lingbot-isaac keys server --dir keys                          keys/server.key, keys/server.key_secret
    lingbot-isaac keys client isaac-1 --dir keys --allow-dir keys/clients
    lingbot-isaac keys allow other-machine.key --allow-dir keys/clients

Secret files (`*.key_secret`) are created readable by their owner only (0600) and never
overwritten. Give the server its secret file and the folder of allowed client public keys
([security] in config/server.toml); give each client its own secret file and the server's public
`server.key`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.wire.security import SecurityError, allow_client, write_keypair

USER_ERRORS = (SecurityError,)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="role", required=True, help="what to make")
    kind = {"formatter_class": parser.formatter_class}  # the same help layout: defaults said once
    server = sub.add_parser("server", help="the server's key pair", **kind)
    server.add_argument("--dir", type=Path, default=Path("keys"), help="folder for the key files")
    server.add_argument("--name", default="server", help="file name stem")
    client = sub.add_parser("client", help="a client's key pair", **kind)
    client.add_argument("name", help="file name stem, e.g. the machine's name")
    client.add_argument("--dir", type=Path, default=Path("keys"), help="folder for the key files")
    client.add_argument("--allow-dir", type=Path, help="also put its public key in this server allowlist folder")
    allow = sub.add_parser("allow", help="add a client's public key file to a server allowlist folder", **kind)
    allow.add_argument("public_key", type=Path, help="the client's NAME.key file")
    allow.add_argument("--allow-dir", type=Path, required=True, help="the server's client_keys_dir")


def run(args: argparse.Namespace) -> int:
    if args.role == "allow":
        print(f"allowed: {allow_client(args.public_key, args.allow_dir)}")
        return 0
    name = args.name
    public, secret = write_keypair(args.dir, name)
    print(f"public key: {public}\nsecret key: {secret} (mode 600: keep it private)")
    if args.role == "client" and args.allow_dir:
        print(f"allowed:    {allow_client(public, args.allow_dir)}")
    return 0
