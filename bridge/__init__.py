"""The wire between Isaac Sim and the generator: protocol, client, server, supervisor.

Importing `bridge` imports neither zmq nor torch; `bridge.settings` and the worker protocol are
plain Python so that both the Isaac side and the worldgen worker can use them.
"""
