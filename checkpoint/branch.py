"""Branches of the Timeline: the future re-executed with patches, then set back as it was recorded.

A Patch changes how one node runs: at another precision, with a user's function in place of
its op, with other attributes (an epsilon, a scale), or with bytes written into its output.
`Timeline.branch(patches)` sets the recorded future aside
from the first patched step (its write log and versions, not its tensors, so memory stays
within the ring's budget) and re-executes from there with the patches. `Timeline.unbranch`
drops the branch and brings the recorded future back: its values are recomputed on demand
and checked against their recorded digests, so the original comes back bit for bit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from checkpoint.ring import VersionKey
from checkpoint.steps import Step
from checkpoint.trace import TraceWriter
from checkpoint.versions import Archive
from hardware.driver import Driver, cast, execute_at, from_host, to_host
from hardware.errors import DriverError, RewindError
from hardware.instructions import InstructionDriver
from hardware.program import Node, Ref
from hardware.torch_tensors import dtype_name
from hardware.ticks import Tick


class Patch(ABC):
    """A change to how one node runs on a branch."""

    node: int  # node index
    kind = "patch"
    keeps_dtypes = True  # its outputs have the dtypes the pass stores for the node's (a precision patch's do not)

    @abstractmethod
    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        """The node's outputs, in `node.outputs` order, computed the patched way."""

    @abstractmethod
    def describe(self) -> str: ...

    def to_dict(self) -> dict:
        return {"kind": self.kind, "description": self.describe()}


@dataclass(frozen=True)
class PrecisionPatch(Patch):
    """Run a node with its floating-point arithmetic in `dtype`; its outputs keep that precision for
    patched consumers, and unpatched consumers read them converted back to the Program's dtype."""

    kind = "precision"
    keeps_dtypes = False
    node: int
    dtype: str

    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        return execute_at(driver, node, args, kwargs, self.dtype)

    def describe(self) -> str:
        return f"run at {self.dtype}"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "dtype": self.dtype}


@dataclass(frozen=True)
class FunctionPatch(Patch):
    """Run a user's function in place of the node's op: it is called with the node's arguments as the op
    receives them (tensors and attributes: `softmax(x, dim)`) and returns its outputs, of the same shapes
    (a tensor, or a tuple of them in `node.outputs` order). `guard` wraps each call (the repair loop's
    integrity audit). Values that are not torch tensors on this driver go through the host."""

    kind = "function"
    node: int
    fn: Callable[..., Any]
    label: str = ""  # what the function is, in words (its name, the file it came from)
    guard: Callable[[], AbstractContextManager] | None = field(default=None, compare=False)

    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        values = node_values(args, kwargs)
        on_host = bool(values) and not isinstance(values[0], torch.Tensor)
        if on_host:
            args, kwargs = _map_values((args, kwargs), lambda t: to_host(driver, t))
        with self.guard() if self.guard is not None else nullcontext():
            result = self.fn(*args, **kwargs)
        outputs = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(outputs) != len(node.outputs) or not all(isinstance(t, torch.Tensor) for t in outputs):
            raise RewindError(f"the function {self.describe()} must return {len(node.outputs)} tensor(s) for "
                              f"{', '.join(node.outputs)}, got {_kinds(outputs)}")
        return [from_host(driver, t) for t in outputs] if on_host else outputs

    def describe(self) -> str:
        return f"replaced by {self.label or getattr(self.fn, '__name__', 'a function')}"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "function": getattr(self.fn, "__name__", None)}


@dataclass(frozen=True)
class AttributePatch(Patch):
    """Run the node's op with some of its non-tensor arguments changed: `eps` of a layer norm, the
    scale a division divides by. Attributes are named as in the op's schema."""

    kind = "attributes"
    node: int
    changes: tuple[tuple[str, Any], ...]  # (attribute name, new value), hashable

    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        if isinstance(driver, InstructionDriver):
            raise DriverError(f"driver {driver.name} runs each node as it lowered it at load, so its attributes "
                              "cannot change on a branch: replace the node with a function instead")
        args, kwargs = list(args), dict(kwargs)
        names = schema_names(node)
        for name, value in self.changes:
            position = names.index(name)
            if position < len(args):
                args[position] = value
            else:
                kwargs[name] = value
        return driver.execute(node, tuple(args), kwargs)

    def describe(self) -> str:
        return "with " + ", ".join(f"{name}={value!r}" for name, value in self.changes)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "attributes": {name: _plain(v) for name, v in self.changes}}

    @staticmethod
    def of(node: Node, changes: dict[str, Any]) -> "AttributePatch":
        """Check every name is an attribute of the node's op: an argument that is no value of the Program."""
        attributes = attribute_names(node)
        if not changes:
            raise RewindError(f"give at least one attribute of {node.describe()} to change")
        for name in changes:
            if name not in attributes:
                raise RewindError(f"{node.describe()} has no attribute '{name}' (its attributes: "
                                  f"{', '.join(attributes) or 'none'})")
        return AttributePatch(node.index, tuple((n, _hashable(v)) for n, v in changes.items()))


