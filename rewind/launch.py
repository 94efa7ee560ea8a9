"""Starting a debug session in Python: a model in memory, a model file, a training step, or a recorded trace.

A model in memory is exported as a model file's `build()` is (hardware/frontends/torch_export.py's
export_program), with the inputs given; the Session then launches that Program. The engine runs in this
process, in an Adapter of its own (dap_server/adapter.py), as the DAP server runs it in an engine process: the
session stops on entry, at tick 0, with the exception filters an editor starts with (stop at a NaN born).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hardware.errors import ProgramLoadError, RewindError
from hardware.frontends.torch_export import checked_inputs, export_program
from hardware.program import Program
from hardware.session import LaunchOptions
from rewind import arguments as checks
from rewind.session import DebugSession, quiet_deprecations

WHOSE = "rewind.debug(model, inputs) was given"


def debug(model: torch.nn.Module | str | os.PathLike, inputs: Any = None, *, entry: str = "build", steps: int = 1,
          driver: str = "auto", reference: str | None = None, rtol: float | None = None, atol: float | None = None,
          budget_mb: float = 1024.0, breakpoint_mode: str = "forward") -> DebugSession:
    """Run a model under the debugger and stop at its start (tick 0).

    `model` is an `nn.Module` already in memory with its example `inputs` (a tensor, a tuple of positional
    inputs, or a dict of keyword inputs), or the path of a model file whose `entry` (default `build`) returns
    `(module, inputs)`; `entry="train_step"` with `steps=N` runs N training steps of the file (forward, backward
    and the optimizer's update). `driver`: where the pass runs (auto, torch:cpu, torch:cuda[:N], sim).
    `reference`: the known-good pass forensics compares against (default torch:cpu:float64; a trace; saved
    values), with tolerances `rtol`/`atol` (default: by dtype). `budget_mb`: checkpoint memory.
    `breakpoint_mode`: the nodes of a training step's line breakpoints stop in (forward, backward, both).
    """
    common = _options(driver, reference, rtol, atol, budget_mb, breakpoint_mode)
    if isinstance(model, torch.nn.Module):
        if entry != "build" or steps != 1:
            raise RewindError("entry and steps choose what a model file runs; a model in memory runs its forward on "
                              "the inputs given (a training step comes from a file: rewind.debug('train.py', "
                              "entry='train_step', steps=N))")
        program = _program_of(model, inputs)
        return DebugSession.launch(LaunchOptions(f"{type(model).__name__} (in memory)", **common), program)
    if isinstance(model, (str, os.PathLike)):
        if inputs is not None:
            raise RewindError("a model file makes its own inputs (its entry returns (module, inputs)): give the "
                              "file alone, or the module in memory with its inputs")
        path = os.path.abspath(checks.path_text("model", model))
        chosen = {"entry": checks.text("entry", entry), "steps": checks.whole("steps", steps)}
        return DebugSession.launch(LaunchOptions(path, **chosen, **common), None)
    raise RewindError(f"rewind.debug takes a torch.nn.Module and its inputs, or the path of a model file; got "
                      f"{checks.kind_of(model)}")


def open(trace: str | os.PathLike, *, driver: str = "auto") -> DebugSession:
    """Open a recorded trace (DebugSession.save, `rewind debug --record`) and debug it both ways, no device
    needed; `driver` recomputes what the trace did not keep."""
    path = os.path.abspath(checks.path_text("trace", trace))
    return DebugSession.launch(LaunchOptions(trace=path, driver=checks.text("driver", driver)), None)


def _options(driver: str, reference: str | None, rtol: float | None, atol: float | None, budget_mb: float,
             breakpoint_mode: str) -> dict:
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise RewindError(f"{name} must be a number of 0 or more, got {value!r}")
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not budget_mb > 0:
        raise RewindError(f"budget_mb must be a number of megabytes above 0, got {budget_mb!r}")
    given = checks.text_or_none("reference", reference)
    return {"driver": checks.text("driver", driver), "budget_mb": float(budget_mb), "rtol": rtol, "atol": atol,
            "reference": given if given is None or given.startswith("torch:") else os.path.abspath(given),
            "breakpoint_mode": checks.text("breakpoint_mode", breakpoint_mode)}


def _program_of(model: torch.nn.Module, inputs: Any) -> Program:
    """The Program of a module in memory on its inputs. The module's train/eval mode is left as it was."""
    if inputs is None:
        raise ProgramLoadError(f"{WHOSE} no inputs: give the forward's example inputs (a tensor, a tuple of them, "
                               "or a dict of keyword inputs)")
    training = model.training
    try:
        with quiet_deprecations():
            return export_program(model, checked_inputs(inputs, WHOSE), name=type(model).__name__)
    finally:
        model.train(training)
