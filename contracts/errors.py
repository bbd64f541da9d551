"""Errors that mean "your input is wrong" (not "our code is wrong"): the CLI prints them briefly.

Defined here, in the bottom layer, because the rules that raise them are checked on both sides of
the wire: the engine (worldgen re-exports these as `worldgen.errors`) and the server's door
(`bridge`), which must not import worldgen.
"""


class InputError(ValueError):
    """Bad user input: the message names the file or field and how to fix it."""


class CheckpointError(InputError):
    """A checkpoint folder is missing, partial, or not one of the known layouts."""
