"""The generation server: its socket, its door, its spool and its jobs; it runs the workers."""
