"""The wire between Isaac Sim and the generator: protocol, client, server, supervisor.

Importing `bridge` imports neither zmq nor torch; `contracts.settings` and the worker protocol are
plain Python so that both the Isaac side and the worldgen worker can use them.

Modules: `protocol` (the wire format, docs/protocol.md), `client` (Client, EpisodePayload, Job),
`server` (ROUTER front end and event loop), `supervisor` (the worker process), `spool` (accepted
jobs on disk), `fair_queue`, `worker_protocol` (the worker pipe), `security` (loopback rule,
CurveZMQ keys), `server_config` (config/server.toml); commands `serve_cli` (`lingbot-isaac
serve`), `keys` (`lingbot-isaac keys`) and `submit_cli` (`python -m bridge.submit_cli`).
"""
