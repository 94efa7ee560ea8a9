"""Values held as torch tensors: what every driver whose values cross to Python as torch tensors does alike.

The torch driver holds its values on its device; the sim chip and a trace hold host copies. Each of them
locates, reads, writes, copies, converts and runs a node's torch op on such a tensor the same way, and
they share these lines rather than one driver borrowing another.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from contextvars import ContextVar
from typing import Any, Callable

import torch

from hardware.errors import DriverError
from hardware.memory import Location
from hardware.program import Node

# A bitcast reinterprets bytes, so it cannot run at another element width.
WIDTH_BOUND_OPS = ("aten.view.dtype",)
# torch.distributed's functional collectives, as torch.export writes them; wait_tensor only waits for one's result.
COLLECTIVE_NAMESPACE, COLLECTIVE_WAIT = "_c10d_functional.", "_c10d_functional.wait_tensor."
# How a collective node runs: set by a rank's engine (hardware/ranks/), which lets one run only together with its
# peers and answers a recomputation with the recorded result. Called with the node and the call that runs it.
COLLECTIVES: ContextVar[Callable[[Node, Callable[[], list[Any]]], list[Any]] | None] = ContextVar(
    "rewind_collectives", default=None)


def is_collective(op: str) -> bool:
    """Does a node of op `op` communicate with the other ranks (an all_reduce, not the wait for its result)?"""
    return op.startswith(COLLECTIVE_NAMESPACE) and not op.startswith(COLLECTIVE_WAIT)


def keep_freed_memory() -> None:
    """Let glibc reuse freed tensor memory instead of returning it to the OS.

    The checkpoint ring retains and evicts many large tensors; with glibc's defaults every
    tensor over its mmap threshold is unmapped when freed and page-faulted afresh when the
    next one is allocated, which costs more than the ops themselves on a CPU."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 32 * 2**20)  # glibc's maximum
    libc.mallopt(_M_TRIM_THRESHOLD, 2**30)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


# -- running a node's torch op -------------------------------------------------------------------------
_set_grad_enabled = torch._C._set_grad_enabled  # what torch.no_grad() calls on entering and leaving
_is_grad_enabled = torch._C.is_grad_enabled


def run(node: Node, args: tuple, kwargs: dict, device: torch.device) -> list[Any]:
    """Call the node's op with the bound arguments; its outputs in `node.outputs` order."""
    if "device" in kwargs:  # a factory op (a mask's `ones`) names the device it ran on at export: run it here
        kwargs = {**kwargs, "device": device}
    grad = _is_grad_enabled()
    _set_grad_enabled(False)  # torch.no_grad()'s own switch, without a context manager's objects per node
    try:
        if is_collective(node.op):
            if node.op.startswith(_RECEIVING):  # a recv writes into its template: a value the ring holds
                args = _fresh_templates(node.op, args)
            return _collective(node, lambda: outputs(node, node.target(*args, **kwargs)))
        return outputs(node, node.target(*args, **kwargs))
    finally:
        _set_grad_enabled(grad)


_RECEIVING = ("_c10d_functional.irecv.", "_c10d_functional.batch_p2p_ops.")


def _fresh_templates(op: str, args: tuple) -> tuple:
    """A recv's arguments with each template it receives into copied: irecv(template, src, tag, group) and
    batch_p2p_ops(op_list, peer_list, tag_list, tensors, group) write the received tensor into the template and
    return it, and the template is a value of the Program (an empty_like the ring keeps)."""
    if op.startswith("_c10d_functional.irecv."):
        return (args[0].clone(),) + tuple(args[1:])
    kinds, tensors = args[0], args[3]
    return tuple(args[:3]) + ([t.clone() if k == "irecv" else t for k, t in zip(kinds, tensors)],) + tuple(args[4:])


def _collective(node: Node, call: Callable[[], list[Any]]) -> list[Any]:
    runner = COLLECTIVES.get()
    if runner is None:
        raise DriverError(f"{node.describe()} is a torch.distributed collective: it runs only in a session of many "
                          "ranks (launch with ranks: N, or rewind debug --ranks N)")
    return runner(node, call)


def run_widened(node: Node, args: tuple, kwargs: dict, device: torch.device, dtype: torch.dtype) -> list[Any]:
    """Run the node with every floating input, dtype argument and output no wider than `dtype` made `dtype`."""
    args, kwargs = widen((args, kwargs), dtype)
    return [widen(t, dtype) for t in run(node, args, kwargs, device)]  # int / int divides into the default dtype


