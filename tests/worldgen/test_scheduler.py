"""The flow-matching UniPC sampler against the reference's golden schedules and trajectories."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.worldgen.golden import golden_cases
from tests.worldgen.numerics import rel_l2
from worldgen.pipelines.scheduler import FlowUniPCScheduler

TAGS = ["n40_s5", "n70_s10", "n4_s3", "n50_s5"]
VELOCITY = "v = 0.8*sin(1.7*x) + (t/1000)*cos(0.5*x) - 0.3*x, t the integer timestep"
TOLERANCE = 1e-5  # relative L2, the golden README's scheduler tolerance


def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The synthetic model of cases.json (t the int64 timestep, so t/1000 is float32)."""
    return 0.8 * torch.sin(1.7 * x) + (t / 1000) * torch.cos(0.5 * x) - 0.3 * x


def run(scheduler: FlowUniPCScheduler, x: torch.Tensor) -> list[torch.Tensor]:
    trajectory = []
    for t in scheduler.timesteps:
        x = scheduler.step(velocity(x, t), t, x)
        trajectory.append(x)
    return trajectory


@pytest.fixture(scope="module")
def scheduler_golden(golden):
    return golden_cases(golden / "scheduler")


def test_golden_cases_are_the_ones_tested(scheduler_golden):
    cases, _ = scheduler_golden
    assert sorted(cases) == sorted(TAGS)
    assert all(c["velocity"] == VELOCITY for c in cases.values())


@pytest.mark.parametrize("tag", TAGS)
def test_matches_golden(scheduler_golden, tag):
    cases, tensors = scheduler_golden
    case = cases[tag]
    scheduler = FlowUniPCScheduler()
    scheduler.set_timesteps(case["steps"], shift=case["shift"])

    assert scheduler.timesteps.dtype == torch.int64
    assert torch.equal(scheduler.timesteps, tensors[f"{tag}_timesteps"])
    assert scheduler.sigmas.shape == (case["steps"] + 1,)
    assert rel_l2(scheduler.sigmas, tensors[f"{tag}_sigmas"]) <= TOLERANCE
    assert scheduler.sigmas[-1] == 0

    expected = tensors[f"{tag}_trajectory"]
    trajectory = run(scheduler, tensors[f"{tag}_x_init"].clone())
    assert len(trajectory) == len(expected)
    errors = [rel_l2(got, want) for got, want in zip(trajectory, expected, strict=True)]
    assert max(errors) <= TOLERANCE, f"per-step rel-L2 errors: {errors}"


def test_pipeline_golden_timesteps(golden):
    case = json.loads((golden / "pipeline" / "case.json").read_text())
    scheduler = FlowUniPCScheduler()
    scheduler.set_timesteps(case["steps"], shift=case["shift"])
    want = load_file(golden / "pipeline" / "io.safetensors")["timesteps"]
    assert torch.equal(scheduler.timesteps, want.to(torch.int64))


def test_schedule_starts_at_float32_sigma_max_and_truncates():
    scheduler = FlowUniPCScheduler()
    scheduler.set_timesteps(3, shift=1.0)
    assert scheduler.sigmas[0].item() == float(np.float32(0.999))
    # From float32(0.999) = 0.99900001287: 666.000008 -> 666 and 333.000004 -> 333 by truncation.
    # A float64 0.999 would give [999, 665, 332].
    assert scheduler.timesteps.tolist() == [999, 666, 333]


def test_one_instance_runs_many_rollouts_identically():
    x_init = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    scheduler = FlowUniPCScheduler()
    scheduler.set_timesteps(8, shift=5.0)
    first = run(scheduler, x_init.clone())

    scheduler.reset()
    again = run(scheduler, x_init.clone())
    scheduler.set_timesteps(8, shift=5.0)
    after_set = run(scheduler, x_init.clone())
    fresh = FlowUniPCScheduler()
    fresh.set_timesteps(8, shift=5.0)
    from_fresh = run(fresh, x_init.clone())
    for other in (again, after_set, from_fresh):
        assert all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_final_step_returns_the_x0_prediction():
    """Final sigma 0 with order 1: the last output is sample - sigma * v at the last timestep."""
    scheduler = FlowUniPCScheduler()
    scheduler.set_timesteps(5, shift=3.0)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    for t in scheduler.timesteps[:-1]:
        x = scheduler.step(velocity(x, t), t, x)
    t = scheduler.timesteps[-1]
    v = velocity(x, t)
    out = scheduler.step(v, t, x)
    assert torch.equal(out, x - scheduler.sigmas[-2] * v)


def test_misuse_is_refused():
    scheduler = FlowUniPCScheduler()
    x = torch.zeros(2)
    with pytest.raises(RuntimeError, match="set_timesteps"):
        scheduler.step(x, 999, x)
    scheduler.set_timesteps(2, shift=5.0)
    t0, t1 = scheduler.timesteps.tolist()
    with pytest.raises(ValueError, match=f"expects timestep {t0}"):
        scheduler.step(x, t1, x)
    scheduler.step(x, t0, x)
    scheduler.step(x, t1, x)
    with pytest.raises(RuntimeError, match="all 2 steps are done"):
        scheduler.step(x, t1, x)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        scheduler.set_timesteps(0, shift=5.0)
