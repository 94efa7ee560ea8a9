"""The Session's instruction-level requests, on a chip whose nodes run as instruction streams (the sim chip):
disassembly, instruction breakpoints, the recorded interleaving, unit states, memory by physical address.
The InstructionCursor (hardware/session/instruction_cursor.py) holds the position inside a node and answers them;
on any other driver they are a clear error.
"""

from __future__ import annotations

from typing import Callable, Iterable

from hardware.errors import RewindError
from hardware.instructions import InstructionDriver
from hardware.session.breakpoints import Breakpoint, BreakpointTable
from hardware.session.exception_filters import ExceptionFilters
from hardware.session.instruction_cursor import InstructionCursor, InstructionSpec
from hardware.session.state import SessionState
from hardware.ticks import Stop, Tick


class InstructionLevel:
    """The Session's instruction level: `cursor` is the position inside a node, None on a node-level driver."""

    def __init__(self, state: SessionState, table: BreakpointTable, exceptions: ExceptionFilters,
                 stopped: Callable[[Stop], Stop], write_value: Callable[[str, int, bytes], int]):
        self.state, self.table = state, table
        self._make_cursor = lambda kept: InstructionCursor(state, table, exceptions, stopped, write_value, kept)
        self.cursor: InstructionCursor | None = None

    def attach(self) -> None:
        """After a launch: a cursor for an instruction-stream driver, keeping the earlier launch's breakpoints."""
        kept = self.cursor.breakpoints + [bp for bps in self.cursor.code_lines.values() for bp in bps] \
            if self.cursor is not None else []
        self.cursor = None
        if isinstance(self.state.tl.driver, InstructionDriver):
            self.cursor = self._make_cursor(kept)

    @property
    def instruction(self) -> int:
        """Steps of the current node's interleaving that have run (0 at a node boundary)."""
        return self.cursor.step if self.cursor is not None else 0

    @property
    def physical_memory(self) -> bool:
        """Does the chip expose its memory by physical address (read_address, write_address, disassemble)?"""
        return self.cursor is not None

    def _cursor(self) -> InstructionCursor:
        if self.cursor is None:
            raise RewindError(f"driver {self.state.tl.driver.name} runs nodes, not instruction streams: "
                              "instruction-level requests need a chip like sim")
        return self.cursor

    def disassemble(self, unit: int, tick: Tick | None = None) -> list[dict]:
        """A unit's instructions in the node at `tick` (default: the current node), each with its source line."""
        return self._cursor().disassemble(unit, tick)

    def has_code_lines(self, file: str) -> bool:
        """Is `file` a file of the chip's own code (a kernel's), whose lines instructions run at?"""
        return self.cursor is not None and self.cursor.has_code_lines(file)

    def set_code_line_breakpoints(self, file: str, specs: Iterable) -> list[Breakpoint]:
        return self._cursor().set_code_line_breakpoints(file, specs)

    def watches(self, value: str) -> bool:
        """Does the chip record the writes of `value` element by element (a kernel's tensor)?"""
        return self.cursor is not None and self.cursor.watches(value)

    def set_element_breakpoints(self, specs: Iterable) -> list[Breakpoint]:
        return self._cursor().set_element_breakpoints(specs)

    def locate_elements(self, name: str) -> dict | None:
        """`locate` of a tensor of the chip's own code or one element of it (`out_ptr[37]`), with what the units did
        to it before the position; None when `name` names none (or the chip records no accesses)."""
        return self.cursor.locate_elements(name) if self.cursor is not None else None

    def set_instruction_breakpoints(self, specs: Iterable[InstructionSpec]) -> list[Breakpoint]:
        """Replace the instruction breakpoints."""
        return self._cursor().set_breakpoints(specs)

    def instruction_at(self, address: int) -> dict:
        """The node (with its tick), unit and instruction index of a code address."""
        where = self._cursor().driver.instruction_at(address)
        if where is None:
            raise RewindError(f"no instruction at {address:#x}")
        node, unit, pc = where
        return {"node": self.state.program.nodes[node].name, "tick": self.state.tl.node_tick[node], "unit": unit, "pc": pc}

    def interleaving(self, tick: Tick | None = None):
        """The recorded Schedule of the node at `tick` (default: the current one): the unit and instruction of
        each of its steps, and the races and hang found there. The node runs first if it never did."""
        tl = self.state.tl
        sched = self._cursor().schedule(tl.position if tick is None else tick)
        if sched is None:
            raise RewindError(f"tick {tl.position if tick is None else tick} runs no node on the chip")
        return sched

    def unit_states(self) -> list:
        """Every unit's next instruction or what it waits on, at the current step of the current node."""
        cursor, tl = self._cursor(), self.state.tl
        if tl.position >= tl.end or tl.node_at(tl.position) is None:
            raise RewindError("no node is running here: step into one")
        return cursor.chip().units()

    def read_address(self, address: int, count: int) -> bytes:
        """Bytes of chip memory at a physical address, as they are at the current position."""
        return self._cursor().read(address, count)

    def write_address(self, address: int, data: bytes) -> int:
        """Write chip memory at a physical address: a recorded edit, undone by stepping back."""
        tick = self._cursor().write(address, data)
        self.table.invalidate_conditions()
        return tick