def run_at(node: Node, args: tuple, kwargs: dict, device: torch.device, dtype: str) -> list[Any]:
    """`Precision.execute_at` for torch tensors: the node's floating-point arithmetic in `dtype`."""
    target = getattr(torch, dtype, None)
    if not isinstance(target, torch.dtype) or not target.is_floating_point:
        raise DriverError(f"'{dtype}' is not a floating-point dtype (float64, float32, float16, bfloat16)")
    if node.op.startswith(WIDTH_BOUND_OPS):
        raise DriverError(f"{node.describe()} is a bitcast: it cannot run at another precision")
    # Every floating input is read at `dtype`, narrowed too: a patched producer upstream may hand a wider one (a
    # float16 node run at float32 after a float32 node run at float64), and one op takes one dtype.
    args, kwargs = _floating_as((args, kwargs), target)
    return run_widened(node, args, kwargs, device, target)


def outputs(node: Node, result: Any) -> list[Any]:
    if isinstance(result, torch.Tensor):
        return [result]
    # Multi-output ops: keep only the outputs the Program names (getitem users).
    return [result[i] for i in node.output_indices]


def widen(obj: Any, dtype: torch.dtype) -> Any:
    """`obj` with every floating tensor and floating dtype argument no wider than `dtype` made `dtype`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if _narrower(obj.dtype, dtype) else obj
    if isinstance(obj, torch.dtype):
        return dtype if _narrower(obj, dtype) else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(widen(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: widen(v, dtype) for k, v in obj.items()}
    return obj


def _floating_as(obj: Any, dtype: torch.dtype) -> Any:
    """`obj` with every floating tensor made `dtype`, wider ones too (dtype arguments are left to widen)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.dtype.is_floating_point and obj.dtype != dtype else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_floating_as(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _floating_as(v, dtype) for k, v in obj.items()}
    return obj


def _narrower(have: torch.dtype, want: torch.dtype) -> bool:
    return have.is_floating_point and have != want and have.itemsize <= want.itemsize


# -- where a tensor lives, and its bytes -----------------------------------------------------------------
def locate(tensor: torch.Tensor, unit: str) -> Location:
    """Where a tensor's elements are (cheap: the write log asks for every write)."""
    device = tensor.device
    extra: dict[str, Any] = {
        "storage": tensor.untyped_storage().data_ptr(),
        "storage_offset_bytes": tensor.storage_offset() * tensor.element_size(),
    }
    return Location(chip=device_name(device), unit=unit, space="HBM" if device.type == "cuda" else "host",
                    address=tensor.data_ptr(), nbytes=_extent_bytes(tensor), dtype=dtype_name(tensor.dtype),
                    shape=tuple(tensor.shape), strides=tuple(tensor.stride()), extra=extra)


def extent(tensor: torch.Tensor) -> tuple[str, int, int]:
    """`locate`'s space, address and bytes alone (the write log's, for every write)."""
    return "HBM" if tensor.is_cuda else "host", tensor.data_ptr(), _extent_bytes(tensor)


def storage(tensor: torch.Tensor) -> tuple[int, int]:
    """The allocation behind a tensor (views share their base's) and its bytes."""
    untyped = tensor.untyped_storage()
    return untyped.data_ptr(), untyped.nbytes()


def read(tensor: torch.Tensor, offset: int, count: int) -> bytes:
    """Bytes of the tensor's storage from its first element + offset."""
    view = _bytes_view(tensor)
    start = tensor.storage_offset() * tensor.element_size() + offset
    return view[start:start + count].cpu().numpy().tobytes()


def write(tensor: torch.Tensor, offset: int, data: bytes) -> None:
    """Overwrite bytes of the tensor's storage in place."""
    view = _bytes_view(tensor)
    start = tensor.storage_offset() * tensor.element_size() + offset
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(tensor.device)
    view[start:start + len(data)].copy_(src)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


def clone(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone()


# -- converting ------------------------------------------------------------------------------------------
class TensorBytes:
    """The bytes of a chip whose values are torch tensors (the torch, sim and trace drivers): `Driver`'s read, write,
    copy_into, clone and storage, answered by the functions above."""

    def read(self, tensor: torch.Tensor, offset: int, count: int) -> bytes:
        return read(tensor, offset, count)

    def write(self, tensor: torch.Tensor, offset: int, data: bytes) -> None:
        write(tensor, offset, data)

    def copy_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        copy_into(dst, src)

    def clone(self, tensor: torch.Tensor) -> torch.Tensor:
        return clone(tensor)

    storage = staticmethod(storage)  # the function itself, no frame around it: asked for each value read and written


def cast(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    return tensor.to(getattr(torch, dtype))


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def from_host(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.to(device, copy=True)


@functools.cache
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def device_name(device: torch.device) -> str:
    return str(device)


def _bytes_view(tensor: torch.Tensor) -> torch.Tensor:
    untyped = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(untyped)


def _extent_bytes(tensor: torch.Tensor) -> int:
    if tensor.is_contiguous():
        return tensor.nbytes
    if tensor.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride()) if s > 0)
    return (last + 1) * tensor.element_size()
