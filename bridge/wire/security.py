"""Who may talk to the server: loopback only, unless CurveZMQ keys are configured.

A server bound to anything but loopback (or ipc://) must use CurveZMQ: traffic is encrypted and
only clients whose public key is in the allowlist folder (ZAP, `zmq.auth.ThreadAuthenticator`)
get through. Key files use ZeroMQ's certificate format (`zmq.auth.load_certificate` reads them);
secret files must be readable by their owner only, like ssh keys.

Key files are written here rather than with `zmq.auth.create_certificates` because that writes
the secret file with the process umask (often world-readable) and would need a chmod after the
fact; here the file is created 0600 from the start, and never overwritten.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from contracts.connection import DEFAULT_ENDPOINT


class SecurityError(ValueError):
    """An insecure or unusable security set-up: the message says how to fix it."""


def is_loopback(endpoint: str) -> bool:
    """True for tcp:// on 127.0.0.0/8, ::1 or localhost, and for ipc:// and inproc://."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp" or not rest:
        return False
    host = urlsplit(f"tcp://{rest}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name, a DNS name: may be reachable from outside


def check_bind_allowed(endpoint: str, curve: bool) -> None:
    if curve or is_loopback(endpoint):
        return
    raise SecurityError(
        f"refusing to listen on {endpoint} without CurveZMQ: anyone who can reach it could use the GPU. "
        f"Either bind a loopback address ({DEFAULT_ENDPOINT}, the default), or create keys with "
        "`lingbot-isaac keys server --dir keys` and `lingbot-isaac keys client NAME --dir keys "
        '--allow-dir keys/clients`, then set [security] server_secret_key = "keys/server.key_secret" '
        'and client_keys_dir = "keys/clients" in the server config'
    )


# ---------------------------------------------------------------------------------------------
# Key files


def write_keypair(directory: Path, name: str) -> tuple[Path, Path]:
    """Create NAME.key (public) and NAME.key_secret (0600) in `directory`; never overwrites."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    public_path, secret_path = directory / f"{name}.key", directory / f"{name}.key_secret"
    for path in (public_path, secret_path):
        if path.exists():
            raise SecurityError(f"{path} already exists; delete it first or choose another name")
    now = datetime.datetime.now().isoformat(timespec="seconds")
    _create(secret_path, _certificate(public, secret, f"ZeroMQ CURVE secret certificate, {now}"), 0o600)
    _create(public_path, _certificate(public, None, f"ZeroMQ CURVE public certificate, {now}"), 0o644)
    return public_path, secret_path


def allow_client(public_key_file: Path, allow_dir: Path) -> Path:
    """Copy a client's public key file into the server's allowlist folder."""
    public, _ = load_public(public_key_file)
    allow_dir = Path(allow_dir)
    allow_dir.mkdir(parents=True, exist_ok=True)
    target = allow_dir / Path(public_key_file).name
    if target.exists():
        raise SecurityError(f"{target} already exists")
    _create(target, _certificate(public, None, "allowed client"), 0o644)
    return target


def _certificate(public: bytes, secret: bytes | None, banner: str) -> bytes:
    lines = [f"#   {banner}", "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.insert(1, "#   DO NOT SHARE THIS FILE; keep it readable by its owner only (0600).")
        lines.append(f'    secret-key = "{secret.decode()}"')
    return ("\n".join(lines) + "\n").encode()


def _create(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)  # in case the umask removed bits we want (never adds group/other to secrets)
    finally:
        os.close(fd)


def load_public(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(os.fspath(path))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read key file {path}: {exc}") from None
    return public, secret


def load_secret(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a .key_secret file that only its owner can read."""
    path = Path(path)
    public, secret = load_public(path)
    if not secret:
        raise SecurityError(f"{path} holds no secret key (use the .key_secret file, not the .key one)")
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecurityError(
            f"secret key file {path} is accessible by other users (mode {stat.S_IMODE(mode):o}); run `chmod 600 {path}`"
        )
    return public, secret


# ---------------------------------------------------------------------------------------------
# Sockets


def secure_server_socket(
    context: zmq.Context, socket: zmq.Socket, secret_key_file: Path, client_keys_dir: Path
) -> ThreadAuthenticator:
    """Make `socket` a CurveZMQ server that admits only the public keys in `client_keys_dir`."""
    public, secret = load_secret(secret_key_file)
    client_keys_dir = Path(client_keys_dir)
    if not client_keys_dir.is_dir():
        raise SecurityError(f"client key folder {client_keys_dir} does not exist")
    if not any(client_keys_dir.glob("*.key")):
        raise SecurityError(
            f"client key folder {client_keys_dir} has no *.key files: no client could connect. "
            "Add one with `lingbot-isaac keys client NAME --allow-dir ...`"
        )
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=os.fspath(client_keys_dir))
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True
    return authenticator


def secure_client_socket(socket: zmq.Socket, server_public_key: bytes, client_secret: tuple[bytes, bytes]) -> None:
    public, secret = client_secret
    socket.curve_serverkey = server_public_key
    socket.curve_publickey = public
    socket.curve_secretkey = secret
