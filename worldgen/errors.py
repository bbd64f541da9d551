"""Errors that mean "your input is wrong" (not "our code is wrong"): the CLI prints them briefly."""


class InputError(ValueError):
    """Bad user input: the message names the file or field and how to fix it."""


class CheckpointError(InputError):
    """A checkpoint folder is missing, partial, or not one of the known layouts."""
