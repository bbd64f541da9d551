"""Whole-clip camera fidelity of one episode: reconstruct, align, measure, over seeded trials.

`evaluate_reconstruction(sim, rollout, poses, intrinsics, config)` reconstructs both videos with
`comparison.reconstruction` and measures them with `comparison.camera_metrics`:

- **control** (the sim frames alone, their own map): RotErr, TransErr, CamMC, APE, RPE after the
  Sim(3) fit to the commanded poses: what the estimator gets wrong on perfect frames;
- **rollout** (the rollout in one map with the sim frames): the same metrics after the rollout's own
  Sim(3) fit (the shape of its path), and, *anchored* in metres by the sim cameras' fit in that map,
  the distance of every rollout camera from its commanded position and the scale of the commanded
  path onto the rollout's (1: moved as far as commanded; 0.5: half as far). A Sim(3) fit of the
  rollout alone absorbs a wrong size and even a mirrored path; the anchored numbers do not.

A video is "reconstructed" in a trial when at least `min_registered_ratio` of its frames registered;
otherwise it gets the reason (noise: no pair of frames passed geometric verification) and no
number. Across trials each number is given as mean, standard deviation, min and max, and the per-frame
curves as the mean over the trials that reconstructed. Without pycolmap the section says so and the
report keeps the pairwise estimator (`comparison.trajectory`) as its only camera numbers.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from comparison.camera_metrics import TRANSLATION_EPS, anchored_errors, fit_similarity, path_errors
from comparison.reconstruction import ROLLOUT, SIM, ReconstructionConfig, ReconstructionRun, RegisteredPoses

METHOD = (
    "pycolmap whole-clip reconstruction (known intrinsics, sequential matching), Sim(3) fit of the camera "
    "centres to the commanded poses"
)
# the per-trial numbers summarised across trials, in report order
SUMMARY_KEYS = (
    "registered_ratio",
    "rot_err_deg",
    "rot_err_deg_per_frame",
    "trans_err",
    "trans_err_per_frame",
    "cam_mc",
    "cam_mc_per_frame",
    "ape_rmse",
    "rpe_translation_rmse",
    "rpe_rotation_deg_mean",
    "scale_vs_command",
    "anchored_trans_err",
    "anchored_trans_err_per_frame",
)


def _spread(values: list[float | None]) -> dict[str, Any] | None:
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    array = np.asarray(finite)
    return {
        "mean": float(array.mean()),
        "std": float(array.std()),
        "min": float(array.min()),
        "max": float(array.max()),
        "trials": len(finite),
    }


def _not_reconstructed_reason(run: ReconstructionRun, stream: str, registered: int, frames: int) -> str:
    matching = run.matching.get(stream)
    if matching is not None and matching.verified_pairs == 0:
        found = (
            "no two frames share enough matching features"
            if matching.matched_pairs == 0
            else f"{matching.matched_pairs} pairs had matches, none a consistent two-view geometry"
        )
        return (
            f"no pair of frames passed geometric verification ({found}): the frames do not show one rigid scene "
            "(noise looks like this)"
        )
    if registered == 0 and matching is not None and matching.verified_pairs > 0:
        return (
            f"0 of {frames} frames registered although {matching.verified_pairs} of {matching.matched_pairs} pairs "
            "verified: the mapper found no first pair of frames with enough parallax (a slow or purely turning camera)"
        )
    return (
        f"only {registered} of {frames} frames registered (below {run.config.min_registered_ratio:.0%}); "
        f"{'' if matching is None else f'{matching.verified_pairs} of {matching.matched_pairs} pairs verified'}"
    ).rstrip("; ")


def _trial_numbers(
    found: RegisteredPoses | None, poses: np.ndarray, frames: int, run: ReconstructionRun, stream: str
) -> dict[str, Any]:
    registered = sorted(k for k in (found.poses if found else {}) if k < frames)
    ratio = len(registered) / frames if frames else 0.0
    trial: dict[str, Any] = {"registered": len(registered), "registered_ratio": ratio}
    if ratio < run.config.min_registered_ratio or len(registered) < 3:
        return {**trial, "status": "not reconstructed",
                "reason": _not_reconstructed_reason(run, stream, len(registered), frames)}  # fmt: skip
    estimated = np.stack([found.poses[k] for k in registered])
    errors = path_errors(estimated, poses[registered], registered)
    return {**trial, "status": "reconstructed", "reason": None, "errors": errors.to_dict()}


def _anchor(joint: dict[str, RegisteredPoses], poses: np.ndarray, rollout_trial: dict, frames: int) -> dict:
    """The rollout read in metres through the fit of the sim cameras of the same map."""
    sim, rollout = joint.get(SIM), joint.get(ROLLOUT)
    if sim is None or rollout is None or sim.model != rollout.model:
        return {"reason": "the rollout's frames did not join the sim frames' map (no sim frame matched them)"}
    sim_frames = sorted(k for k in sim.poses if k < frames)
    if len(sim_frames) < 3:
        return {"reason": f"only {len(sim_frames)} sim frames registered in the joint map"}
    commanded = poses[:frames, :3, 3]
    if np.linalg.norm(commanded - commanded[0], axis=1).max() < TRANSLATION_EPS:
        return {"reason": "the commanded camera does not translate: there is no scale to compare"}
    fit = fit_similarity(np.stack([sim.poses[k][:3, 3] for k in sim_frames]), commanded[sim_frames])
    if fit is None:
        return {"reason": "the sim cameras' centres do not spread: no metric fit"}
    frames_r = rollout_trial["errors"]["frames"]
    anchored = fit.apply_poses(np.stack([rollout.poses[k] for k in frames_r]))
    distances, total, scale = anchored_errors(anchored, poses[frames_r])
    return {
        "reason": None,
        "sim_frames_in_map": len(sim_frames),
        "distances": distances,
        "anchored_trans_err": total,
        "anchored_trans_err_per_frame": total / len(frames_r),
        "scale_vs_command": scale,
    }


def _summarise(trials: list[dict], frames: int) -> dict[str, Any]:
    done = [t for t in trials if t["status"] == "reconstructed"]
    out: dict[str, Any] = {"trials": trials, "trials_reconstructed": len(done), "frames": frames}
    if not done:
        reasons = [t["reason"] for t in trials if t.get("reason")]
        out.update(status="not reconstructed", reason=reasons[0] if reasons else "no trial finished", summary={})
        return out

    def value(trial: dict, key: str) -> float | None:
        if key == "registered_ratio":
            return trial[key]
        if key in trial["errors"]:
            return trial["errors"][key]
        return (trial.get("anchored") or {}).get(key)

    out.update(status="reconstructed", reason=None)
    out["summary"] = {key: _spread([value(t, key) for t in done]) for key in SUMMARY_KEYS}
    curves: dict[str, list[float | None]] = {}
    for name, source in (("rotation_error_deg", "rotation_errors_deg"), ("translation_error", "translation_errors")):
        curves[name] = _mean_curve([(t["errors"]["frames"], t["errors"][source]) for t in done], frames)
    curves["anchored_translation_error"] = _mean_curve(
        [
            (t["errors"]["frames"], t["anchored"]["distances"])
            for t in done
            if (t.get("anchored") or {}).get("distances")
        ],
        frames,
    )
    out["per_frame"] = curves
    return out


def _mean_curve(series: list[tuple[list[int], list[float] | None]], frames: int) -> list[float | None]:
    sums, counts = np.zeros(frames), np.zeros(frames)
    for ks, values in series:
        if values is None:
            continue
        for k, v in zip(ks, values, strict=True):
            sums[k] += v
            counts[k] += 1
    return [float(s / c) if c else None for s, c in zip(sums, counts, strict=True)]


def skipped(reason: str, with_sim: bool) -> dict[str, Any]:
    """The whole-clip section when it did not run (switched off, or pycolmap missing)."""
    section = {"status": "not reconstructed", "reason": reason, "summary": {}, "trials": []}
    return {"method": METHOD, "pycolmap": None, "config": None, "run": None, "status": "unavailable",
            "reason": reason, "control": section if with_sim else None, "rollout": section, "notes": [],
            "seconds": 0.0}  # fmt: skip


def headline(section: dict[str, Any] | None) -> dict[str, Any]:
    """The trial means of one video's section, flat ({} when not reconstructed), for table rows."""
    if not section or section["status"] != "reconstructed":
        return {}
    return {key: (spread or {}).get("mean") for key, spread in section["summary"].items()}


