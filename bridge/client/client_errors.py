"""The client's errors: what a call to the server or a job can end with."""

from __future__ import annotations

from contracts.episode import EpisodeError


class BridgeError(Exception):
    """Base of the client's errors."""


class ServerUnavailable(BridgeError, TimeoutError):
    """No answer from the server within the timeout, after the retries."""


class Unauthorized(BridgeError):
    """The server refused this client's CurveZMQ key, or the security set-ups do not match."""


class RequestFailed(BridgeError):
    """The server answered a request with an error (busy, bad_input, not_found, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class JobFailed(BridgeError):
    """A job ended without a video: failed, cancelled, or the server became unreachable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class PayloadError(EpisodeError):
    """An episode that cannot be sent: the message names the file or field."""
