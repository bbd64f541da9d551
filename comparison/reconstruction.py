"""Whole-clip camera paths by structure-from-motion (pycolmap, COLMAP's Python bindings).

`reconstruct_paths(streams, intrinsics, config)` takes one or two videos of the same episode (the sim
frames and the rollout, in the same common frame) and returns, per seeded trial and per stream, the
camera-to-world pose of every frame COLMAP registered, in the reconstruction's own frame (arbitrary
position, orientation and scale). The camera-metrics code (`comparison.camera_metrics`) aligns them
to the commanded poses.

How, and why:
- The episode's intrinsics are known: every frame gets a PINHOLE camera with fx, fy, cx, cy scaled
  to the compared frame, and bundle adjustment keeps them fixed (COLMAP would otherwise re-estimate
  the focal length, and with it the scale of the motion).
- Matching is sequential: each frame against the next `overlap` frames of the same video, plus frame
  k of the sim against frame k of the rollout. Those cross pairs put both videos into one map, so the
  sim cameras (fitted to the commanded poses) give the map a metric scale and the rollout's motion
  can be read in metres: a clip reconstructed on its own comes out at an arbitrary size, and a fit
  of it to the command cannot tell a half-speed camera from a right one
  (/work/shared/docs/camera-metrics-notes.md measured that).
- Per trial, two maps are built from the same features and matches: the sim frames alone (the
  control: what the estimator gets wrong on perfect frames) and both videos together (the rollout).
  Without sim frames, the rollout alone. Trials differ only in the mapper's random seed.
- COLMAP runs in a child process (`python -m comparison.reconstruction WORKDIR`) with a time limit
  per episode: a run past the limit is killed and the trials finished by then are kept; a crash in
  the native code becomes a reason on the report, never a dead comparison.
- `mapper`: "global" (GLOMAP's, in COLMAP since 3.12, the default: the mapper of CamI2V's recipe, set
  for speed below), "incremental" (COLMAP's; the default before issue 54, a few times slower on the
  same numbers: docs/benchmarks.md, Session 27), or "auto": the incremental mapper, then the global one
  where frames that have verified matches stayed unregistered, keeping whichever registered more.
- Frames wider than `max_width` are shrunk before SfM (the intrinsics follow), and features and
  matches are computed once per episode and shared by every trial and map: trials rerun the mapper only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np

from comparison.trajectory import intrinsics_matrix

MAPPERS = ("incremental", "global", "auto")
SIM, ROLLOUT = "sim", "rollout"


@dataclass(frozen=True)
class ReconstructionConfig:
    """Settings of the whole-clip reconstruction (all reported with the results)."""

    trials: int = 3  # seeded mapper runs; the report gives their mean and spread
    seed: int = 0  # trial t uses seed + t
    mapper: str = "global"  # see MAPPERS; docs/benchmarks.md, Session 27, measured global against incremental
    overlap: int = 10  # each frame is matched with the next `overlap` frames of its video
    max_features: int = 4096  # SIFT features per frame
    # frames wider than this are shrunk (area averaging, aspect kept, the intrinsics scaled with them)
    # before SfM: at 416x240 SIFT costs a quarter of 832x480 and the numbers stayed within their bands
    max_width: int = 416
    # the incremental mapper's first pair needs this median triangulation angle (COLMAP: 16; where no
    # pair qualifies it searches them all again with half the inliers, then half the angle: from 8, a
    # 5-s clip of a walking camera took two vain searches of ~50 s each on 162 frames to reach 4)
    init_min_tri_angle_deg: float = 4.0
    # global bundle adjustment each time the model grew by this factor (COLMAP: 1.1; 1.4 is its setting
    # for video, where consecutive frames overlap)
    ba_global_ratio: float = 1.4
    # the global mapper keeps the longest tracks until every frame sees this many (COLMAP: all tracks);
    # positioning and bundle adjustment cost grows with the points, their accuracy hardly past a few hundred
    global_tracks_per_frame: int = 500
    global_ba_iterations: int = 1  # bundle adjustment + filtering rounds of the global mapper (COLMAP: 3)
    global_retriangulation: bool = False  # COLMAP: True (a second triangulation and bundle adjustment)
    timeout_s: float = 1800.0  # per episode, everything included; finished trials are kept
    min_registered_ratio: float = 0.5  # fewer registered frames than this: "not reconstructed"
    threads: int = -1  # COLMAP's threads (-1: all cores)

    def __post_init__(self) -> None:
        if self.mapper not in MAPPERS:
            raise ValueError(f"mapper {self.mapper!r}: choose one of {', '.join(MAPPERS)}")
        if self.trials < 1:
            raise ValueError(f"trials {self.trials}: at least 1")
        if self.overlap < 1:
            raise ValueError(f"overlap {self.overlap}: at least 1")
        if self.max_width < 64:
            raise ValueError(f"max_width {self.max_width}: at least 64 pixels")
        if self.global_tracks_per_frame < 1 or self.global_ba_iterations < 1:
            raise ValueError("global_tracks_per_frame and global_ba_iterations: at least 1")


@dataclass
class StreamMatching:
    """What matching found within one video: the reason a video that registers nothing failed."""

    frames: int
    matched_pairs: int  # pairs of this video's frames that were matched
    verified_pairs: int  # of those, pairs that passed geometric verification (enough inliers)


@dataclass
class RegisteredPoses:
    """The frames of one video that one map registered (the map's largest model for that video)."""

    model: int  # which of the map's models: two videos are in one frame only if this agrees
    poses: dict[int, np.ndarray]  # frame index -> camera-to-world [4, 4], in the model's frame


@dataclass
class ReconstructionRun:
    """Every trial's registered poses and what it cost."""

    config: ReconstructionConfig
    frame_size: tuple[int, int]  # (height, width)
    matching: dict[str, StreamMatching]
    # trials[t][map name][stream] = RegisteredPoses (a video absent: nothing registered); map names: "control" (sim alone),
    # "joint" (sim + rollout) or "rollout" (rollout alone, without sim frames)
    trials: list[dict[str, dict[str, RegisteredPoses]]] = field(default_factory=list)
    mapper_used: list[dict[str, str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    error: str | None = None  # the child process failed: why

    def to_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "frame_size": list(self.frame_size),
            "matching": {name: asdict(m) for name, m in self.matching.items()},
            "trials_finished": len(self.trials),
            "mapper_used": self.mapper_used,
            "seconds": self.seconds,
            "timed_out": self.timed_out,
            "error": self.error,
        }


def pycolmap_version() -> str | None:
    try:
        import pycolmap
    except ImportError:
        return None
    return str(pycolmap.__version__)


def _image_name(stream: str, k: int) -> str:
    return f"{stream}/{k:05d}.png"


def reconstruct_paths(
    streams: dict[str, np.ndarray], intrinsics: np.ndarray, config: ReconstructionConfig | None = None
) -> ReconstructionRun:
    """Reconstruct the camera path of each video in `streams` ({"sim": frames, "rollout": frames},
    either may be missing; uint8 [F, H, W, 3] RGB, all in one frame size). `intrinsics` [>=F, 4]
    fx, fy, cx, cy in the 480 x 832 convention (scaled here to the frames)."""
    config = config or ReconstructionConfig()
    if not streams:
        raise ValueError("nothing to reconstruct: no video given")
    sizes = {tuple(frames.shape[1:3]) for frames in streams.values()}
    if len(sizes) != 1:
        raise ValueError(f"the videos must share one frame size, got {sorted(sizes)}")
    height, width = sizes.pop()
    if width > config.max_width:  # SfM at a smaller size: the intrinsics follow the frames (intrinsics_matrix)
        height, width = round(height * config.max_width / width), config.max_width
        streams = {name: _shrink(frames, height, width) for name, frames in streams.items()}
    count = max(len(frames) for frames in streams.values())
    if len(intrinsics) < count:
        raise ValueError(f"{count} frames but only {len(intrinsics)} intrinsics rows")
    with tempfile.TemporaryDirectory(prefix="lingbot-sfm-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        images = []
        for stream, frames in streams.items():
            (work / "images" / stream).mkdir(parents=True)
            for k, frame in enumerate(frames):
                K = intrinsics_matrix(intrinsics[k], height, width)
                name = _image_name(stream, k)
                cv2.imwrite(str(work / "images" / name), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR),
                            [cv2.IMWRITE_PNG_COMPRESSION, 1])  # fmt: skip
                images.append({"name": name, "stream": stream, "k": k,
                               "params": [K[0, 0], K[1, 1], K[0, 2], K[1, 2]]})  # fmt: skip
        job = {"config": asdict(config), "images": images, "streams": list(streams)}
        (work / "job.json").write_text(json.dumps(job))
        write_s = time.perf_counter() - started
        run = ReconstructionRun(config=config, frame_size=(height, width), matching={})
        try:
            completed = subprocess.run(
                [sys.executable, "-m", "comparison.reconstruction", str(work)],
                capture_output=True,
                text=True,
                timeout=config.timeout_s,
                check=False,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            if completed.returncode != 0:
                tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
                run.error = f"COLMAP's process exited with status {completed.returncode}: {' | '.join(tail)}"
        except subprocess.TimeoutExpired:
            run.timed_out = True
        _collect(work, run)
        run.seconds = {"write_frames_s": write_s, **run.seconds, "total_s": time.perf_counter() - started}
    return run


def _shrink(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.stack([cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA) for frame in frames])


def _collect(work: Path, run: ReconstructionRun) -> None:
    """Read what the child wrote (matching stats, then one file per finished trial)."""
    stats = work / "matching.json"
    if stats.is_file():
        data = json.loads(stats.read_text())
        run.matching = {name: StreamMatching(**m) for name, m in data["matching"].items()}
        run.seconds.update(data["seconds"])
    t = 0
    while (path := work / f"trial_{t}.json").is_file():
        data = json.loads(path.read_text())
        run.trials.append(
            {
                name: {
                    stream: RegisteredPoses(found["model"], {int(k): np.asarray(v) for k, v in found["poses"].items()})
                    for stream, found in model.items()
                }
                for name, model in data["maps"].items()
            }
        )
        run.mapper_used.append(data["mapper_used"])
        run.seconds[f"trial_{t}_s"] = data["seconds"]
        run.seconds.update({f"trial_{t}_{name}_map_s": s for name, s in data["map_seconds"].items()})
        t += 1


# ---------------------------------------------------------------- the child process (imports pycolmap)


def _pairs(images: list[dict], streams: list[str], overlap: int) -> list[tuple[str, str]]:
    by_stream = {s: [im["name"] for im in images if im["stream"] == s] for s in streams}
    pairs = []
    for names in by_stream.values():
        for i, name in enumerate(names):
            pairs += [(name, other) for other in names[i + 1 : i + 1 + overlap]]
            # and frames 2^j apart beyond that (COLMAP's "quadratic overlap"): the wide baselines the
            # mapper needs to start where neighbouring frames of a slow camera hardly move
            pairs += [(name, names[i + 2**j]) for j in range(overlap.bit_length(), 31)
                      if 2**j > overlap and i + 2**j < len(names)]  # fmt: skip
    if SIM in by_stream and ROLLOUT in by_stream:
        pairs += list(zip(by_stream[SIM], by_stream[ROLLOUT], strict=False))  # frame k with frame k
    return pairs


def _matching_stats(database: Path, images: list[dict], streams: list[str]) -> dict[str, dict]:
    import pycolmap

    with pycolmap.Database.open(str(database)) as db:
        stream_of = {db.read_image_with_name(im["name"]).image_id: im["stream"] for im in images}
        verified = {}
        for pair_id, geometry in zip(*db.read_two_view_geometries(), strict=True):
            verified[pair_id] = len(geometry.inlier_matches)
        matched = db.read_all_matches()[0]
    out = {s: {"frames": sum(im["stream"] == s for im in images), "matched_pairs": 0, "verified_pairs": 0}
           for s in streams}  # fmt: skip
    for pair_id in matched:
        a, b = pycolmap.pair_id_to_image_pair(pair_id)
        if stream_of[a] == stream_of[b]:
            out[stream_of[a]]["matched_pairs"] += 1
            out[stream_of[a]]["verified_pairs"] += int(verified.get(pair_id, 0) >= 15)
    return out


def _map(database: Path, image_dir: Path, names: list[str], mapper: str, seed: int, config: dict, out: Path):
    import pycolmap

    out.mkdir(parents=True, exist_ok=True)
    if mapper == "incremental":
        options = pycolmap.IncrementalPipelineOptions()
        options.image_names = names
        options.random_seed = seed
        options.num_threads = config["threads"]
        options.min_model_size = 3
        options.ba_refine_focal_length = False  # the intrinsics are known: keep them
        options.ba_refine_principal_point = False
        options.ba_refine_extra_params = False
        options.mapper.init_min_tri_angle = config["init_min_tri_angle_deg"]
        options.ba_global_frames_ratio = options.ba_global_points_ratio = config["ba_global_ratio"]
        return pycolmap.incremental_mapping(database, image_dir, out, options)
    options = pycolmap.GlobalPipelineOptions()
    options.image_names = names
    options.random_seed = seed
    options.num_threads = config["threads"]
    options.min_model_size = 3
    options.mapper.bundle_adjustment.refine_focal_length = False
    options.mapper.bundle_adjustment.refine_principal_point = False
    options.mapper.bundle_adjustment.refine_extra_params = False
    options.mapper.track_required_tracks_per_view = config["global_tracks_per_frame"]
    options.mapper.ba_num_iterations = config["global_ba_iterations"]
    options.mapper.skip_retriangulation = not config["global_retriangulation"]
    return pycolmap.global_mapping(database, image_dir, out, options)


def _poses_by_stream(models: dict, images: list[dict], streams: list[str]) -> dict[str, dict[str, list]]:
    """Per stream, the poses of the model that registered most of that stream's frames (the
    sim's anchor only works when the rollout sits in the same model: a caller checks that by
    the model index kept beside the poses)."""
    where = {im["name"]: (im["stream"], im["k"]) for im in images}
    out: dict[str, dict[str, list]] = {}
    best: dict[str, int] = {}
    for index, model in models.items():
        per_stream: dict[str, dict[str, list]] = {s: {} for s in streams}
        for image in model.images.values():
            if image.name in where and image.has_pose:
                stream, k = where[image.name]
                w2c = np.eye(4)
                w2c[:3, :] = image.cam_from_world().matrix()
                per_stream[stream][str(k)] = np.linalg.inv(w2c).tolist()
        for stream, poses in per_stream.items():
            if len(poses) > best.get(stream, 0):
                best[stream] = len(poses)
                out[stream] = {"model": int(index), "poses": poses}
    return out


def _child(work: Path) -> None:
    import pycolmap

    job = json.loads((work / "job.json").read_text())
    config, images, streams = job["config"], job["images"], job["streams"]
    database, image_dir = work / "database.db", work / "images"
    tick = time.perf_counter()
    reader = pycolmap.ImageReaderOptions()
    reader.camera_model = "PINHOLE"
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.sift.max_num_features = config["max_features"]
    extraction.num_threads = config["threads"]
    pycolmap.extract_features(database, image_dir, image_names=[im["name"] for im in images],
                              camera_mode=pycolmap.CameraMode.PER_IMAGE, reader_options=reader,
                              extraction_options=extraction, device=pycolmap.Device.cpu)  # fmt: skip
    with pycolmap.Database.open(str(database)) as db:  # the known intrinsics, frame by frame
        for im in images:
            camera = db.read_camera(db.read_image_with_name(im["name"]).camera_id)
            camera.params = im["params"]
            camera.has_prior_focal_length = True
            db.update_camera(camera)
    features_s = time.perf_counter() - tick
    tick = time.perf_counter()
    pair_file = work / "pairs.txt"
    pair_file.write_text("".join(f"{a} {b}\n" for a, b in _pairs(images, streams, config["overlap"])))
    pairing = pycolmap.ImportedPairingOptions()
    pairing.match_list_path = pair_file
    matching = pycolmap.FeatureMatchingOptions()
    matching.num_threads = config["threads"]
    verification = pycolmap.TwoViewGeometryOptions()
    # COLMAP drops pairs whose matches sit at the same pixels in both frames as a burnt-in watermark;
    # here that is a rollout frame identical to its sim frame (a perfect model), which must stay
    verification.detect_watermark = False
    pycolmap.match_image_pairs(database, matching_options=matching, pairing_options=pairing,
                               verification_options=verification, device=pycolmap.Device.cpu)  # fmt: skip
    stats = _matching_stats(database, images, streams)
    seconds = {"features_s": features_s, "matching_s": time.perf_counter() - tick}
    (work / "matching.json").write_text(json.dumps({"matching": stats, "seconds": seconds}))

    names = {s: [im["name"] for im in images if im["stream"] == s] for s in streams}
    maps = {"control": names[SIM], "joint": names[SIM] + names[ROLLOUT]} if SIM in streams and ROLLOUT in streams \
        else {"control" if SIM in streams else "rollout": names[streams[0]]}  # fmt: skip
    if ROLLOUT in streams and stats[ROLLOUT]["verified_pairs"] == 0:
        # no two rollout frames share a rigid scene (noise): no map can register it, skip the work
        maps = {name: names_ for name, names_ in maps.items() if name == "control"}
    for t in range(config["trials"]):
        tick = time.perf_counter()
        seed = config["seed"] + t
        result, used, map_seconds = {}, {}, {}
        for map_name, map_names in maps.items():
            map_tick = time.perf_counter()
            mapper = "incremental" if config["mapper"] == "auto" else config["mapper"]
            models = _map(database, image_dir, map_names, mapper, seed, config, work / f"sfm_{t}_{map_name}")
            poses = _poses_by_stream(models, images, streams)
            if config["mapper"] == "auto" and _incomplete(poses, stats, names, map_name, maps):
                models = _map(database, image_dir, map_names, "global", seed, config, work / f"glo_{t}_{map_name}")
                other = _poses_by_stream(models, images, streams)
                if _registered(other) > _registered(poses):
                    poses, mapper = other, "global"
            result[map_name], used[map_name] = poses, mapper
            map_seconds[map_name] = time.perf_counter() - map_tick
        trial = {"maps": result, "mapper_used": used, "seconds": time.perf_counter() - tick, "map_seconds": map_seconds}
        (work / f"trial_{t}.json.tmp").write_text(json.dumps(trial))
        (work / f"trial_{t}.json.tmp").rename(work / f"trial_{t}.json")


def _registered(poses: dict[str, dict]) -> int:
    return sum(len(p["poses"]) for p in poses.values())


def _incomplete(poses: dict, stats: dict, names: dict, map_name: str, maps: dict) -> bool:
    """Frames of a video in this map stayed unregistered although that video has verified pairs."""
    in_map = {im.split("/")[0] for im in maps[map_name]}
    return any(
        stats[s]["verified_pairs"] > 0 and len(poses.get(s, {"poses": {}})["poses"]) < len(names[s]) for s in in_map
    )


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
