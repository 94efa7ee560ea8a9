"""The drivers' registry: the one module that names every driver.

A new chip is one file or folder here implementing the contract (hardware/driver.py) plus a line in
`open_driver`. Drivers import the ground and their own folder only, never each other or this module.
"""

from __future__ import annotations

from typing import Any, Mapping

from hardware.program import Program

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
    if kind == "triton":
        raise DriverError("the triton driver runs a kernel file: launch it with entry 'kernel' (rewind debug file.py "
                          "--entry kernel), whose kernel() returns (jit_function, grid, args, kwargs)")
    if options:
        raise DriverError(f"driver '{spec}' takes no options ({', '.join(sorted(options))}): they are the sim chip's")
    if spec == "auto" or kind == "torch":
        return TorchDriver.from_spec(spec)
    raise DriverError(f"unknown driver '{spec}': use auto, torch:cpu, torch:cuda, torch:cuda:N, sim or sim:<chip>")


def open_kernel(path: str, spec: str = "auto") -> tuple[Program, Driver]:
    """A kernel file's launch (entry `kernel`: docs/kernels.md) as a Program, on the triton driver that has run it
    once under the Triton interpreter."""
    if spec not in ("auto", "triton"):
        raise DriverError(f"a kernel file runs on the triton driver (driver auto or triton), not '{spec}'")
    # deferred: start-up time; Triton is an optional extra, imported only for a kernel
    from hardware.drivers.triton import open_kernel as open_triton_kernel

    return open_triton_kernel(path)


def trace_driver(reader: RecordedRun, recompute: Driver | None = None) -> Driver:
    """The driver standing in for the device that recorded `reader`'s run; `recompute` (a real driver) computes
    what the recording does not hold."""
    return TraceDriver(reader, recompute)

