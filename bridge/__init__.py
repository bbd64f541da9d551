"""The wire between Isaac Sim and the generator: protocol, client, server, supervisor.

Importing `bridge` imports neither zmq nor torch; `contracts.settings` and the worker protocol are
plain Python so that both the Isaac side and the worldgen worker can use them.

Modules: `protocol` (the wire format, docs/protocol.md).
Client side: `client` (Client: its public calls), `client_io` (its I/O thread: connection, Lazy
Pirate retries, heartbeats), `client_job` (Job), `job_events` (Progress, Chunk, Result, JobError),
`client_errors`, `episode_payload` (EpisodePayload: an episode packed for the wire), `follow`
(submit_and_follow), `submit` (submit_episode: one episode to an mp4), `live_client` (LiveJob: a live
job's pose batches; LiveChunks).
Server side: `server` (Server: socket, recovery, the event loop), `request_handling` (the answer to
each request), `job_lifecycle` (dispatch to workers, worker events), `result_streaming` (results
and events to subscribers), `storage_watch` (the spool's health), `eviction` (kept results as a
cache), `engine_rules` (the engine's rules at the door), `peer_process` (who shares a queue cap
without keys), `live_jobs` (live jobs: their pose feed on the spool, backpressure, the idle limit,
per-chunk timings), `serve` (serve(config)),
`server_config` (config/server.toml), `supervisor` (the worker process), `worker_pool`,
`ray_backend`, `spool` (accepted jobs on disk), `jobs`, `fair_queue`, `worker_protocol` (the worker
pipe), `security` (loopback rule, CurveZMQ keys). Their command lines (`serve`, `submit`, `keys`)
are in lingbot_cli.
"""
