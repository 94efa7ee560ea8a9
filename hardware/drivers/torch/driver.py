"""The `torch` driver: any torch device (cpu, cuda, cuda:N). One tick runs one node."""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

import torch

from hardware import torch_tensors
from hardware.determinism import Hold, OpWatch, make_deterministic
from hardware.driver import Chip, ChecksReadback, Driver, MemorySpace, Unit, WriteStats
from hardware.drivers.torch import checks as device_checks
from hardware.drivers.torch.cuda_allocator import block_at
from hardware.drivers.torch.device_pool import DevicePool
from hardware.errors import DriverError, UnsupportedOpError
from hardware.memory import Location
from hardware.program import Node, Program
from hardware.torch_tensors import WIDTH_BOUND_OPS, TensorBytes, dtype_name

# Precisions a whole pass may be computed in (`torch:cpu:float64`): the reference pass.
_COMPUTE_DTYPES = {"float64": torch.float64, "float32": torch.float32}


class TorchDriver(TensorBytes, Driver):
    def __init__(self, device: torch.device, compute: torch.dtype | None = None, deterministic: bool | None = None):
        """`deterministic`: switch torch to deterministic kernels, process-wide (None: on a GPU, where replay
        needs it; the CPU's kernels already are)."""
        if device.type == "cpu":
            torch_tensors.keep_freed_memory()
        self.device = device
        self.compute = compute  # every floating op runs in this dtype (None: as the Program says)
        self.name = f"torch:{device}" + (f":{dtype_name(compute)}" if compute is not None else "")
        on_gpu = device.type == "cuda"
        self.check_batch = 64 if on_gpu else 1  # a GPU reads its checks back in batches, asynchronously
        self.pools_checkpoints = on_gpu
        self._queued = on_gpu  # the device runs what the host queued later: its own events time a node
        self.watch: OpWatch | None = None  # set while deterministic: reports the ops that are not
        self.caveats: list[str] = []
        self._own_dtypes: dict[int, torch.dtype] = {}  # a compute pass's bitcast nodes: the dtype each reinterprets
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
            # A bitcast depends on the element width: the pass runs it at the program's own dtypes, on its inputs
            # rounded to them (the rest of the pass stays at the compute precision).
            self._own_dtypes = {n.index: getattr(torch, program.values[n.input_names()[0]].dtype)
                                for n in program.nodes if n.op.startswith(WIDTH_BOUND_OPS)}
            bound = sorted({program.nodes[i].name for i in self._own_dtypes})
            if bound:
                self._report(f"{self.name} runs the bitcast(s) {', '.join(bound)} at the program's own dtypes: "
                             "a bitcast depends on the element width")
        # The Program's tensors are shared, not copied: nothing writes into them but a mutated buffer's memory, which
        # is the driver's own copy (a training run's parameters). A wider pass widens each tensor where a node reads
        # it (run_widened), so a float64 reference holds no float64 copy of the weights, only each node's inputs.
        written = set(program.buffer_mutations.values())
        return {name: self._loaded(t, name in written) for name, t in program.initial.items()}

    def _loaded(self, tensor: torch.Tensor, written: bool) -> torch.Tensor:
        tensor = tensor.to(self.device)
        if not written:
            return tensor
        return (torch_tensors.widen(tensor, self.compute) if self.compute is not None else tensor).clone()

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.watch is not None and self.watch.watches(node.op):
            return self.watch.run(node.op, lambda: self._execute(node, args, kwargs))
        return self._execute(node, args, kwargs)

    def _execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.compute is not None:
            own = self._own_dtypes.get(node.index)
            if own is not None:  # a bitcast reads the one tensor it reinterprets at the program's dtype
                args = tuple(a.to(own) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
                return [torch_tensors.widen(t, self.compute) for t in torch_tensors.run(node, args, kwargs, self.device)]
            return torch_tensors.run_widened(node, args, kwargs, self.device, self.compute)
        return torch_tensors.run(node, args, kwargs, self.device)

    # -- precision (Precision, HostValues) ---------------------------------------------------
    def execute_at(self, node: Node, args: tuple, kwargs: dict, dtype: str) -> list[Any]:
        return torch_tensors.run_at(node, args, kwargs, self.device, dtype)

    def cast(self, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
        target = getattr(torch, dtype)
        if self.compute is not None and target.is_floating_point and target.itemsize < self.compute.itemsize:
            return torch_tensors.widen(tensor, self.compute)  # a pass computed wider never narrows, as its nodes
        return torch_tensors.cast(tensor, dtype)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch_tensors.to_host(tensor)

    def from_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch_tensors.from_host(tensor, self.device)

    # -- where values live ---------------------------------------------------------------
    def locate(self, tensor: torch.Tensor, unit: str | None = None) -> Location:
        """Where a tensor's elements are (cheap: the write log asks for every write; the caching allocator's
        view of the memory is `allocator_info`)."""
        return torch_tensors.locate(tensor, unit or self.unit_name)

    extent = staticmethod(torch_tensors.extent)  # the function itself: the write log asks for every write

    def allocator_info(self, address: int) -> dict[str, Any]:
        """The caching allocator's segment, block, stream and pool holding `address` now (CUDA only)."""
        if self.device.type != "cuda":
            return {}
        try:
            segments = torch.cuda.memory_snapshot(include_traces=False)
        except TypeError:  # a torch before 2.6 has no light snapshot
            segments = torch.cuda.memory_snapshot()
        return block_at(segments, address, self.device.index)

    # -- timing --------------------------------------------------------------------------
    def mark(self) -> Any:
        if not self._queued:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # read when asked: no host sync per node
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds_between(self, start: Any, end: Any) -> float:
        if not isinstance(start, torch.cuda.Event):
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    # -- on-device checks ----------------------------------------------------------------
    def inspect(self, tensor: torch.Tensor) -> WriteStats:
        return device_checks.inspect(tensor)

    def check(self, tensor: torch.Tensor) -> torch.Tensor | None:
        return device_checks.pack(tensor)

    def read_checks(self, checks: list[Any], tensors: list[Any]) -> ChecksReadback:
        return device_checks.TorchReadback(checks, tensors)

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





POOL_SHARE_OF_FREE = 0.8  # of the device's free memory; the rest is for the run's own values


def _free_bytes(device: torch.device) -> int | None:
    """Free memory of the device (None where the system does not say)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
