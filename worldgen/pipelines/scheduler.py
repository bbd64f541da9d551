"""Flow-matching UniPC sampler (order 2, bh2, predict-x0), as Wan2.2 / LingBot-World configure it.

The reference samples with Wan's `FlowUniPCMultistepScheduler` (a diffusers `UniPCMultistepScheduler`
adapted to flow matching) configured as: 1000 training steps, `solver_order=2`, `solver_type="bh2"`,
`predict_x0=True` with x0 = x - sigma * v, `lower_order_final=True`, `final_sigmas_type="zero"`,
no thresholding, no disabled corrector steps, the shift applied in `set_timesteps`.

Written here rather than imported: diffusers is not a dependency (it would pull in a dozen
packages for one class), and the golden trajectories are only reproduced to float32 round-off when
every scalar is computed the way the reference computes it -- 0-dim float32 tensors, the same order
of operations, `torch.linalg.solve` on the 2x2 corrector system. Only the configuration above is
implemented; the general-order and predict-noise branches of the original are not.

Quirks kept on purpose (they decide which timesteps the model sees):
- the training sigmas are float32, so the schedule starts at float32(0.999) = 0.9990000128746033
  and the inference linspace runs in float64 from there;
- timesteps are `int64(sigma * 1000)`, i.e. truncated, and the model is called with those integers.

One quirk not kept: the reference looks its first step up by timestep value and, were the first
two timesteps equal (possible with many steps and a large shift), would start on the second sigma
and then index past the end of the schedule. Here the step counter always starts at 0.

Use: `set_timesteps(steps, shift)` (also resets all state, so one instance can run any number of
rollouts), then call `step(model_output, t, sample)` once for each `t` in `timesteps`, in order.
"""

from __future__ import annotations

import numpy as np
import torch


