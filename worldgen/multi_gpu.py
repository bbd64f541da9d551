"""One rollout on two GPUs (`--gpus 0,1`): classifier-free guidance's two passes at once.

Every denoising step runs the expert twice, with the prompt (conditional) and with the negative
prompt (unconditional), and only then combines them (uncond + g * (cond - uncond)). With two GPUs
the conditional pass runs on the first and the unconditional one on the second, at the same time;
everything else (text, VAE, scheduler, the combination) stays on the first GPU as before.

Why one process with one thread per GPU, not torch.distributed (one process per GPU, NCCL):
- The exchange is tiny: per step the second GPU receives the latent and returns its prediction
  (16 x 21 x 60 x 104 float32 = 8.4 MB at 480p, ~1 ms over PCIe). There is no collective to speed
  up, so NCCL would add a launcher, a rendezvous and a second copy of the whole control flow
  (text, VAE, progress, cancel, errors) in every rank for nothing.
- One process keeps the server's contract unchanged: one supervised worker per rollout, one
  progress stream, one cancel, one health answer, one memory meter.
- CUDA work is asynchronous and PyTorch releases the GIL inside each op, so two Python threads keep
  both GPUs busy: a forward launches a few thousand kernels of milliseconds each; the CPU side is
  never what the GPUs wait on.
Each GPU holds its own copy of the experts under its own memory plan (a 24 GB card keeps both NF4
experts resident, exactly as the one-GPU plan decides), so nothing is reloaded at the boundary.
Both GPUs run the same kernels on the same inputs, so the output equals the one-GPU path's (on GPUs
of one model, bit for bit; tests/worldgen/test_multi_gpu.py checks the logic on the CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from worldgen.errors import InputError
from worldgen.residency import ResidencyPolicy


def parse_gpus(spec: str | Sequence[int] | None) -> list[int] | None:
    """'0,1' -> [0, 1] (checked: distinct non-negative indices, at most two). None/'' -> None."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, str):
        try:
            gpus = [int(part) for part in spec.split(",") if part.strip()]
        except ValueError:
            raise InputError(f"--gpus {spec!r}: give CUDA device indices separated by commas, e.g. 0,1") from None
    else:
        gpus = [int(g) for g in spec]
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise InputError(f"--gpus {spec!r}: give distinct CUDA device indices, e.g. 0,1")
    if len(gpus) > 2:
        raise InputError(
            f"--gpus {spec!r}: a rollout uses at most two GPUs (one per guidance pass); run more rollouts for more GPUs"
        )
    return gpus


def devices_for_gpus(spec: str | Sequence[int] | None) -> list[str] | None:
    """'0,1' -> ['cuda:0', 'cuda:1'], refusing when this machine lacks CUDA or those GPUs."""
    gpus = parse_gpus(spec)
    if gpus is None:
        return None
    if not torch.cuda.is_available():
        raise InputError(
            f"--gpus {','.join(map(str, gpus))}: this machine has no CUDA GPU (PyTorch {torch.__version__}); "
            "leave --gpus out to run on the CPU"
        )
    count = torch.cuda.device_count()
    if max(gpus) >= count:
        raise InputError(
            f"--gpus {','.join(map(str, gpus))}: this machine has {count} CUDA GPU(s) (indices 0..{count - 1}); "
            "check CUDA_VISIBLE_DEVICES or ask for fewer"
        )
    return [f"cuda:{g}" for g in gpus]


def check_devices(devices: Sequence[str]) -> None:
    """Refuse CUDA devices this machine does not have (clear message, before anything loads)."""
    wanted = [torch.device(d) for d in devices if torch.device(d).type == "cuda"]
    if not wanted:
        return
    names = ", ".join(devices)
    if not torch.cuda.is_available():
        raise InputError(f"devices {names}: this machine has no CUDA GPU (PyTorch {torch.__version__}); use cpu")
    count = torch.cuda.device_count()
    if max(d.index or 0 for d in wanted) >= count:
        raise InputError(f"devices {names}: this machine has {count} CUDA GPU(s) (indices 0..{count - 1})")


class SecondDevice:
    """The unconditional pass of each step, on another device, in a thread of its own."""

    def __init__(self, device: torch.device | str, residency: ResidencyPolicy):
        self.device = torch.device(device)
        self.residency = residency  # this device's own plan (its budget) over its own copies of the experts
        self.experts = residency.experts
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"guidance-{self.device}")
        self._inputs: dict[str, torch.Tensor | None] = {}

    def fit(self, tokens: int, pixels: int) -> None:
        """Re-plan this device's residency for a job's size (its own budget, its own experts)."""
        self.residency.fit(tokens, pixels)

    def start_job(self, negative_context: torch.Tensor, y: torch.Tensor, cam: torch.Tensor | None) -> None:
        """Copy the job's fixed inputs to this device once (not once per step)."""
        self._inputs = {
            "negative": negative_context.to(self.device),
            "y": y.to(self.device),
            "cam": None if cam is None else cam.to(self.device),
        }

    def submit(
        self, which: str, upcoming: Sequence[str], x: torch.Tensor, timestep: torch.Tensor, compute: str
    ) -> Future:
        """Start the unconditional prediction of this step; `.result()` is [16, F, H, W] on x's device."""
        return self._pool.submit(self._predict, which, list(upcoming), x, timestep, compute)

    @torch.no_grad()
    def _predict(
        self, which: str, upcoming: list[str], x: torch.Tensor, timestep: torch.Tensor, compute: str
    ) -> torch.Tensor:
        home = x.device
        model = self.residency.use(which, upcoming=upcoming)
        model.set_compute(compute)
        inputs = self._inputs
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            out = model(x.to(self.device), timestep.to(self.device), [inputs["negative"]], inputs["y"], inputs["cam"])[
                0
            ]
        return out.to(home)

    def end_job(self) -> None:
        self._inputs = {}
        self.residency.phase_done("denoise")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
