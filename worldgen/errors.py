"""Errors that mean "your input is wrong" (not "our code is wrong"): the CLI prints them briefly.

Their one home is `contracts.errors` (the server's door raises them too); worldgen code imports them
from here.
"""

from contracts.errors import CheckpointError, InputError

__all__ = ["CheckpointError", "InputError"]
