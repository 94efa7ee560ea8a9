"""What the Session shows at its position: stack frames, source variables, values and their stats, where a
value physically lives and who wrote it, expressions; and edits, which write a value's bytes as a step of
their own (undone by stepping back over it).

In a training Program the top frame says the step, and an optimizer node's reads as its update ("AdamW update of
l1.weight (step 3)"); `grad(l1.weight)` names the gradient of a parameter in the step of the position (its module
path, a variable bound to it, or its Program value), wherever a value's name goes.
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from hardware.driver import placement_of
from hardware.errors import ExpressionError, RewindError, echo
from hardware.events import ProgressAfter
from hardware.expressions import (PROGRAM_VALUE, UndefinedNameError, evaluate, expression_names, gradient_path,
                                  truth)
from hardware.memory import Placement
from hardware.program import Node, Program, module_path_text
from hardware.session.address_map import occupant
from hardware.session.breakpoints import BreakpointTable, line_positions, resolve_line
from hardware.session.state import FrameInfo, SessionState
from hardware.source_names import Event, Instance, SourceScopes, flatten, source_scopes
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
        self._scopes: SourceScopes | None = None
        self._interrupt = threading.Event()  # set by interrupt() from any thread; stops the running evaluation

    def bind(self, program: Program) -> None:
        """After a launch: the source variable names of the new Program (and no stop of the previous run)."""
        self._scopes = source_scopes(program)
        self.state.last_stop = None

    # -- frames and names ----------------------------------------------------------------------------
    def current_node(self) -> Node | None:
        """The node about to run at the position (None at the end, or before a user's edit)."""
        return self.state.tl.node_at(self.state.tl.position)

    def _shown(self) -> tuple[int, str, int]:
        """The tick whose node the stack shows, what to add to its name, and how many of its frames the stack shows
        (outermost first). The node about to run, its frames out to the one a step stopped in (a call line shows
        the caller: SessionState.shown_frames); right after a write the Session stopped for (a data breakpoint, a
        NaN, an Inf, a divergence), the node that wrote, `(after write)`; at the end, the last node (it has run).
        On a many-core chip a unit's stack stays at its next instruction."""
        tl = self.state.tl
        if self._cursor() is None and self.state.stopped_after_write():
            tick = tl.position - 1
            return tick, " (after write)", len(self.state.frames_at(tick))
        if tl.position >= tl.end:
            return tl.end - 1, "", len(self.state.frames_at(tl.end - 1)) if tl.end else 0
        return tl.position, "", len(self.state.shown_frames(tl.position))

    def frame_node(self) -> Node | None:
        """The node the top frame shows (about to run, or, after a write the Session stopped for and at the end,
        just run)."""
        tick, _, _ = self._shown()
        return self.state.tl.node_at(tick) if tick >= 0 else None

    def frames(self, unit: int | None = None) -> list[FrameInfo]:
        """The node at its source line, then the enclosing module forward frames, innermost first; for a
        unit of a many-core chip, its next instruction first."""
        cursor = self._cursor()
        if unit and cursor is not None:
            return cursor.unit_frame(unit, self.frames())
        tl = self.state.tl
        tick, after, depth = self._shown()
        node = tl.node_at(tick) if tick >= 0 else None
        if node is None:
            return self._edit_frames(tick, after)
        out = []
        forward = tl.program.forward_node(node)  # a backward node's frames are those of the node it differentiates
        step = self.state.step_of(tick)
        in_step = f" (step {step})" if step is not None else ""
        for i, frame in enumerate(reversed(node.frames[:depth])):
            where = frame.module_path if frame.module_path is not None else ""
            if i == 0:
                name = f"{node.name}{after} ({node.op_short}) [{where or '<root>'}]{in_step}"
            else:
                name = f"{frame.module_class or ''}.{frame.loc.function} [{where or '<root>'}]".lstrip(".")
            if forward is not None:
                name = f"grad of {forward.name}: {name}" if i == 0 else f"grad of {name}"
            out.append(FrameInfo(i, name, frame.loc.file, frame.loc.line, frame.module_path))
        if not out:  # a node with no source line: an optimizer's, read as the update it is part of
            label = f"{node.name}{after} ({node.op_short})"
            label = f"{self.state.update_of(node)}{in_step}: {label}" if node.phase == "optimizer" else label + in_step
            out.append(FrameInfo(0, label, None, None, node.module_path))
        return out

    def _edit_frames(self, tick: Tick, after: str) -> list[FrameInfo]:
        """A user's edit at `tick`, at the line of the node that computed the edited value (of the node about to run
        after it, for an input or a parameter), the frames of that node around it."""
        tl = self.state.tl
        step = tl.step_at(tick) if tick >= 0 else None
        if step is None or step.edit is None:
            return [FrameInfo(0, "<start>", None, None, None)]
        label = f"edit of {step.edit.value}{after}"
        anchor = self._edit_anchor(tick)
        if anchor is None or not anchor.frames:
            return [FrameInfo(0, label, None, None, None)]
        return [FrameInfo(i, label if i == 0 else f"{f.module_class or ''}.{f.loc.function} "
                          f"[{f.module_path or '<root>'}]".lstrip("."), f.loc.file, f.loc.line, f.module_path)
                for i, f in enumerate(reversed(anchor.frames))]

    def _edit_anchor(self, tick: Tick) -> Node | None:
        """The node whose line an edit at `tick` is shown at: the edited value's producer, else the next node."""
        tl = self.state.tl
        step = tl.step_at(tick)
        if step is None or step.edit is None:
            return tl.node_at(tick) if tick >= 0 else None
        producer = tl.program.values[step.edit.value].producer
        if producer is not None:
            return tl.program.nodes[producer]
        later = next((tl.node_at(t) for t in range(tick + 1, tl.end) if tl.node_at(t) is not None), None)
        return later

    def _frame(self, position: Tick | None, level: int) -> tuple[Node | None, Instance | None, int, int]:
        """(the node whose stack has frame `level`, that frame's instance, the position names are read at, how many
        frames the stack has). Without a position: the stack shown now (`frames`); with one, the stack of the node
        about to run there (the last node's at the end)."""
        tl = self.state.tl
        if position is None:
            tick, _, depth = self._shown()
            pos = tl.position
        else:
            pos = position
            tick = pos if pos < tl.end else tl.end - 1
            depth = len(self.state.frames_at(tick)) if tick >= 0 else 0
        node = self._edit_anchor(tick) if tick >= 0 else None
        if node is not None and tl.node_at(tick) is None:  # an edit: named as at the edited value's line
            depth = len(node.frames)
        if node is None or self._scopes is None or not 0 <= level < depth:
            return node, None, pos, depth
        ids = self._scopes.node_instances[node.index]
        if len(ids) != depth:  # frames no instance was built for: the values by name only
            return node, None, pos, depth
        return node, self._scopes.instances[ids[depth - 1 - level]], pos, depth

    def _bound(self, instance: Instance, position: int) -> dict[str, Event]:
        """The names an instance has bound when `position` steps have run: name -> the binding that holds."""
        node_tick = self.state.tl.node_tick
        return self._scopes.visible(instance, lambda after: after < 0 or node_tick[after] < position)

    def names_at(self, position: Tick | None = None, level: int = 0) -> Mapping[str, Any]:
        """Name -> tensor at a position, materialised lazily (for expressions): the source variables of frame
        `level` of the stack as Python scopes them, then every value by its Program name (`div_1`). A variable of
        that frame not assigned yet, or a variable of another frame, is not defined there, even where a Program
        value (an input) has its name."""
        return _LazyValues(self, position, level)

    def source_names(self, position: Tick | None = None, level: int = 0) -> dict[str, str]:
        """Source variable -> value name in one frame on the stack (0 = innermost), as Python scopes them:
        the latest binding in that frame instance before the position (its parameters from its start)."""
        _node, instance, pos, _depth = self._frame(position, level)
        if instance is None:
            return {}
        return {name: e.binding for name, e in self._bound(instance, pos).items() if isinstance(e.binding, str)}

    def frame_arguments(self, level: int = 0) -> dict[str, str]:
        """The parameters of frame `level` (a module's forward, a function) bound to the tensors it was called
        with, in the signature's order."""
        _node, instance, _pos, _depth = self._frame(None, level)
        if instance is None:
            return {}
        return {name: value for name, value in instance.arguments.items() if isinstance(value, str)}

    def resolve(self, name: str, level: int = 0) -> str | None:
        """The Program value a name the user typed means in frame `level` now: a source variable bound to a
        tensor, else a Program value. None when it is neither; a RewindError saying why for a name that is a
        variable here (or of another frame) but holds no single tensor now. `$name` is the Program value `name`,
        whatever the frame's variables are called."""
        if name.startswith(PROGRAM_VALUE):
            self._require_value(name[1:])
            return name[1:]
        path = gradient_path(name)
        if path is not None:
            return self.gradient(path, level=level)
        binding = _Scope(self, None, level).lookup(name)
        if binding is _UNKNOWN:
            return None
        if isinstance(binding, (tuple, dict)):
            parts = list(flatten(binding.values() if isinstance(binding, dict) else binding))
            shown = ", ".join(parts[:4]) + (", …" if len(parts) > 4 else "")
            raise RewindError(f"'{echo(name)}' is not one tensor: it holds {len(binding)} values"
                              f"{f' ({shown})' if shown else ''}; name one of them")
        return binding

    # -- gradients (a training Program) ----------------------------------------------------------------
    def gradients(self) -> dict[str, str]:
        """Each parameter's gradient in the training step of the position (as the stack shows it), by the
        parameter's module path (`l1.weight`): {} for an inference pass."""
        program = self.state.program
        step = self._step(None)
        if step is None:
            return {}
        return {program.values[p].target or p: g for p, g in program.gradients[step].items()}

    def gradient(self, path: str, position: Tick | None = None, level: int = 0) -> str:
        """The gradient value of a parameter in the training step of the position (or of `position`). `path` is
        the parameter's module path (`l1.weight`, `layers[1].q.weight`, or from the user's variable:
        `model.l1.weight`), a variable of frame `level` bound to it, or its Program value (`p_l1_weight`,
        `$p_l1_weight`)."""
        program = self.state.program
        step = self._step(position)
        if step is None:
            raise RewindError(f"grad({echo(path)}): this program is one inference pass, with no gradients; a "
                              "training step has them (entry train_step)")
        param = self._parameter(path, level)
        grad = program.gradients[step].get(param)
        if grad is None:
            raise RewindError(f"'{echo(path)}' has no gradient: the loss does not depend on it")
        return grad

    def _step(self, position: Tick | None) -> int | None:
        """The training step of `position` (default: the position the stack shows); None for an inference pass."""
        return self.state.step_of(self._shown()[0] if position is None else position)

    def _parameter(self, path: str, level: int) -> str:
        """The Program value of a parameter named as `gradient` takes it."""
        values = self.state.program.values
        params = {n: info.target or n for n, info in values.items() if info.kind == "parameter"}
        by_path = {t: n for n, t in params.items()}
        text = module_path_text(path)
        candidates = [path.removeprefix(PROGRAM_VALUE), by_path.get(text), by_path.get(text.partition(".")[2])]
        if not path.startswith(PROGRAM_VALUE):
            try:  # a variable of the frame bound to the parameter
                candidates.append(_Scope(self, None, level).lookup(path))
            except ExpressionError:
                pass
        found = next((c for c in candidates if isinstance(c, str) and c in params), None)
        if found is not None:
            return found
        close = difflib.get_close_matches(text, list(by_path), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else f" (its parameters: {_listed(list(by_path))})"
        raise RewindError(f"'{echo(path)}' is not a parameter of the model{hint}")

    def evaluate(self, expression: str, level: int = 0, position: Tick | None = None) -> Any:
        """A safe expression over the values at the position (or at `position`, as the stack there sees them);
        source variables as stack frame `level` sees them.

        `interrupt()` from another thread stops it between two operations (an ExpressionError)."""
        stop = self._interrupt
        stop.clear()  # an interrupt meant for an earlier evaluation is not this one's
        try:
            if position is not None:
                self._recorded_through(position)
            return evaluate(expression, self.names_at(position, level), stop=stop.is_set)
        finally:
            stop.clear()

    def find(self, expression: str, start: Tick, limit: int) -> "Scan":
        """The first position from `start` (at most `limit` positions) where `expression` holds, read as the
        innermost frame there sees it. A position where a name of it is not defined yet is skipped; a name that is
        nowhere in the program, or any other failure, is an error at once. `interrupt()` stops the scan."""
        self._require_names(expression)
        tl, stop = self.state.tl, self._interrupt
        if not 0 <= start <= tl.end:
            raise RewindError(f"tick {start} is outside the run (0..{tl.end})")
        last = min(tl.end, start + limit - 1)
        progress = ProgressAfter(self.state.on_event)
        skipped, reason = 0, None
        stop.clear()
        here = tl.position
        try:
            for q in range(start, last + 1):
                if q > tl.frontier:
                    tl.seek(q)  # run ahead as far as the scan has come; back to `here` once, at the end
                try:
                    if truth(evaluate(expression, self.names_at(q), stop=stop.is_set)):
                        return Scan(start, q, q, skipped, reason)
                except UndefinedNameError as exc:
                    skipped, reason = skipped + 1, reason or f"at tick {q}: {exc}"
                progress(f"find: tick {q} of {last}", q - start, last - start + 1)
        finally:
            stop.clear()
            if tl.position != here:
                tl.seek(here)
        return Scan(start, last, None, skipped, reason)

    def _require_names(self, expression: str) -> None:
        """Every name of `expression` is somewhere in the program: a source variable or a value."""
        program, scopes = self.state.program, self._scopes
        for name, value in expression_names(expression):
            path = gradient_path(name)
            if path is not None:
                self._parameter(path, 0)
            elif name not in program.values and (value or scopes is None or name not in scopes.names):
                what = "value" if value else "variable or value"
                raise ExpressionError(f"'{PROGRAM_VALUE if value else ''}{echo(name)}' is not a {what} of the "
                                      "program")

    def _recorded_through(self, position: Tick) -> None:
        """Run the pass up to `position` if it has not been there yet (the write log and values exist from then)."""
        tl = self.state.tl
        if not 0 <= position <= tl.end:
            raise RewindError(f"tick {position} is outside the run (0..{tl.end})")
        tl.record_through(position)

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

    def history(self, name: str) -> tuple[list[str], list[dict]]:
        """Every write, over the whole run, to the values a source variable is bound to anywhere in the program
        (`$name`, or a name no variable has: to that Program value), oldest first, each with its stats (a view's
        computed from what it views). Returns (the values, the writes)."""
        values = self._bound_anywhere(name)
        tl = self.state.tl
        tl.record_through()
        writes = sorted((r for v in values for r in tl.log.history(v)), key=lambda r: r.index)
        return values, [self._write(r) for r in writes]

    def _bound_anywhere(self, name: str) -> list[str]:
        scopes, values = self._scopes, self.state.program.values
        if name.startswith(PROGRAM_VALUE):
            self._require_value(name[1:])
            return [name[1:]]
        bound = scopes.bindings(name) if scopes is not None else []
        if bound:
            return bound
        if name in values:
            return [name]
        raise RewindError(f"'{echo(name)}' is not a variable or value of the program")

    def _write(self, record: WriteRecord) -> dict:
        written = record.to_dict()
        if record.kind == "view":  # it wrote no memory of its own: its stats are those of what it shows
            written.pop("statsReason", None)
            written["stats"] = self.value_stats(record.value, record.tick + 1)
        return written

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


def _listed(names: list[str], shown: int = 6) -> str:
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


@dataclass(frozen=True)
class Scan:
    """Where `Inspection.find` looked (positions first..last) and what it found."""

    first: Tick
    last: Tick
    tick: Tick | None  # the first position where the expression holds; None: nowhere in first..last
    skipped: int  # positions where a name of the expression was not defined yet
    skip_reason: str | None  # why the first of them was skipped


_UNKNOWN = object()  # a name that is neither a variable here nor a Program value


class _Scope:
    """What one name means in one frame at one position (Inspection.names_at, Inspection.resolve)."""

    def __init__(self, inspection: Inspection, position: Tick | None, level: int):
        self.inspection = inspection
        self.tl = inspection.state.tl
        self.node, self.instance, self.position, self.depth = inspection._frame(position, level)
        self.explicit, self.level = position is not None, level
        self.bound = inspection._bound(self.instance, self.position) if self.instance is not None else {}

    def lookup(self, name: str) -> Any:
        """A value name, a tuple or dict of them, or _UNKNOWN; an ExpressionError for a variable not defined
        here (or holding nothing Rewind follows)."""
        event = self.bound.get(name)
        if event is not None:
            if event.binding is None:
                raise ExpressionError(
                    f"name '{echo(name)}' holds no tensor Rewind can show at this tick: line {event.line} of "
                    f"{self.instance.title} gave it something else (a shape, a dtype, None) or a result Rewind "
                    "cannot tell")
            return event.binding
        values = self.tl.program.values
        if self.instance is not None and name in self.instance.names():
            line = self.instance.function.first_line.get(name)
            assigns = f"line {line} assigns it and has not run yet" if line else "it is not assigned yet"
            raise UndefinedNameError(f"name '{echo(name)}' is not defined at this tick in {self.instance.title}: "
                                     f"{assigns}")
        scopes = self.inspection._scopes
        info = values.get(name)
        if info is not None and not (info.kind == "input" and scopes is not None and name in scopes.names):
            return name
        if scopes is not None and name in scopes.names:
            where = f" in {self.instance.title}" if self.instance is not None else ""
            raise UndefinedNameError(f"name '{echo(name)}' is not defined at this tick{where}"
                                     f"{self._elsewhere(name)}")
        return _UNKNOWN

    def _elsewhere(self, name: str) -> str:
        """Which frame of the stack shown has the name, as a hint."""
        if self.explicit or self.node is None:
            return ""
        ids = self.inspection._scopes.node_instances[self.node.index]
        for level in range(min(self.depth, len(ids))):
            if level == self.level:
                continue
            instance = self.inspection._scopes.instances[ids[self.depth - 1 - level]]
            event = self.inspection._bound(instance, self.position).get(name)
            if event is not None and isinstance(event.binding, str):
                return f": it is a variable of {instance.title} (frame {level}, a caller)" if level > self.level \
                    else f": it is a variable of {instance.title} (frame {level})"
        return ""


class _LazyValues(Mapping):
    def __init__(self, inspection: Inspection, position: Tick | None, level: int):
        self.scope = _Scope(inspection, position, level)
        self.tl, self.position = self.scope.tl, self.scope.position

    def __getitem__(self, name: str) -> Any:
        if name.startswith(PROGRAM_VALUE):  # `$div`: the Program value, whatever the frame's variables are called
            if name[1:] not in self.tl.program.values:
                raise KeyError(name)
            return self._materialise(name[1:], name)
        path = gradient_path(name)
        binding = self.scope.lookup(name) if path is None else self.scope.inspection.gradient(
            path, self.position if self.scope.explicit else None, self.scope.level)
        if binding is _UNKNOWN:
            raise KeyError(name)
        return self._materialise(binding, name)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name.startswith(PROGRAM_VALUE):
            return name[1:] in self.tl.program.values  # without reading it
        return super().__contains__(name)

    def _materialise(self, binding: Any, name: str) -> Any:
        if isinstance(binding, tuple):
            return tuple(self._materialise(b, name) for b in binding)
        if isinstance(binding, dict):
            return {k: self._materialise(b, name) for k, b in binding.items()}
        if binding is None:
            return None
        if self.tl.version_at(binding, self.position) is None:
            what = f"'{echo(name)}'" + ("" if name == PROGRAM_VALUE + binding else f" ({binding})")
            raise UndefinedNameError(f"name {what} is not written yet at this tick")
        return self.tl.value(binding, self.position)

    def __iter__(self):
        names = [n for n, e in self.scope.bound.items() if isinstance(e.binding, str)]
        return iter(dict.fromkeys(names + self.tl.defined(self.position)))

    def __len__(self) -> int:
        return sum(1 for _ in self)
