"""The `torch` driver: any torch device (cpu, cuda, cuda:N). One tick runs one node."""

from __future__ import annotations

import ctypes
import math
import sys
from typing import Any

import torch

from hardware.driver import Chip, Driver, MemorySpace, Unit, WriteStats
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
    def __init__(self, device: torch.device, compute: torch.dtype | None = None):
        if device.type == "cpu" and sys.platform.startswith("linux"):
            _keep_freed_memory()
        self.device = device
        self.compute = compute  # every floating op runs in this dtype (None: as the Program says)
        self.name = f"torch:{device}" + (f":{_dtype_name(compute)}" if compute is not None else "")
        self._segments: list[dict] | None = None

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
        if self.compute is not None:
            bound = sorted({n.op for n in program.nodes if n.op.startswith(_WIDTH_BOUND_OPS)})
            if bound:
                raise UnsupportedOpError(f"{self.name} cannot run {', '.join(bound)} in {_dtype_name(self.compute)}: "
                                         "a bitcast depends on the element width")
            return {name: _widen(t.to(self.device), self.compute).clone() for name, t in program.initial.items()}
        return {name: t.to(self.device).clone() for name, t in program.initial.items()}

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if self.compute is not None:
            return self._run_widened(node, args, kwargs, self.compute)
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
        with torch.no_grad():
            outputs = _outputs(node, node.target(*args, **kwargs))
        return [_widen(t, dtype) for t in outputs]  # int / int divides into the default dtype

    def cast(self, tensor: torch.Tensor, dtype: str) -> torch.Tensor:
        return tensor.to(getattr(torch, dtype))

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().cpu()

    def from_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device, copy=True)

    # -- where values live ---------------------------------------------------------------
    def locate(self, tensor: torch.Tensor, unit: str | None = None) -> Location:
        extent = _extent_bytes(tensor)
        extra: dict[str, Any] = {
            "storage": tensor.untyped_storage().data_ptr(),
            "storage_offset_bytes": tensor.storage_offset() * tensor.element_size(),
        }
        space = "host"
        if tensor.device.type == "cuda":
            space = "HBM"
            extra.update(self._allocator_block(tensor.data_ptr()))
        return Location(chip=str(tensor.device), unit=unit or self.unit_name, space=space,
                        address=tensor.data_ptr(), nbytes=extent, dtype=str(tensor.dtype).removeprefix("torch."),
                        shape=tuple(tensor.shape), strides=tuple(tensor.stride()), extra=extra)

    def _allocator_block(self, address: int) -> dict[str, Any]:
        """The caching allocator's segment and block that hold `address` (CUDA only)."""
        for attempt in range(2):
            if self._segments is None or attempt == 1:
                self._segments = torch.cuda.memory_snapshot()
            for seg in self._segments:
                base = seg["address"]
                if base <= address < base + seg["total_size"]:
                    offset = base
                    for block in seg["blocks"]:
                        if offset <= address < offset + block["size"]:
                            return {"segment": hex(base), "segment_size": seg["total_size"],
                                    "block": hex(offset), "block_size": block["size"],
                                    "block_state": block["state"], "stream": seg.get("stream"),
                                    "pool": seg.get("segment_type")}
                        offset += block["size"]
        return {}

    # -- on-device checks ----------------------------------------------------------------
    def inspect(self, tensor: torch.Tensor) -> WriteStats:
        """Three reductions on the device (digest, min/max, sum); NaN/Inf are counted only when min/max
        show one is there (aminmax propagates NaN, and an Inf is an extreme)."""
        n = tensor.numel()
        if n == 0:
            return WriteStats.empty()
        flat = tensor.reshape(-1)
        digest = int(self._digest(flat))
        x = flat.view(torch.uint8) if flat.dtype == torch.bool else flat
        if x.is_complex():
            x = x.abs()
        if not x.is_floating_point():
            lo, hi = torch.aminmax(x)
            lo_v, hi_v, total = torch.stack([lo.double(), hi.double(), x.sum(dtype=torch.float64)]).tolist()
            return WriteStats(digest, 0, 0, lo_v, hi_v, total / n)
        acc = x.sum(dtype=torch.float32 if x.element_size() < 4 else None)
        lo, hi = torch.aminmax(x)
        lo_v, hi_v, total = torch.stack([lo.double(), hi.double(), acc.double()]).tolist()
        if math.isfinite(lo_v) and math.isfinite(hi_v):
            if not math.isfinite(total):  # the sum overflowed its accumulator: redo it wide
                total = float(x.sum(dtype=torch.float64))
            return WriteStats(digest, 0, 0, lo_v, hi_v, total / n)
        nan_mask, inf_mask = torch.isnan(x), torch.isinf(x)
        finite = x[~(nan_mask | inf_mask)]
        nan, inf = int(nan_mask.sum()), int(inf_mask.sum())
        if not finite.numel():
            return WriteStats(digest, nan, inf, math.nan, math.nan, math.nan)
        lo, hi = torch.aminmax(finite)
        lo_v, hi_v, total = torch.stack([lo.double(), hi.double(), finite.sum(dtype=torch.float64)]).tolist()
        return WriteStats(digest, nan, inf, lo_v, hi_v, total / finite.numel())

    @staticmethod
    def _digest(flat: torch.Tensor) -> torch.Tensor:
        """A checksum of the bytes computed on the device: the wrapping sum of their widest words.

        One pass, no temporaries; any change of one word changes it. It does not see a permutation
        of whole words, which no non-deterministic kernel produces without also changing values."""
        raw = flat.contiguous().view(torch.uint8)
        nbytes = raw.numel()
        for dtype, width in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
            if nbytes % width == 0:
                return raw.view(dtype).sum(dtype=torch.int64) + nbytes
        return raw.sum(dtype=torch.int64) + nbytes

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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes_view(tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)


def _extent_bytes(tensor: torch.Tensor) -> int:
    if tensor.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if s > 0)
    return (last + 1) * tensor.element_size()
