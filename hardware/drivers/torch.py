"""The `torch` driver: any torch device (cpu, cuda, cuda:N). One tick runs one node."""

from __future__ import annotations

import ctypes
import functools
import os
import time
import sys
import weakref
from dataclasses import replace
from typing import Any

import torch

from checkpoint.device_pool import DevicePool
from hardware.determinism import Hold, OpWatch, make_deterministic
from hardware.driver import Chip, ChecksReadback, Driver, MemorySpace, Unit, WriteStats
from hardware.drivers import torch_checks
from hardware.drivers.cuda_allocator import block_at
from hardware.errors import DriverError, UnsupportedOpError
from hardware.memory import Location
from hardware.program import Node, Program



def _keep_freed_memory() -> None:
    """Let glibc reuse freed tensor memory instead of returning it to the OS.

    The checkpoint ring retains and evicts many large tensors; with glibc's defaults every
    tensor over its mmap threshold is unmapped when freed and page-faulted afresh when the
    next one is allocated, which costs more than the ops themselves on a CPU."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)  # glibc's maximum
    libc.mallopt(_M_TRIM_THRESHOLD, 2**30)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


# Precisions a whole pass may be computed in (`torch:cpu:float64`): the reference pass.
_COMPUTE_DTYPES = {"float64": torch.float64, "float32": torch.float32}
# A bitcast reinterprets bytes, so it cannot run at another element width.
_WIDTH_BOUND_OPS = ("aten.view.dtype",)


class TorchDriver(Driver):
    def __init__(self, device: torch.device, compute: torch.dtype | None = None, deterministic: bool | None = None):
        """`deterministic`: switch torch to deterministic kernels, process-wide (None: on a GPU, where replay
        needs it; the CPU's kernels already are)."""
        if device.type == "cpu" and sys.platform.startswith("linux"):
            _keep_freed_memory()
        self.device = device
        self.compute = compute  # every floating op runs in this dtype (None: as the Program says)
        self.name = f"torch:{device}" + (f":{_dtype_name(compute)}" if compute is not None else "")
        on_gpu = device.type == "cuda"
        self.check_batch = 64 if on_gpu else 1  # a GPU reads its checks back in batches, asynchronously
        self.pools_checkpoints = on_gpu
        self._queued = on_gpu  # the device runs what the host queued later: its own events time a node
        self.watch: OpWatch | None = None  # set while deterministic: reports the ops that are not
        self.caveats: list[str] = []
        self.determinism: Hold | None = None  # released by the Session's close, or when the driver is collected
        if on_gpu if deterministic is None else deterministic:
            self.determinism = make_deterministic()
            self.replaced, self.caveats = self.determinism.replaced, self.determinism.caveats
            weakref.finalize(self, self.determinism.release)  # a driver no Session closes (a reference pass's)
            report = weakref.WeakMethod(self._report_nondeterministic)  # no cycle: the driver is freed when dropped
            self.watch = OpWatch(lambda op, kernel: report()(op, kernel))

    @classmethod
    def from_spec(cls, spec: str) -> "TorchDriver":
        if spec == "auto":
            return cls(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        device, _, last = spec.removeprefix("torch:").rpartition(":")
        if last in _COMPUTE_DTYPES:
            return cls(cls.from_spec(f"torch:{device}").device, _COMPUTE_DTYPES[last])
        if last.startswith(("float", "bfloat", "half", "double")):
            raise DriverError(f"driver '{spec}': a pass can be computed in {' or '.join(_COMPUTE_DTYPES)}, "
                              f"not '{last}'")
        device = spec.removeprefix("torch:")
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise DriverError(f"unknown torch device '{device}' in driver '{spec}': {exc}") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise DriverError(f"driver '{spec}': CUDA is not available on this machine")
            index = dev.index or 0
            if index >= torch.cuda.device_count():
                raise DriverError(f"driver '{spec}': no CUDA device {index} ({torch.cuda.device_count()} present)")
            dev = torch.device("cuda", index)
        elif dev.type != "cpu":
            raise DriverError(f"driver '{spec}': device type '{dev.type}' is not supported (cpu, cuda)")
        return cls(dev)

    def describe(self) -> Chip:
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(self.device)
            return Chip(f"{self.device} ({props.name})", (Unit(0, f"{self.device} stream"),),
                        (MemorySpace("HBM", 0, props.total_memory),))
        return Chip("cpu", (Unit(0, "host"),), (MemorySpace("host", 0, 2**64 - 1),))

    @property
    def unit_name(self) -> str:
        return self.describe().units[0].name

    def load(self, program: Program) -> dict[str, Any]:
        bad = sorted({n.op for n in program.nodes if not callable(n.target)})
        if bad:
            raise UnsupportedOpError(f"the torch driver cannot run: {', '.join(bad)}")
        for caveat in self.caveats:
            self._report(caveat)
        if self.compute is not None:
            bound = sorted({n.op for n in program.nodes if n.op.startswith(_WIDTH_BOUND_OPS)})
            if bound:
                raise UnsupportedOpError(f"{self.name} cannot run {', '.join(bound)} in {_dtype_name(self.compute)}: "
                                         "a bitcast depends on the element width")
            return {name: _widen(t.to(self.device), self.compute).clone() for name, t in program.initial.items()}
        return {name: t.to(self.device).clone() for name, t in program.initial.items()}

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.watch is not None and self.watch.watches(node.op):
            return self.watch.run(node.op, lambda: self._execute(node, args, kwargs))
        return self._execute(node, args, kwargs)

    def _execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.compute is not None:
            return self._run_widened(node, args, kwargs, self.compute)
        return self._call(node, args, kwargs)

    def _call(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if "device" in kwargs:  # a factory op (a mask's `ones`) names the device it ran on at export: run it here
            kwargs = {**kwargs, "device": self.device}
        with torch.no_grad():
            return _outputs(node, node.target(*args, **kwargs))

    # -- precision -----------------------------------------------------------------------------
    def execute_at(self, node: Node, args: tuple, kwargs: dict, dtype: str) -> list[Any]:
        target = getattr(torch, dtype, None)
        if not isinstance(target, torch.dtype) or not target.is_floating_point:
            raise DriverError(f"'{dtype}' is not a floating-point dtype (float64, float32, float16, bfloat16)")
        if node.op.startswith(_WIDTH_BOUND_OPS):
            raise DriverError(f"{node.describe()} is a bitcast: it cannot run at another precision")
        return self._run_widened(node, args, kwargs, target)

    def _run_widened(self, node: Node, args: tuple, kwargs: dict, dtype: torch.dtype) -> list[Any]:
        args, kwargs = _widen((args, kwargs), dtype)
        return [_widen(t, dtype) for t in self._call(node, args, kwargs)]  # int / int divides into the default dtype

    def cast(self, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
        return tensor.to(getattr(torch, dtype))

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu()

    def from_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, copy=True)

    # -- where values live ---------------------------------------------------------------
    def locate(self, tensor: torch.Tensor, unit: str | None = None) -> Location:
        """Where a tensor's elements are (cheap: the write log asks for every write; the caching allocator's
        view of the memory is `allocator_info`)."""
        device = tensor.device
        extra: dict[str, Any] = {
            "storage": tensor.untyped_storage().data_ptr(),
            "storage_offset_bytes": tensor.storage_offset() * tensor.element_size(),
        }
        return Location(chip=_device_name(device), unit=unit or self.unit_name,
                        space="HBM" if device.type == "cuda" else "host", address=tensor.data_ptr(),
                        nbytes=_extent_bytes(tensor), dtype=_dtype_name(tensor.dtype), shape=tuple(tensor.shape),
                        strides=tuple(tensor.stride()), extra=extra)

    def allocator_info(self, address: int) -> dict[str, Any]:
        """The caching allocator's segment, block, stream and pool holding `address` now (CUDA only)."""
        if self.device.type != "cuda":
            return {}
        try:
            segments = torch.cuda.memory_snapshot(include_traces=False)
        except TypeError:  # a torch before 2.6 has no light snapshot
            segments = torch.cuda.memory_snapshot()
        return block_at(segments, address, self.device.index)

    def placement(self, name: str, tensor: torch.Tensor) -> tuple[Location, ...]:
        """The value's Location with the allocator's segment and block (on a GPU): asked for on demand."""
        loc = self.locate_value(name, tensor)
        return (replace(loc, extra={**loc.extra, **self.allocator_info(loc.address)}),)

    # -- timing --------------------------------------------------------------------------
    def mark(self) -> Any:
        if not self._queued:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # read when asked: no host sync per node
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds_between(self, start: Any, end: Any) -> float:
        if not isinstance(start, torch.cuda.Event):
            return super().seconds_between(start, end)
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    # -- on-device checks ----------------------------------------------------------------
    def inspect(self, tensor: torch.Tensor) -> WriteStats:
        return torch_checks.inspect(tensor)

    def check(self, tensor: torch.Tensor) -> torch.Tensor | None:
        return torch_checks.pack(tensor)

    def read_checks(self, checks: list[Any], tensors: list[Any]) -> ChecksReadback:
        return torch_checks.TorchReadback(checks, tensors)

    def checkpoint_pool(self, capacity: int) -> DevicePool:
        """A pool of `capacity` bytes, or of the part of the device's free memory a pool may take when that is
        less (a budget sized for one machine must not fail a launch on a smaller one)."""
        free = _free_bytes(self.device)
        room = capacity if free is None else int(free * POOL_SHARE_OF_FREE)
        if capacity > room:
            self._report(f"the checkpoint budget of {capacity / 2**30:.2f} GiB does not fit in {self.device}'s "
                         f"{free / 2**30:.2f} GiB free: its device pool holds {room / 2**30:.2f} GiB")
            capacity = room
        return DevicePool(capacity, self.device)

    # -- determinism ---------------------------------------------------------------------
    def _report(self, text: str) -> None:
        if self.on_report is not None:
            self.on_report(text)

    def _report_nondeterministic(self, op: str, kernel: str) -> None:
        self._report(f"{op} runs {kernel} on {self.device}, which torch has no deterministic kernel for: "
                     "replaying its ticks may write different bits (the replay digest check reports where)")

    # -- bytes ---------------------------------------------------------------------------
    def read(self, tensor: torch.Tensor, offset: int, count: int) -> bytes:
        view = _bytes_view(tensor)
        start = tensor.storage_offset() * tensor.element_size() + offset
        return view[start:start + count].cpu().numpy().tobytes()

    def write(self, tensor: torch.Tensor, offset: int, data: bytes) -> None:
        view = _bytes_view(tensor)
        start = tensor.storage_offset() * tensor.element_size() + offset
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(tensor.device)
        view[start:start + len(data)].copy_(src)

    def copy_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def clone(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()


POOL_SHARE_OF_FREE = 0.8  # of the device's free memory; the rest is for the run's own values


def _free_bytes(device: torch.device) -> int | None:
    """Free memory of the device (None where the system does not say)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _outputs(node: Node, result: Any) -> list[Any]:
    if isinstance(result, torch.Tensor):
        return [result]
    # Multi-output ops: keep only the outputs the Program names (getitem users).
    return [result[i] for i in node.output_indices]


def _widen(obj: Any, dtype: torch.dtype) -> Any:
    """`obj` with every floating tensor and floating dtype argument no wider than `dtype` made `dtype`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if _narrower(obj.dtype, dtype) else obj
    if isinstance(obj, torch.dtype):
        return dtype if _narrower(obj, dtype) else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_widen(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _widen(v, dtype) for k, v in obj.items()}
    return obj


def _narrower(have: torch.dtype, want: torch.dtype) -> bool:
    return have.is_floating_point and have != want and have.itemsize <= want.itemsize


@functools.cache
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def _device_name(device: torch.device) -> str:
    return str(device)


def _bytes_view(tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)


def _extent_bytes(tensor: torch.Tensor) -> int:
    if tensor.is_contiguous():
        return tensor.numel() * tensor.element_size()
    if tensor.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if s > 0)
    return (last + 1) * tensor.element_size()
