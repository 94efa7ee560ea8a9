"""Instruction-level debugging of a many-core chip (the `sim` driver): disassemble,
setInstructionBreakpoints, the units' states, and chip memory by physical address.

Threads are the chip's units (`core 12 (gang 1)`): `next`/`stepBack` with granularity `instruction`
step one instruction of the thread's unit (with `singleThread`, of that unit alone; node by node, `stepIn` to a
target of `stepInTargets` in dap_server/stepping.py), a unit's stack
trace starts at its next instruction, and a memoryReference of `0x...` is a physical address
(readMemory and writeMemory in memory.py hand those here). The `race` and `hang` exception filters
stop where the driver found them.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from pydantic import Field

from dap_server.frames import check_thread, source
from dap_server.requests import Arguments, StrictArguments, capability, request
from hardware.errors import RewindError, brief, echo
from hardware.session.instruction_cursor import InstructionSpec

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_INSTRUCTIONS = 10_000


def physical_address(adapter: "RequestContext", reference: str) -> int | None:
    """A memoryReference that is a physical address (`0x8000_1000`) of a chip with its own memory map, else None."""
    if not (adapter.launched and adapter.session.physical_memory):
        return None
    return _hex(reference)


def _hex(reference: str) -> int | None:
    if not reference.lower().startswith("0x"):
        return None
    try:
        return int(reference, 16)
    except ValueError:
        raise RewindError(f"memoryReference '{echo(reference)}' is not a hexadecimal address") from None


def read_physical(adapter: "RequestContext", address: int, count: int) -> dict:
    adapter.require_launched()
    try:
        data = adapter.session.read_address(address, count)
    except RewindError as exc:
        if "no memory is mapped" not in str(exc):
            raise
        return {"address": f"{address:#x}", "unreadableBytes": count}
    return {"address": f"{address:#x}", "data": base64.b64encode(data).decode("ascii")}


def write_physical(adapter: "RequestContext", address: int, data: bytes) -> dict:
    adapter.require_launched()
    adapter.session.write_address(address, data)
    adapter.events.invalidate("variables", "stacks")
    return {"bytesWritten": len(data)}


class DisassembleArguments(Arguments):
    memoryReference: str
    offset: int = 0
    instructionOffset: int = 0
    instructionCount: int = Field(ge=0, le=MAX_INSTRUCTIONS)
    resolveSymbols: bool = True


@request("disassemble")
@capability("supportsDisassembleRequest")
def disassemble(adapter: "RequestContext", args: DisassembleArguments) -> dict:
    """A core's instruction stream in one node around a code address, each instruction at its node's line."""
    adapter.require_launched()
    address = _hex(args.memoryReference)
    if address is None:
        raise RewindError(f"disassemble: memoryReference '{echo(args.memoryReference)}' is not a code address "
                          "(take one from a stack frame's instructionPointerReference)")
    if address + args.offset < 0:
        raise RewindError(f"disassemble: {address:#x} with offset {args.offset} is before the first address")
    where = adapter.session.instruction_at(address + args.offset)
    listing = adapter.session.disassemble(where["unit"], where["tick"])
    first = where["pc"] + args.instructionOffset
    base = int(listing[where["pc"]]["address"], 16) - 4 * where["pc"]
    out = []
    for pc in range(first, first + args.instructionCount):
        if 0 <= pc < len(listing):
            out.append(_instruction(adapter, listing[pc], args.resolveSymbols))
        else:  # outside the stream: placeholders keep the count the client asked for
            out.append({"address": f"{max(0, base + 4 * pc):#x}", "instruction": "", "presentationHint": "invalid"})
    return {"instructions": out}


def _instruction(adapter: "RequestContext", item: dict, symbols: bool) -> dict:
    out = {"address": item["address"], "instruction": item["instruction"]}
    if symbols:
        out["symbol"] = f"{item['node']} (tick {item['tick']})"
    if item["source"]:
        out["location"] = source(item["source"]["file"])
        out["line"] = adapter.client_line(item["source"]["line"])
    return out


class InstructionBreakpoint(Arguments):
    instructionReference: str
    offset: int | None = None
    condition: str | None = None
    hitCondition: str | None = None


class SetInstructionBreakpointsArguments(Arguments):
    breakpoints: list[InstructionBreakpoint]


@request("setInstructionBreakpoints")
@capability("supportsInstructionBreakpoints")
def set_instruction_breakpoints(adapter: "RequestContext", args: SetInstructionBreakpointsArguments) -> dict:
    """Stop before a unit executes the instruction at an address; one bad breakpoint is `verified: false`."""
    adapter.require_launched()
    if not args.breakpoints and not adapter.session.physical_memory:
        return {"breakpoints": []}  # VS Code clears them at every launch: a chip that runs nodes has none to clear
    bps = adapter.session.set_instruction_breakpoints(
        [InstructionSpec(b.instructionReference, b.offset or 0, b.condition, b.hitCondition) for b in args.breakpoints])
    out = []
    for bp in bps:
        entry = {"id": bp.id, "verified": bp.verified,
                 "instructionReference": bp.spec if bp.verified else echo(bp.spec, 200)}
        if bp.message:
            entry["message"] = brief(bp.message)
        if bp.line:
            entry["source"], entry["line"] = source(bp.file), adapter.client_line(bp.line)
        out.append(entry)
    return {"breakpoints": out}


class UnitsArguments(StrictArguments):
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("units")
def units(adapter: "RequestContext", args: UnitsArguments) -> dict:
    """Every unit at the position inside the node: next instruction (or what it waits on), and the step."""
    check_thread(adapter, args.threadId)
    session = adapter.session
    names = session.units()
    return {"tick": session.position, "instruction": session.instruction,
            "units": [{"threadId": u.unit + 1, "name": names[u.unit], "pc": u.pc, "status": u.status,
                       "detail": u.detail} for u in session.unit_states()]}
