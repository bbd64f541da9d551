"""`lingbot-isaac replay EPISODE --live`: a recorded episode replayed as a live stream, for scripted
runs and tests of live mode (docs/protocol.md, "Live jobs").

The episode's first frame, prompt and intrinsics open a live job (model fast); its poses follow in
batches of LIVE_BATCH_POSES at the pace they were recorded (`--pace 1.0`: the episode's frame rate;
2.0 twice as fast; 0: as fast as the server takes them), as the window's Live button sends a
playing timeline's. Each chunk's lag is printed as it arrives (pose-to-pixels: from the server
holding the chunk's last pose to the chunk leaving it; and how many chunks the model is behind). The
result is an ordinary rollout beside the episode: `rollout.mp4` + `rollout.json` (provenance, with
the per-chunk timings under `live`), so `compare` reports on it.

Never imports torch: generation happens in the server.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from contracts.episode import ROLLOUT_VIDEO, read_episode, write_rollout
from contracts.settings import job_settings

LIVE_BATCH_POSES = 4  # poses per batch: one latent frame of the model (4 video frames)


class LiveReplayError(ValueError):
    """A live replay that cannot run as asked (names the flag and the fix)."""


def live_settings(episode, overrides: dict[str, Any]) -> dict[str, Any]:
    """The job's settings: the episode's, then the command line's; model fast, and frame_num (the
    planned length) at most the poses the episode has."""
    settings = job_settings(episode.meta.generation if episode.meta else None, overrides)
    if settings.get("model", "base") != "fast":
        raise LiveReplayError("--live streams poses to LingBot-World-Fast: add --model fast")
    settings["frame_num"] = min(int(settings.get("frame_num") or len(episode.poses)), len(episode.poses))
    return settings


def replay_live(
    server: str, episodes: list[Path], overrides: dict[str, Any], *, pace: float, timeout: float, overwrite: bool
) -> int:
    """Each episode as a live job, one after the other; 0 if every one got its rollout."""
    from bridge.client.client import Client
    from bridge.client.reach import check_listening

    if pace < 0:
        raise LiveReplayError(f"--pace {pace}: give 1.0 (the recorded pace), another factor, or 0 (no pacing)")
    todo = []
    for folder in episodes:  # every episode's settings are checked before anything is sent
        if (folder / ROLLOUT_VIDEO).is_file() and not overwrite:
            print(f"{folder}: already has {ROLLOUT_VIDEO}: skipped (--overwrite replays it again)", file=sys.stderr)
            continue
        episode = read_episode(folder)
        todo.append((folder, episode, live_settings(episode, overrides)))
    if not todo:
        return 0
    failed = 0
    check_listening(server)
    with Client(server, timeout=timeout) as client:
        for folder, episode, settings in todo:
            failed += not replay_one(client, folder, episode, settings, pace, timeout)
    return 1 if failed else 0


def replay_one(client, folder: Path, episode, settings: dict[str, Any], pace: float, timeout: float) -> bool:
    from bridge.client.client_errors import RequestFailed
    from bridge.client.job_events import Chunk, JobError
    from bridge.client.live_client import LiveJob

    count = settings["frame_num"]
    fps = float(episode.meta.fps) if episode.meta and episode.meta.fps else 16.0
    image = episode.image_path.read_bytes()

    def on_event(event) -> None:
        if isinstance(event, Chunk) and event.live:
            timing = event.live
            lag = timing.get("lag_s")
            print(f"{folder.name}: chunk {event.index + 1}/{event.total} ({event.frames} frames): "
                  f"lag {'?' if lag is None else f'{lag:.2f}'} s after its last pose, "
                  f"{timing.get('behind', 0)} chunk(s) behind", file=sys.stderr, flush=True)  # fmt: skip

    live = LiveJob.open(client, image, episode.prompt, episode.intrinsics[:1], settings, on_event=on_event,
                        name=folder.name)  # fmt: skip
    started = time.monotonic()
    try:
        for first in range(0, count, LIVE_BATCH_POSES):
            last = min(first + LIVE_BATCH_POSES, count)
            if pace > 0:  # the batch leaves when its last pose was recorded
                time.sleep(max(0.0, started + (last - 1) / (fps * pace) - time.monotonic()))
            live.send_poses(episode.poses[first:last], end=last == count, timeout=max(timeout, 600.0))
    except (RequestFailed, KeyboardInterrupt):
        live.cancel()
        raise
    outcome = live.job.wait(timeout=None)
    if isinstance(outcome, JobError):
        print(f"{folder}: the live job ended with {outcome.code}: {outcome.message}", file=sys.stderr)
        return False
    info = {"id": live.job.id, "mode": "live", "pace": pace, "busy_answers": live.busy_answers,
            "seconds": round(time.monotonic() - started, 3), "server_seconds": outcome.seconds,
            "provenance": outcome.provenance}  # fmt: skip
    print(write_rollout(folder, outcome.video, info), flush=True)
    return True
