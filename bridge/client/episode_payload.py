"""What a submit carries (the episode packed for the wire) and the settings sent with it."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from bridge.client.client_errors import PayloadError
from bridge.wire.protocol import Limits
from contracts import episode
from contracts.episode import EpisodeError
from contracts.settings import GenerationSettings


@dataclasses.dataclass
class EpisodePayload:
    """What a submit carries: the first image, camera poses, intrinsics and the prompt."""

    image: bytes  # JPEG or PNG bytes
    poses: np.ndarray  # [N, 4, 4] camera-to-world, OpenCV axes
    intrinsics: np.ndarray  # [N, 4] fx, fy, cx, cy (LingBot's 480x832 convention)
    prompt: str
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.image, (bytes, bytearray)):
            raise PayloadError("image must be the bytes of a JPEG or PNG file")
        self.image = bytes(self.image)
        try:
            episode.image_format(self.image)
            # the one episode validator (the format's rules; how many poses a rollout needs is
            # the engine's to say, so a short episode comes back from it as bad_input)
            poses, intrinsics = episode.check_action(self.poses, self.intrinsics)
            self.prompt = episode.check_prompt(self.prompt, "prompt (prompt.txt)")
        except EpisodeError as exc:
            raise PayloadError(str(exc)) from None
        # float32 on the wire unless the caller's arrays were float64
        self.poses = poses.astype(np.float64 if np.asarray(self.poses).dtype == np.float64 else np.float32)
        self.intrinsics = intrinsics.astype(
            np.float64 if np.asarray(self.intrinsics).dtype == np.float64 else np.float32
        )

    @classmethod
    def from_dir(cls, episode_dir: str | os.PathLike) -> EpisodePayload:
        """Read an episode folder with the one episode reader (`contracts.episode.read_episode`);
        `episode.json` and anything else is not sent."""
        try:
            read = episode.read_episode(episode_dir)
        except EpisodeError as exc:
            raise PayloadError(str(exc)) from None
        return cls(read.image_path.read_bytes(), read.poses, read.intrinsics, read.prompt, name=read.path.name)

    def check_limits(self, limits: Limits) -> None:
        if len(self.image) > limits.max_image_bytes:
            raise PayloadError(f"image is {len(self.image)} bytes; the server takes at most {limits.max_image_bytes}")
        for name, array in (("poses", self.poses), ("intrinsics", self.intrinsics)):
            if len(array) > limits.max_poses:
                raise PayloadError(f"{name} has {len(array)} rows; the server takes at most {limits.max_poses}")
        if len(self.prompt.encode()) > limits.max_prompt_bytes:
            raise PayloadError(f"prompt is longer than {limits.max_prompt_bytes} bytes")


def settings_dict(settings: GenerationSettings | dict[str, Any] | None) -> dict[str, Any]:
    """Settings for the wire. A dict is a partial override of the server's preset (checked here
    first); a GenerationSettings is sent whole; None: the server's preset as it is."""
    if settings is None:
        return {}
    if isinstance(settings, GenerationSettings):
        return settings.to_dict()
    if not isinstance(settings, dict):
        raise TypeError(f"settings must be a GenerationSettings or a dict (got {type(settings).__name__})")
    GenerationSettings.from_dict(settings)  # raises SettingsError naming the bad key
    return dict(settings)