class FlowUniPCScheduler:
    """Multistep UniPC predictor-corrector (bh2) on a shifted flow-matching sigma schedule."""

    solver_order = 2

    def __init__(self, num_train_timesteps: int = 1000) -> None:
        self.num_train_timesteps = num_train_timesteps
        # Training sigmas are 1 - linspace(1, 1/T, T) reversed, held in float32 by the reference:
        # their first value, float32(0.999), is where every inference schedule starts.
        self.sigma_max = float(np.float32(1.0 - 1.0 / num_train_timesteps))
        self.sigma_min = 0.0
        self.timesteps = torch.empty(0, dtype=torch.int64)
        self.sigmas = torch.empty(0, dtype=torch.float32)
        self.reset()

    @property
    def num_inference_steps(self) -> int:
        return len(self.timesteps)

    @property
    def step_index(self) -> int:
        """Index in `timesteps` of the next call to `step`."""
        return self._step_index

    def set_timesteps(self, steps: int, shift: float = 1.0) -> None:
        """Build the schedule for `steps` solver steps with the given sigma shift, and reset."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if shift <= 0:
            raise ValueError(f"shift must be > 0, got {shift}")
        sigmas = np.linspace(self.sigma_max, self.sigma_min, steps + 1)[:-1]
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        timesteps = sigmas * self.num_train_timesteps
        # float64 -> int64 truncates toward zero, as the reference's torch cast does.
        self.timesteps = torch.from_numpy(timesteps).to(torch.int64)
        self.sigmas = torch.from_numpy(np.concatenate([sigmas, [0.0]]).astype(np.float32))
        self.reset()

    def reset(self) -> None:
        """Forget the solver history so the same schedule can run another rollout from step 0."""
        self._step_index = 0
        self._model_outputs: list[torch.Tensor | None] = [None] * self.solver_order
        self._last_sample: torch.Tensor | None = None
        self._order_used = 0  # order of the previous predictor step (the corrector reuses it)
        self._lower_order_nums = 0  # warm-up: how many previous x0 predictions exist

    def step(self, model_output: torch.Tensor, timestep: int | torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """One solver step: corrector on `sample` (after the first step), then the predictor.

        `model_output` is the velocity v predicted at `sample` and `timestep`; returns the sample
        at the next sigma.
        """
        n = self.num_inference_steps
        if n == 0:
            raise RuntimeError("call set_timesteps(steps, shift) before step()")
        i = self._step_index
        if i >= n:
            raise RuntimeError(f"all {n} steps are done; call reset() or set_timesteps() to start again")
        expected = int(self.timesteps[i])
        if int(timestep) != expected:
            raise ValueError(
                f"step {i} expects timestep {expected}, got {int(timestep)}: "
                "call step() once per entry of `timesteps`, in order"
            )

        x0 = sample - self.sigmas[i] * model_output  # flow prediction -> x0 prediction
        if i > 0 and self._last_sample is not None:
            sample = self._corrector(x0, self._last_sample, sample, self._order_used)

        self._model_outputs = [*self._model_outputs[1:], x0]
        # Lower order on the final step, and during warm-up (too few past predictions).
        order = min(self.solver_order, n - i, self._lower_order_nums + 1)
        self._order_used = order
        self._last_sample = sample
        prev_sample = self._predictor(sample, order)

        self._lower_order_nums = min(self._lower_order_nums + 1, self.solver_order)
        self._step_index += 1
        return prev_sample

    # The scalar maths below mirror the reference's 0-dim float32 tensors and operation order,
    # so that trajectories match it to round-off.

    def _lambda(self, index: int) -> torch.Tensor:
        """log(alpha / sigma) with alpha = 1 - sigma (+inf at the final sigma 0)."""
        sigma = self.sigmas[index]
        return torch.log(1 - sigma) - torch.log(sigma)

    @staticmethod
    def _bh2_coefficients(h: torch.Tensor, rks: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """h*phi_1(-h) = expm1(-h), B(h) = expm1(-h) (bh2), and the UniPC R matrix and b vector."""
        hh = -h
        h_phi_1 = torch.expm1(hh)
        b_h = torch.expm1(hh)
        r = torch.tensor([*rks, 1.0])
        rows, b = [], []
        h_phi_k = h_phi_1 / hh - 1
        factorial = 1
        for k in range(1, len(rks) + 2):
            rows.append(torch.pow(r, k - 1))
            b.append(h_phi_k * factorial / b_h)
            factorial *= k + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        return h_phi_1, b_h, torch.stack(rows), torch.tensor(b)

    def _predictor(self, x: torch.Tensor, order: int) -> torch.Tensor:
        """UniP-bh2: from `x` at sigmas[i] to sigmas[i+1] using the last `order` x0 predictions."""
        i = self._step_index
        m0 = self._model_outputs[-1]
        sigma_t, sigma_s0 = self.sigmas[i + 1], self.sigmas[i]
        alpha_t = 1 - sigma_t
        lambda_s0 = self._lambda(i)
        h = self._lambda(i + 1) - lambda_s0

        rks, d1s = [], []
        if order == 2:
            rk = (self._lambda(i - 1) - lambda_s0) / h
            rks.append(rk)
            d1s.append((self._model_outputs[-2] - m0) / rk)
        h_phi_1, b_h, _, _ = self._bh2_coefficients(h, rks)

        x_t = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0
        if d1s:
            x_t = x_t - alpha_t * b_h * (0.5 * d1s[0])  # order 2 uses rho_p = 0.5
        return x_t.to(x.dtype)

    def _corrector(
        self, x0_now: torch.Tensor, last_sample: torch.Tensor, this_sample: torch.Tensor, order: int
    ) -> torch.Tensor:
        """UniC-bh2: refine `this_sample` (at sigmas[i]) using the new x0 prediction `x0_now`."""
        i = self._step_index
        m0 = self._model_outputs[-1]
        sigma_t, sigma_s0 = self.sigmas[i], self.sigmas[i - 1]
        alpha_t = 1 - sigma_t
        lambda_s0 = self._lambda(i - 1)
        h = self._lambda(i) - lambda_s0

        rks, d1s = [], []
        if order == 2:
            rk = (self._lambda(i - 2) - lambda_s0) / h
            rks.append(rk)
            d1s.append((self._model_outputs[-2] - m0) / rk)
        h_phi_1, b_h, r, b = self._bh2_coefficients(h, rks)
        rhos_c = torch.tensor([0.5]) if order == 1 else torch.linalg.solve(r, b)
        rhos_c = rhos_c.to(last_sample.dtype)

        x_t = sigma_t / sigma_s0 * last_sample - alpha_t * h_phi_1 * m0
        correction = rhos_c[-1] * (x0_now - m0)
        if d1s:
            correction = rhos_c[0] * d1s[0] + correction
        x_t = x_t - alpha_t * b_h * correction
        return x_t.to(last_sample.dtype)
