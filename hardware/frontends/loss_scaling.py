"""`torch.amp.GradScaler` in a training step, written as functional tensor ops the trace records as nodes.

GradScaler's own `step()` decides in Python whether the optimizer runs (it reads the inf check back with `.item()`),
which no trace can follow. A training step that hands Rewind its scaler (`train_step()` returning `(model, inputs,
loss_fn, optimizer, scaler)`) gets the same arithmetic as tensor ops, each a node to step through:
- the loss multiplied by the scale (`scaler.scale(loss)`), then the backward of that;
- each gradient unscaled (times 1 / scale) and the inf check over all of them (`found_inf`: 1.0 when any gradient
  holds a NaN/Inf, as `unscale_` finds);
- the optimizer's update computed on the unscaled gradients and kept only where `found_inf` is 0 (a skipped step
  leaves every parameter and optimizer state as it was, as `scaler.step(optimizer)` does);
- the scale and its growth tracker updated as `scaler.update()` does: times backoff_factor on an inf and the tracker
  reset, else the tracker counted and the scale times growth_factor every growth_interval steps.
The scale (`grad_scale`, float32) and the tracker (`growth_tracker`, int32) are state the steps carry, like an
optimizer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hardware.errors import ProgramLoadError

SCALE, TRACKER, FOUND_INF = "grad_scale", "growth_tracker", "found_inf"


@dataclass(frozen=True)
class LossScaling:
    """A GradScaler's settings and state as the step starts."""

    scale: torch.Tensor  # float32, 0-dim
    tracker: torch.Tensor  # int32, 0-dim
    growth: float
    backoff: float
    interval: int

    @classmethod
    def of(cls, scaler: object, where: str) -> "LossScaling | None":
        """The scaling of a GradScaler (None: disabled, as GradScaler(enabled=False) does nothing)."""
        if not isinstance(scaler, torch.amp.GradScaler):
            raise ProgramLoadError(f"{where} returned a {type(scaler).__name__} after the optimizer, where a "
                                   "torch.amp.GradScaler belongs")
        if not scaler.is_enabled():
            return None
        return cls(torch.tensor(float(scaler.get_scale()), dtype=torch.float32),
                   torch.tensor(int(scaler._get_growth_tracker()), dtype=torch.int32),
                   float(scaler.get_growth_factor()), float(scaler.get_backoff_factor()),
                   int(scaler.get_growth_interval()))

    @staticmethod
    def scaled(loss: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """`scaler.scale(loss)`: the product at the wider of the two dtypes, as GradScaler multiplies."""
        return loss * scale

    @staticmethod
    def unscaled(grads: list[torch.Tensor | None], scale: torch.Tensor) -> tuple[list, torch.Tensor]:
        """The gradients times 1 / scale, and found_inf (1.0 when any holds a NaN/Inf)."""
        inverse = scale.double().reciprocal().float()
        out = [None if g is None else g * inverse.to(g.dtype) for g in grads]
        checks = [(~torch.isfinite(g)).any() for g in out if g is not None]
        found = torch.stack(checks).any().to(torch.float32)
        return out, found

    @staticmethod
    def held(found: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """`new` where the step is taken, `old` where found_inf skips it."""
        return torch.where(found > 0, old, new)

    def updated(self, scale: torch.Tensor, tracker: torch.Tensor, found: torch.Tensor) -> tuple:
        """(scale, tracker) after `scaler.update()` (torch._amp_update_scale_): a scale that would grow past float32's
        range stays as it is."""
        skipped = found > 0
        counted = torch.where(skipped, torch.zeros_like(tracker), tracker + 1)
        grows = counted >= self.interval
        grown = scale * self.growth
        grown = torch.where(torch.isfinite(grown), grown, scale)
        new_scale = torch.where(skipped, scale * self.backoff, torch.where(grows, grown, scale))
        return new_scale, torch.where(grows, torch.zeros_like(counted), counted)