@dataclass(frozen=True)
class EditPatch(Patch):
    """Run the node, then set one element of its output `value` to `number` (a value edit on a branch;
    setVariable and writeMemory make the same edit as a recorded step of the pass itself)."""

    kind = "edit"
    node: int
    value: str
    index: tuple[int, ...]
    number: float

    def run(self, driver: Driver, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        outputs = driver.execute(node, args, kwargs)
        i = node.outputs.index(self.value)
        outputs[i] = driver.clone(outputs[i])
        where = driver.locate(outputs[i])
        element = torch.tensor([self.number], dtype=getattr(torch, where.dtype))
        offset = sum(ix * stride for ix, stride in zip(self.index, where.strides)) * element.element_size()
        driver.write(outputs[i], offset, element.view(torch.uint8).numpy().tobytes())
        return outputs

    def describe(self) -> str:
        return f"set {self.value}{list(self.index)} = {self.number:g}"

    def to_dict(self) -> dict:
        return {**super().to_dict(), "value": self.value, "index": list(self.index), "set": self.number}


class DtypeMismatch(RewindError):
    """A patch returned an output of another dtype than the pass stores for it. Casting it back would hide
    what the patch computes (a float64 band-aid rounded to float16 afterwards), so it is refused, in words."""

    def __init__(self, node: Node, patch: Patch, value: str, stored: str, returned: str):
        super().__init__(f"{node.describe()} {patch.describe()} returned '{value}' as {returned}, but the pass "
                         f"stores it as {stored}: a patch must return the node's own dtype (convert its result "
                         "with .to(...)); it is not cast back silently")
        self.node, self.value, self.stored, self.returned = node, value, stored, returned

    def to_dict(self) -> dict:
        return {"node": self.node.name, "op": self.node.op, "value": self.value, "recorded": self.stored,
                "returned": self.returned}


def check_dtype(driver: Driver, node: Node, patch: Patch, value: str, output: Any, recorded: str) -> None:
    """Refuse a patched output whose dtype is not the one the pass stores for `value` (the Program's `recorded`
    dtype, as this driver holds it: a driver computing wider, the reference's, holds it wider)."""
    if not patch.keeps_dtypes:
        return
    stored = cast(driver, output, recorded)
    if stored.dtype != output.dtype:
        raise DtypeMismatch(node, patch, value, dtype_name(stored.dtype), dtype_name(output.dtype))


def schema_names(node: Node) -> list[str]:
    """The names of the op's arguments, in its schema's order (an error naming the node when it has no schema)."""
    return [a.name for a in _schema(node).arguments]


def _schema(node: Node) -> Any:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        raise RewindError(f"{node.describe()} has no op schema to name its attributes by")
    return schema


def attribute_names(node: Node) -> list[str]:
    """The op's arguments a patch may change: those given a constant (an eps, a dim, a scale), and those left
    at their default that take no tensor."""
    bound = dict(zip(schema_names(node), node.args)) | node.kwargs
    return [a.name for a in _schema(node).arguments
            if (not _refers(bound[a.name]) if a.name in bound else "Tensor" not in str(a.type))]


def _refers(obj: Any) -> bool:
    return isinstance(obj, Ref) or (isinstance(obj, (list, tuple)) and any(_refers(o) for o in obj))


def node_values(args: tuple, kwargs: dict) -> list[Any]:
    """The arguments that are values (not attributes): whatever is not a number, string, dtype or None."""
    out: list[Any] = []
    _map_values((args, kwargs), lambda v: out.append(v) or v)
    return out


def _map_values(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_values(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_values(v, fn) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, complex, str, torch.dtype, torch.device, torch.layout,
                                       torch.memory_format)):
        return obj
    return fn(obj)


def _kinds(outputs: list[Any]) -> str:
    return ", ".join(type(o).__name__ for o in outputs) or "nothing"


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


@dataclass
class Branch:
    """What a branch set aside: enough to bring the recorded future back exactly."""

    tick: Tick  # the first patched step: the future from here was re-executed
    position: Tick  # where the timeline stood when the branch began
    frontier: Tick
    patches: dict[int, Patch]  # the patches in force before this branch
    log: dict[str, np.ndarray]  # the write log's records from `tick` on
    versions: dict[str, list[Tick]]  # each value's version ticks from `tick` on
    schedule: list[Step]
    node_tick: list[Tick]
    recorder: TraceWriter | None  # a trace being recorded continuously: it records the original, not branches
    archive: Archive | None  # a trace's versions, as the Timeline saw them before the branch
    seconds: dict[Tick, float] = field(default_factory=dict)  # how long each step from `tick` on took
    # The mutated buffers as they were at `position` (buffer -> (version, a copy)), when small enough to keep: the
    # undo puts them back instead of recomputing the original future's last parameters and optimizer state.
    buffers: dict[str, tuple[Tick | None, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ArchiveBefore:
    """A trace archive seen from a branch: only its versions written before the branch began."""

    archive: Archive
    tick: Tick

    def has(self, key: VersionKey) -> bool:
        return key[1] < self.tick and self.archive.has(key)

    def load(self, key: VersionKey) -> Any | None:
        return self.archive.load(key) if key[1] < self.tick else None
