"""readMemory, writeMemory: the bytes of a value's storage, through an opaque memoryReference.

A memoryReference names a Program value, so it stays valid across stops; the bytes are those
the value holds at the current position (a write is a recorded edit, undone by stepping back).
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

from dap_server.instructions import physical_address, read_physical, write_physical
from dap_server.requests import Arguments, capability, request
from hardware.errors import RewindError, echo

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_READ_BYTES = 4 * 2**20  # per request: the response must stay well under the framing cap
MAX_ADDRESS = 2**64  # addresses are 64-bit: past that nothing is mapped
_PREFIX = "rewind-value:"


def memory_reference(value: str) -> str:
    return _PREFIX + value


def _value_of(adapter: "RequestContext", reference: str) -> str:
    adapter.require_launched()
    value = reference.removeprefix(_PREFIX)
    if not reference.startswith(_PREFIX) or value not in adapter.session.program.values:
        raise RewindError(f"memoryReference '{echo(reference)}' does not name a value of the program")
    return value


class ReadMemoryArguments(Arguments):
    memoryReference: str
    offset: int = 0
    count: int


@request("readMemory")
@capability("supportsReadMemoryRequest")
def read_memory(adapter: "RequestContext", args: ReadMemoryArguments) -> dict:
    """The bytes asked for that exist; past the end of what exists, `unreadableBytes` counts the rest (DAP's
    way to say "nothing there"). A read of more than MAX_READ_BYTES that exists is refused: read in chunks."""
    if args.count < 0:
        raise RewindError(f"readMemory: count {args.count} is negative")
    address = physical_address(adapter, args.memoryReference)
    if address is not None:  # a chip's physical address (instructions.py)
        start = address + args.offset
        if not 0 <= start < MAX_ADDRESS:
            return {"address": f"{min(max(start, 0), MAX_ADDRESS - 1):#x}", "unreadableBytes": args.count}
        if args.count > MAX_READ_BYTES:
            raise _too_many(args.count)
        return read_physical(adapter, start, min(args.count, MAX_ADDRESS - start))
    value = _value_of(adapter, args.memoryReference)
    base = adapter.session.locate(value).shards[0].address
    if args.offset < 0:  # nothing of the value lies before its first byte
        return {"address": f"0x{max(0, base + args.offset):x}", "unreadableBytes": min(args.count, -args.offset)}
    data = adapter.session.read_memory(value, args.offset, min(args.count, MAX_READ_BYTES + 1))
    if len(data) > MAX_READ_BYTES:
        raise _too_many(args.count)
    body = {"address": f"0x{base + args.offset:x}", "data": base64.b64encode(data).decode("ascii")}
    if len(data) < args.count:
        body["unreadableBytes"] = args.count - len(data)
    return body


def _too_many(count: int) -> RewindError:
    return RewindError(f"readMemory: {count} bytes asked; one read returns at most {MAX_READ_BYTES // 2**20} MiB: "
                       "read in chunks")


class WriteMemoryArguments(Arguments):
    memoryReference: str
    offset: int = 0
    allowPartial: bool = False
    data: str


@request("writeMemory")
@capability("supportsWriteMemoryRequest")
def write_memory(adapter: "RequestContext", args: WriteMemoryArguments) -> dict:
    address = physical_address(adapter, args.memoryReference)
    value = _value_of(adapter, args.memoryReference) if address is None else None
    try:
        data = base64.b64decode(args.data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RewindError(f"writeMemory: 'data' is not base64 ({str(exc).rstrip('.')})") from None
    if address is not None:  # a chip's physical address (instructions.py)
        start = address + args.offset
        if not 0 <= start or start + len(data) > MAX_ADDRESS:
            raise RewindError(f"writeMemory: {len(data)} bytes at {start:#x} lie outside the chip's 64-bit addresses")
        return write_physical(adapter, start, data)
    if args.allowPartial:
        room = len(adapter.session.read_memory(value, args.offset, len(data))) if args.offset >= 0 else 0
        data = data[:room]
    if data:
        adapter.session.write_memory(value, args.offset, data)
        if adapter.client.memory_event:
            adapter.emit("memory", {"memoryReference": args.memoryReference, "offset": args.offset,
                                    "count": len(data)})
        adapter.resume(lambda: adapter.session.after_edit(value), "Editing")  # the edit is a step: a stop
    return {"bytesWritten": len(data)}
