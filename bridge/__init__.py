"""The wire between Isaac Sim and the generator, in four rooms (docs/architecture.md).

- `bridge.wire`: what both sides share: the message formats (`protocol`, docs/protocol.md;
  `live_protocol`) and the socket security both ends set up (`security`: loopback rule, CurveZMQ keys).
- `bridge.client`: the Isaac side's calls: `client` (Client), `client_io` (its I/O thread: Lazy Pirate
  retries, heartbeats), `client_job` (Job), `job_events`, `client_errors`, `episode_payload`, `follow`
  (submit_and_follow), `submit` (submit_episode: one episode to an mp4), `live_client` (LiveJob), `reach`.
- `bridge.server`: the server: `server` (socket, recovery, the event loop), `request_handling` (the door),
  `job_lifecycle`, `result_streaming`, `live_jobs`, `spool`, `jobs`, `fair_queue`, `eviction`,
  `storage_watch`, `engine_rules`, `peer_process`, `mp4`, `server_config` (config/server.toml), `serve`.
- `bridge.workers`: the generation processes the server runs: `supervisor` (one worker process),
  `worker_pool`, `ray_backend`, `worker_config` ([worker]), `worker_protocol` (the worker pipe, which the
  worldgen worker speaks).

The client never imports the server or the workers; the wire imports neither (pyproject.toml's
import-linter contracts). Importing `bridge` imports neither zmq nor torch. Command lines (`serve`,
`submit`, `keys`) are in lingbot_cli.
"""
