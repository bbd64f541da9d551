"""The generation processes behind the server: local worker processes or Ray actors, and their pipe."""
