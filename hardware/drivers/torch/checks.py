"""The torch driver's on-device checks of a write, read back in batches.

The checks themselves (digest, NaN/Inf, min/max/mean of a `Check`) are every torch-tensor driver's
(hardware/tensor_checks.py). On a CUDA device `TorchReadback` carries a batch of them to the host in
one asynchronous copy per column into pinned memory, ordered by an event, so the host waits for none
of them until it reads the stats; `inspect` is a batch of one read back at once.
"""

from __future__ import annotations

from typing import Any

import torch

from hardware.driver import WriteStats
from hardware.tensor_checks import Check, TensorReadback, digest_of, host_stats, pack, stats, word_sum

__all__ = ["Check", "TorchReadback", "digest_of", "inspect", "pack", "stats", "word_sum"]


def inspect(tensor: torch.Tensor) -> WriteStats:
    """The stats of a write, read back at once: one host sync (none on the CPU: made there and then)."""
    if tensor.is_cpu:
        return host_stats(tensor)
    return TorchReadback([pack(tensor)], [tensor]).stats()[0]


class TorchReadback(TensorReadback):
    """A batch of Checks on its way to the host: each column stacked (one kernel each), and on a CUDA device
    copied into pinned memory, ordered by an event on the stream of the checks' device."""

    def __init__(self, checks: list[Check | None], tensors: list[Any]):
        super().__init__(checks, tensors)
        self._event = None
        if self._columns and self._columns[0].is_cuda:
            device = self._columns[0].device
            self._columns = [_to_pinned(column) for column in self._columns]
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(device))  # `cuda:1` is not the current device's stream

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def stats(self) -> list[WriteStats]:
        if self._event is not None:
            self._event.synchronize()
        return super().stats()


def _to_pinned(column: torch.Tensor) -> torch.Tensor:
    host = torch.empty(column.shape, dtype=column.dtype, pin_memory=True)
    host.copy_(column, non_blocking=True)  # the allocator frees `column` in stream order, after the copy
    return host