def evaluate_reconstruction(
    sim: np.ndarray | None,
    rollout: np.ndarray,
    poses: np.ndarray,
    intrinsics: np.ndarray,
    config: ReconstructionConfig | None = None,
) -> dict[str, Any]:
    """The whole-clip section of a report: {"status", "control", "rollout", "run", ...} (JSON-ready)."""
    from comparison.reconstruction import pycolmap_version, reconstruct_paths

    config = config or ReconstructionConfig()
    started = time.perf_counter()
    base: dict[str, Any] = {"method": METHOD, "pycolmap": pycolmap_version(), "config": None, "run": None}
    if base["pycolmap"] is None:
        return skipped("pycolmap is not installed (pip install 'lingbot-isaac[compare]'): pairwise estimator only",
                       sim is not None)  # fmt: skip
    count = len(rollout)
    streams = {SIM: sim[:count], ROLLOUT: rollout} if sim is not None else {ROLLOUT: rollout}
    run = reconstruct_paths(streams, intrinsics, config)
    base.update(config=run.to_dict()["config"], run=run.to_dict())
    return {**base, **read_run(run, poses, count, with_sim=sim is not None), "seconds": time.perf_counter() - started}


def read_run(run: ReconstructionRun, poses: np.ndarray, count: int, with_sim: bool) -> dict[str, Any]:
    """A finished (or timed-out) reconstruction's trials against the commanded `poses` of its `count` frames:
    {"status", "reason", "control", "rollout", "notes"}; trials a time limit cut off are said in the notes."""
    config = run.config
    control_trials, rollout_trials = [], []
    for t, maps in enumerate(run.trials):
        seed = config.seed + t
        if with_sim:
            trial = _trial_numbers(maps.get("control", {}).get(SIM), poses, count, run, SIM)
            control_trials.append({"seed": seed, **trial})
        joint = maps.get("joint") or maps.get("rollout") or {}
        trial = {"seed": seed, **_trial_numbers(joint.get(ROLLOUT), poses, count, run, ROLLOUT)}
        if trial["status"] == "reconstructed":
            trial["anchored"] = (
                _anchor(joint, poses, trial, count)
                if with_sim
                else {"reason": "no sim frames to anchor the scale: a clip reconstructed alone has an arbitrary size"}
            )
        rollout_trials.append(trial)
    run_reason = run.error or (
        f"the reconstruction ran past its time limit ({config.timeout_s:g} s) before a trial finished"
        if run.timed_out and not run.trials
        else None
    )
    sections = {}
    for name, trials in (("control", control_trials), ("rollout", rollout_trials)):
        if name == "control" and not with_sim:
            sections[name] = None
            continue
        section = _summarise(trials, count)
        if not trials and run_reason:
            section["reason"] = run_reason
        sections[name] = section
    notes = []
    if run.timed_out and run.trials:
        notes.append(
            f"time limit ({config.timeout_s:g} s) reached: {len(run.trials)} of {config.trials} trials finished"
        )
    return {
        "status": sections["rollout"]["status"],
        "reason": sections["rollout"]["reason"],
        "control": sections["control"],
        "rollout": sections["rollout"],
        "notes": notes,
    }
