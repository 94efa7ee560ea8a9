"""The `triton` driver: a user's Triton kernel under the Triton interpreter, program by program (docs/kernels.md)."""

from hardware.drivers.triton.driver import AFTER, TritonDriver
from hardware.drivers.triton.launch import KERNEL_ENTRY, KernelLaunch
from hardware.drivers.triton.program import kernel_program, open_kernel

__all__ = ["AFTER", "KERNEL_ENTRY", "KernelLaunch", "TritonDriver", "kernel_program", "open_kernel"]
