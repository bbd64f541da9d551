"""Engine options: how a worker loads its engine (checkpoint, devices, dtype, compute, attention,
budget, text-encoder placement), as one dataclass that crosses every process boundary as data.

The server reads them from `[worker]` of `config/server.toml` (`from_dict`), hands them to each
worker process as data, in the worker protocol's first message (`load {options: to_dict()}`), and
the worker passes them to `worldgen.pipelines.loader.load_pipeline(options=...)`. No hop rebuilds them as
argv flags or TOML text, so one spelling and one "no budget" value (None) hold everywhere.
(`ram_budget_gb` is gone from here: no part of the engine decided anything from it.)
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from contracts.model_families import MODELS  # the `model` setting: which family each runs is said there

DTYPES = ("bf16", "fp16", "fp32")  # the one vocabulary of compute dtypes (torch names are mapped in worldgen)
# How the experts' matmuls run (the one vocabulary; `dtype` says which float type they run in):
# exact = the reference's numerics in the engine's dtype (bf16 on CUDA, fp32 on the CPU);
# fp8 = each large Linear as an FP8 GEMM (approximate: worldgen.kernels.fp8).
# int8 = W8A8 GEMMs and an 8-bit self-attention (approximate: worldgen.kernels.int8), for GPUs without FP8.
COMPUTES = ("exact", "fp8", "int8")
# "auto": the card decides: fp8 where it has FP8 tensor cores (8.9+), int8 on Ampere (8.0-8.8), exact elsewhere
AUTO_COMPUTE = "auto"
# Spellings still accepted wherever a compute is given (CLI, server.toml, job settings) and read as
# the name they stand for: "bf16" named the exact path before records stated the dtype beside it.
COMPUTE_ALIASES = {"bf16": "exact"}
COMPUTE_CHOICES = (*COMPUTES, AUTO_COMPUTE, *COMPUTE_ALIASES)  # what CLIs and files accept
# What fp8 costs and buys, as measured (docs/benchmarks.md, "Speed" and "FP8 distance"): the one
# wording of every --compute help (generate, serve, replay). No "%": the CLI's option parser formats help text.
FP8_HELP = (
    "fp8 is approximate: on one H100 (random weights of the real shapes) a forward took 2.33 s against "
    "3.11 s exact (0.75x the time; its attention runs in FP8 too where cuDNN's FP8 kernel is installed: "
    "pip install nvidia-cudnn-frontend, Hopper only); on the golden DiT cases its output is 5.2e-2 to 5.3e-2 "
    "(rel-L2) from the reference's, against 5.7e-3 to 1.1e-2 for exact; not yet checked on trained weights "
    "(docs/benchmarks.md). With --model fast it also runs the VAE in bf16 (87 dB PSNR from float32 on random "
    "weights). The GPU that runs it needs FP8 tensor cores (compute capability 8.9+: RTX 40xx, "
    "L40, H100); refused elsewhere"
)
# The attention kernels (worldgen.kernels.attention), and what each costs: the one wording of every --attention help.
ATTENTION_HELP = (
    "DiT attention kernel. auto (default): flash when a FlashAttention package is installed, else sdpa. "
    "sdpa: PyTorch's scaled_dot_product_attention (cuDNN's kernel on Hopper). flash: FlashAttention 4 "
    "(pip install flash-attn-4; on one H100 a base forward took 3.11 s against 3.34 s with sdpa, the Fast "
    "DiT loop 9.9 s against 10.4 s; the same numerics class) or FlashAttention 2. Both exact; the text "
    "keys of cross-attention stay on sdpa. sage: SageAttention (INT8 Q and K: approximate; "
    "only when asked)"
)
ATTENTIONS = ("auto", "sdpa", "flash", "sage")
# "auto": CUDA where the worker's PyTorch sees a GPU, else the CPU (the worker resolves it and
# reports the device it took: health names that worker by it).
AUTO_DEVICE = "auto"
# A two-device causal job (worldgen.pipelines.two_gpu): how long a rank waits in one collective for its peer
# before the job fails with PeerLost (a dead peer's closed connection fails it at once); generous, since a
# peer's first forward may compile its kernels while the other waits
PEER_TIMEOUT_S = 300.0
# ... and how long the leader waits for its peer to load its share of the DiT (a 14B's weights from disk)
PEER_LOAD_TIMEOUT_S = 1800.0
DEVICE_HELP = "auto (CUDA where there is a GPU, else the CPU), cpu, cuda or cuda:N"
TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def canonical_compute(value: str | None) -> str | None:
    """The name in COMPUTES for a compute given in any accepted spelling ("bf16" -> "exact");
    None (the engine's choice) and unknown values pass through for the caller to refuse."""
    return COMPUTE_ALIASES.get(value, value) if isinstance(value, str) else value


class EngineOptionsError(ValueError):
    """An engine option has a value the worker cannot use; the message names the option."""


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How the worker's engine is loaded. `None` always means "the engine's choice"."""

    ckpt: str = "tiny"  # "tiny" (random weights, CPU in seconds) or a checkpoint folder
    model: str = "base"  # base (two experts, guided) | fast (causal, 4 steps a chunk) | causal (2.0 causal-pretrain)
    # a LingBot-World 2.0 1.3B download's umT5, VAE and tokenizer (the 14B's folder); None: beside it or a sibling
    assets_dir: str | None = None
    devices: tuple[str, ...] = ("cpu",)  # "auto", "cpu", "cuda", "cuda:N"; several: one rollout over several GPUs
    dtype: str | None = None  # bf16 | fp16 | fp32; None: bf16 on CUDA, fp32 on the CPU
    compute: str | None = None  # exact | fp8 (bf16: old name of exact); None: the engine's choice
    attention: str = "auto"  # auto | sdpa | flash | sage
    vram_budget_gb: float | None = None  # None: no budget (plan for the whole GPU)
    t5_on_cpu: bool = False  # run umT5 on the CPU, streamed block by block (no GPU memory)
    warm_up: bool = False  # Fast model: compile its DiT's kernels at load, for the shapes of `warm_up_settings`
    # the job defaults the warm-up (and the kernels compiled at load) are for, as GenerationSettings.to_dict():
    # a server's generation preset, which it fills in; None: the engine's default settings (480*832, 81 frames)
    warm_up_settings: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        where = "engine options"
        if not isinstance(self.ckpt, str) or not self.ckpt:
            raise EngineOptionsError(f"{where}: ckpt must be 'tiny' or a checkpoint folder path (got {self.ckpt!r})")
        if self.model not in MODELS:
            raise EngineOptionsError(f"{where}: model must be one of {list(MODELS)} (got {self.model!r})")
        if self.assets_dir is not None and (not isinstance(self.assets_dir, str) or not self.assets_dir):
            raise EngineOptionsError(f"{where}: assets_dir must be a folder path or absent (got {self.assets_dir!r})")
        devices = (self.devices,) if isinstance(self.devices, str) else self.devices
        if not isinstance(devices, (list, tuple)) or not devices or not all(isinstance(d, str) for d in devices):
            raise EngineOptionsError(
                f"{where}: devices must be a list, each one of {DEVICE_HELP} (got {self.devices!r})"
            )
        for device in devices:
            kind, _, index = device.partition(":")
            if device == AUTO_DEVICE and len(devices) == 1:
                continue
            if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
                raise EngineOptionsError(f"{where}: device {device!r} must be one of {DEVICE_HELP}")
        object.__setattr__(self, "devices", tuple(devices))
        for name, allowed in (("dtype", DTYPES), ("compute", COMPUTE_CHOICES)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise EngineOptionsError(f"{where}: {name} must be one of {list(allowed)} or null (got {value!r})")
        object.__setattr__(self, "compute", canonical_compute(self.compute))
        if self.attention not in ATTENTIONS:
            raise EngineOptionsError(f"{where}: attention must be one of {list(ATTENTIONS)} (got {self.attention!r})")
        budget = self.vram_budget_gb
        if budget is not None:
            if (
                isinstance(budget, bool)
                or not isinstance(budget, (int, float))
                or not math.isfinite(budget)
                or budget <= 0
            ):
                raise EngineOptionsError(
                    f"{where}: vram_budget_gb must be a number of GiB > 0, or null (in TOML: leave it out) for no budget (got {budget!r})"
                )
            object.__setattr__(self, "vram_budget_gb", float(budget))
        for name in ("t5_on_cpu", "warm_up"):
            if not isinstance(getattr(self, name), bool):
                raise EngineOptionsError(f"{where}: {name} must be true or false (got {getattr(self, name)!r})")
        if self.warm_up_settings is not None and not isinstance(self.warm_up_settings, dict):
            # its values are checked where they are read (worldgen: GenerationSettings.from_dict)
            raise EngineOptionsError(f"{where}: warm_up_settings must be generation settings (a table) or null")

    @property
    def device(self) -> str:
        """The first (or only) device."""
        return self.devices[0]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["devices"] = list(self.devices)
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "engine options") -> EngineOptions:
        """Strict: unknown keys are an error (a typo must not fall back to a default)."""
        if not isinstance(data, dict):
            raise EngineOptionsError(f"{where} must be an object (got {type(data).__name__})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in set(data) - known)
        if unknown:
            raise EngineOptionsError(f"{where}: unknown option(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**data)
        except EngineOptionsError as exc:
            raise EngineOptionsError(str(exc).replace("engine options", where, 1)) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "engine options") -> EngineOptions:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EngineOptionsError(f"{where}: not valid JSON ({exc})") from None
        return cls.from_dict(data, where)

    def replace(self, **changes: Any) -> EngineOptions:
        return self.from_dict({**self.to_dict(), **changes})
