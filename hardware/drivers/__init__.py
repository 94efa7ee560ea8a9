"""The drivers' registry: the one module that names every driver.

A new chip is one file or folder here implementing the contract (hardware/driver.py) plus a line in
`open_driver`. Drivers import the ground and their own folder only, never each other or this module.
"""

from __future__ import annotations

from typing import Any, Mapping

from hardware.driver import Driver
from hardware.drivers.torch import TorchDriver
from hardware.drivers.trace import TraceDriver
from hardware.errors import DriverError
from hardware.recorded import RecordedRun


def open_driver(spec: str, options: Mapping[str, Any] | None = None) -> Driver:
    """`auto`, `torch:cpu`, `torch:cuda`, `torch:cuda:N`, `sim`, `sim:<chip>`; a torch spec may end
    in a compute precision, `torch:cpu:float64`: every floating op then runs in it (the reference pass).
    `options` are the driver's own launch options (the sim chip's `seed`, `schedule`, `faults`)."""
    kind, _, rest = spec.partition(":")
    if kind == "sim":
        # deferred: start-up time; the sim chip's ml_dtypes takes over half a second to import, paid when it runs
        from hardware.drivers.sim import SimDriver

        return SimDriver.from_spec(spec, options)
    if options:
        raise DriverError(f"driver '{spec}' takes no options ({', '.join(sorted(options))}): they are the sim chip's")
    if spec == "auto" or kind == "torch":
        return TorchDriver.from_spec(spec)
    raise DriverError(f"unknown driver '{spec}': use auto, torch:cpu, torch:cuda, torch:cuda:N, sim or sim:<chip>")


def trace_driver(reader: RecordedRun, recompute: Driver | None = None) -> Driver:
    """The driver standing in for the device that recorded `reader`'s run; `recompute` (a real driver) computes
    what the recording does not hold."""
    return TraceDriver(reader, recompute)

