"""What the Session shows at its position: stack frames, source variables, values and their stats, where a
value physically lives and who wrote it, expressions; and edits, which write a value's bytes as a step of
their own (undone by stepping back over it).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from checkpoint.timeline import Timeline
from hardware.driver import placement_of
from hardware.errors import RewindError
from hardware.expressions import evaluate
from hardware.memory import Placement
from hardware.program import Node, Program
from hardware.session.address_map import occupant
from hardware.session.breakpoints import BreakpointTable, line_positions, resolve_line
from hardware.session.state import FrameInfo, SessionState
from hardware.source_names import Assignment, assignments, frame_instance
from hardware.ticks import Tick
from provenance.lineage import lineage
from provenance.writelog import WriteRecord

if TYPE_CHECKING:
    from hardware.session.instruction_cursor import InstructionCursor


class Inspection:
    """The Session's views of its position, and its edits."""

    def __init__(self, state: SessionState, breakpoints: BreakpointTable,
                 cursor: Callable[[], "InstructionCursor | None"]):
        self.state = state
        self.breakpoints = breakpoints  # an edit makes every condition be evaluated again
        self._cursor = cursor  # the position inside a node, on a chip whose nodes run as instruction streams
        self._assignments: list[Assignment] = []
        self._interrupt = threading.Event()  # set by interrupt() from any thread; stops the running evaluation

    def bind(self, program: Program) -> None:
        """After a launch: the source variable names of the new Program."""
        self._assignments = assignments(program)

    # -- frames and names ----------------------------------------------------------------------------
    def current_node(self) -> Node | None:
        return self.state.tl.node_at(self.state.tl.position)

    def frames(self, unit: int | None = None) -> list[FrameInfo]:
        """The node at its source line, then the enclosing module forward frames, innermost first; for a
        unit of a many-core chip, its next instruction first."""
        cursor = self._cursor()
        if unit and cursor is not None:
            return cursor.unit_frame(unit, self.frames())
        tl = self.state.tl
        tick = tl.position if tl.position < tl.end else tl.end - 1
        node = tl.node_at(tick)
        if node is None:
            step = tl.step_at(tick)
            return [FrameInfo(0, f"edit of {step.edit.value}" if step and step.edit else "<start>", None, None, None)]
        out = []
        for i, frame in enumerate(reversed(node.frames)):
            label = f"{node.name} ({node.op_short})" if i == 0 else f"{frame.module_class or ''}.{frame.loc.function}"
            where = frame.module_path if frame.module_path is not None else ""
            name = f"{label} [{where or '<root>'}]" if i == 0 else f"{label} [{where or '<root>'}]".lstrip(".")
            out.append(FrameInfo(i, name, frame.loc.file, frame.loc.line, frame.module_path))
        if not out:
            out.append(FrameInfo(0, f"{node.name} ({node.op_short})", None, None, node.module_path))
        return out

    def names_at(self, position: Tick | None = None, level: int = 0) -> Mapping[str, Any]:
        """Name -> tensor at a position, materialised lazily (for expressions): the source variables of the
        frames on the stack first (`scores`, `x`), then every value by its Program name (`div_1`)."""
        pos = self.state.tl.position if position is None else position
        return _LazyValues(self.state.tl, pos, self.source_names(pos, level))

    def source_names(self, position: Tick | None = None, level: int = 0) -> dict[str, str]:
        """Source variable -> value name in one frame on the stack (0 = innermost), as Python scopes them:
        the latest assignment in that frame instance before the position."""
        tl = self.state.tl
        pos = tl.position if position is None else position
        frames = self.state.frames_at(pos if pos < tl.end else tl.end - 1)
        if pos >= tl.end:
            frames = frames[:1]
        if level >= len(frames):
            return {}
        scope = frame_instance(frames[len(frames) - 1 - level])
        names: dict[str, str] = {}
        for a in self._assignments:
            if a.frame == scope and tl.node_tick[a.node] < pos:
                names.update(a.names)
        return names

    def evaluate(self, expression: str, level: int = 0) -> Any:
        """A safe expression over the values at the position; source variables as stack frame `level` sees them.

        `interrupt()` from another thread stops it between two operations (an ExpressionError)."""
        stop = self._interrupt
        stop.clear()  # an interrupt meant for an earlier evaluation is not this one's
        try:
            return evaluate(expression, self.names_at(level=level), stop=stop.is_set)
        finally:
            stop.clear()

    def interrupt(self) -> None:
        """Thread-safe: stop the evaluation that runs now (no effect on motions: pause() stops those)."""
        self._interrupt.set()

    # -- values ------------------------------------------------------------------------------------------
    def tensor(self, name: str, position: Tick | None = None) -> Any:
        self._require_value(name)
        return self.state.tl.value(name, position)

    def _require_value(self, name: str) -> None:
        if self.state.program is None or name not in self.state.program.values:
            raise RewindError(f"no value named '{name}' in the program")

    def value_stats(self, name: str, position: Tick | None = None) -> dict:
        """min/max/mean, NaN/Inf counts of a value at a position (from the write log when recorded)."""
        tl = self.state.tl
        pos = tl.position if position is None else position
        version = tl.version_at(name, pos)
        if version is None:
            raise RewindError(f"'{name}' does not exist at tick {pos}")
        if version >= 0:
            rec = tl.log.last_writer(value=name, before=version + 1)
            if rec is not None and rec.tick == version and rec.kind != "view":
                return {"min": rec.stats.min, "max": rec.stats.max, "mean": rec.stats.mean,
                        "nan": rec.stats.nan, "inf": rec.stats.inf}
        s = tl.driver.inspect(tl.value_version(name, version))
        return {"min": s.min, "max": s.max, "mean": s.mean, "nan": s.nan, "inf": s.inf}

    def tensor_stats(self, tensor: Any) -> dict:
        """min/max/mean and NaN/Inf counts of any tensor (an expression's result), computed by the driver."""
        s = self.state.tl.driver.inspect(tensor)
        return {"min": s.min, "max": s.max, "mean": s.mean, "nan": s.nan, "inf": s.inf}

    def live_values(self) -> list[str]:
        return self.state.tl.live()

    def units(self) -> list[str]:
        """The execution units of the chip, by name (unit i is the i-th)."""
        return list(self.state.tl.unit_names)

    def line_positions(self, file: str, line: int) -> tuple[int, list[int]]:
        """(the line a breakpoint at file:line binds to, the positions where that line's execution begins)."""
        path = str(Path(file).resolve())
        bound, why = resolve_line(self.state.program, path, line)
        if bound is None:
            raise RewindError(why)
        tl = self.state.tl
        return bound, line_positions(self.state.program, tl.node_at, tl.end, path, bound)

    # -- where values live, who wrote them -------------------------------------------------------------------
    def locate(self, name: str) -> Placement:
        """Where a value lives now; for a trace, where it lived when the recorded run wrote it."""
        self._require_value(name)
        tl = self.state.tl
        recorded = getattr(tl.driver, "recorded_location", None)
        if recorded is not None:
            rec = tl.log.last_writer(value=name, before=tl.position)
            loc = rec.location if rec is not None else recorded(name)
            if loc is not None:
                return Placement(name, (loc,))
        tensor = tl.physical.get(name) if name in tl.physical else tl.resident(name)
        cursor = self._cursor()
        tiles = cursor.placement(name) if cursor is not None else []
        return Placement(name, placement_of(tl.driver, name, tensor) + tuple(tiles))

    def provenance(self, name: str, max_history: int = 64) -> dict:
        """Who wrote a value (last writer before the position), its write history, and its lineage."""
        self._require_value(name)
        tl = self.state.tl
        last = tl.log.last_writer(value=name, before=tl.position)
        history = tl.log.history(name, before=tl.position)[-max_history:]
        info = self.state.program.values[name]
        return {
            "value": name, "kind": info.kind, "dtype": info.dtype, "shape": list(info.shape),
            "lastWriter": last.to_dict() if last else None,
            "history": [r.to_dict() for r in history],
            "lineage": lineage(self.state.program, name).to_dict(self.state.program),
        }

    def who_wrote(self, address: int) -> WriteRecord | None:
        return self.state.tl.log.last_writer(address=address, before=self.state.tl.position)

    def value_at(self, address: int, position: Tick | None = None) -> dict:
        """Which value lives at device address `address` at a position (now by default): the reverse of `locate`."""
        return occupant(self.state.tl, address, self.state.tl.position if position is None else position)

    # -- memory and edits ----------------------------------------------------------------------------------
    def read_memory(self, name: str, offset: int, count: int) -> bytes:
        self._require_value(name)
        tl = self.state.tl
        tensor = tl.physical[name] if name in tl.physical else tl.value(name)
        size = tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()
        start, stop = max(0, offset), min(size, offset + count)
        return tl.driver.read(tensor, start, stop - start) if stop > start else b""

    def write_memory(self, name: str, offset: int, data: bytes) -> int:
        """Overwrite bytes of a value at the position: a recorded edit, undone by stepping back."""
        self._require_value(name)
        tl = self.state.tl
        tensor = tl.value(name)
        size = tensor.numel() * tensor.element_size()
        if offset < 0 or offset + len(data) > size:
            raise RewindError(f"write of {len(data)} bytes at offset {offset} is outside '{name}' ({size} bytes)")
        tick = tl.edit(name, offset, data, f"write {len(data)} bytes at +{offset}")
        self.breakpoints.invalidate_conditions()
        return tick

    def set_element(self, name: str, index: tuple[int, ...], value: float) -> int:
        """Set one element (a setVariable): encoded in the value's dtype and written as an edit."""
        tensor = self.tensor(name)
        if not tensor.is_contiguous():
            raise RewindError(f"'{name}' is a strided view; set the element on the value it views")
        flat = 0
        for i, (ix, size) in enumerate(zip(index, tensor.shape)):
            if not -size <= ix < size:
                raise RewindError(f"index {ix} is out of range for dimension {i} of '{name}' (size {size})")
            flat = flat * size + (ix % size)
        if len(index) != tensor.dim():
            raise RewindError(f"'{name}' has {tensor.dim()} dimensions; got an index of {len(index)}")
        try:
            encoded = torch.tensor([value], dtype=tensor.dtype)
        except (RuntimeError, OverflowError, TypeError, ValueError):
            dtype = str(tensor.dtype).removeprefix("torch.")
            shown = str(value) if len(str(value)) <= 40 else f"a number of {len(str(value))} digits"
            raise RewindError(f"{shown} does not fit in an element of '{name}' ({dtype})") from None
        data = encoded.view(torch.uint8).numpy().tobytes()  # bfloat16 too
        return self.write_memory(name, flat * tensor.element_size(), data)


class _LazyValues(Mapping):
    def __init__(self, tl: Timeline, position: Tick, aliases: dict[str, str]):
        self.tl, self.position, self.aliases = tl, position, aliases

    def __getitem__(self, name: str) -> Any:
        name = self.aliases.get(name, name)
        if name not in self.tl.program.values or self.tl.version_at(name, self.position) is None:
            raise KeyError(name)
        return self.tl.value(name, self.position)

    def __iter__(self):
        return iter(list(self.aliases) + self.tl.defined(self.position))

    def __len__(self) -> int:
        return len(self.aliases) + len(self.tl.defined(self.position))
