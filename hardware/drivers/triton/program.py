"""A kernel launch as a Program: one node (the launch, at the kernel's `def` line) over the kernel's tensors.

Its inputs are the tensors the kernel is given, by parameter name; its outputs are the tensors the kernel writes,
as the launch leaves them (`out_after`). The node's target is the launch as Triton's own interpreter runs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from hardware.drivers.triton.driver import AFTER, TritonDriver
from hardware.drivers.triton.forensics import divergence
from hardware.drivers.triton.launch import KernelLaunch
from hardware.program import Frame, Node, Program, Ref, SourceLoc, ValueInfo


def open_kernel(path: str | os.PathLike) -> tuple[Program, TritonDriver]:
    """The Program of a kernel file's launch and the driver that has run it once (which says what it writes)."""
    launch = KernelLaunch.from_file(path)
    driver = TritonDriver(launch)
    driver.on_record = lambda record: _against_reference(driver, record)
    driver.first_run()
    return kernel_program(launch, driver.written()), driver


def _against_reference(driver: TritonDriver, record) -> None:
    """A run's comparison with the file's reference(), as the divergence filter's finding in its Schedule."""
    found = divergence(driver)
    if found is not None:
        record.schedule.findings.append(found)


def kernel_program(launch: KernelLaunch, written: list[str]) -> Program:
    tensors = launch.tensors
    values = {a.name: ValueInfo(a.name, "input", _dtype(a.value), tuple(a.value.shape)) for a in tensors}
    outputs = [name + AFTER for name in written]
    for i, name in enumerate(written):
        source = values[name]
        values[name + AFTER] = ValueInfo(name + AFTER, "intermediate", source.dtype, source.shape, producer=0,
                                         output_index=i)
    params = [a.name for a in tensors]
    loc = SourceLoc(str(launch.file), launch.def_line, launch.name)

    def launched(*given: torch.Tensor) -> tuple[torch.Tensor, ...]:
        own = {p: t.clone() for p, t in zip(params, given)}
        launch.run_plainly(own)
        return tuple(own[name] for name in written)

    node = Node(0, launch.name, f"triton.{launch.name}", launched, tuple(Ref(p) for p in params), {}, outputs,
                tuple(range(len(outputs))), loc, (Frame(loc),))
    text = Path(launch.file).read_text()
    return Program(launch.file.stem, [node], values, {a.name: a.value.detach().clone() for a in tensors}, outputs,
                   source_files={str(launch.file): text})


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
