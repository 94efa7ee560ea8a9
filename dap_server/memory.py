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
from hardware.errors import RewindError

if TYPE_CHECKING:
    from dap_server.adapter import Adapter

MAX_READ_BYTES = 4 * 2**20  # per request: the response must stay well under the framing cap
_PREFIX = "rewind-value:"


def memory_reference(value: str) -> str:
    return _PREFIX + value


def _value_of(adapter: "Adapter", reference: str) -> str:
    adapter.require_launched()
    value = reference.removeprefix(_PREFIX)
    if not reference.startswith(_PREFIX) or value not in adapter.session.program.values:
        raise RewindError(f"memoryReference '{reference}' does not name a value of the program")
    return value


class ReadMemoryArguments(Arguments):
    memoryReference: str
    offset: int = 0
    count: int


@request("readMemory")
@capability("supportsReadMemoryRequest")
def read_memory(adapter: "Adapter", args: ReadMemoryArguments) -> dict:
    if not 0 <= args.count <= MAX_READ_BYTES:
        raise RewindError(f"readMemory: count {args.count} is outside 0..{MAX_READ_BYTES}; read in chunks")
    address = physical_address(adapter, args.memoryReference)
    if address is not None:  # a chip's physical address (instructions.py)
        return read_physical(adapter, address + args.offset, args.count)
    value = _value_of(adapter, args.memoryReference)
    base = adapter.session.locate(value).shards[0].address
    if args.offset < 0:  # nothing of the value lies before its first byte
        return {"address": f"0x{max(0, base + args.offset):x}", "unreadableBytes": min(args.count, -args.offset)}
    data = adapter.session.read_memory(value, args.offset, args.count)
    body = {"address": f"0x{base + args.offset:x}", "data": base64.b64encode(data).decode("ascii")}
    if len(data) < args.count:
        body["unreadableBytes"] = args.count - len(data)
    return body


class WriteMemoryArguments(Arguments):
    memoryReference: str
    offset: int = 0
    allowPartial: bool = False
    data: str


@request("writeMemory")
@capability("supportsWriteMemoryRequest")
def write_memory(adapter: "Adapter", args: WriteMemoryArguments) -> dict:
    address = physical_address(adapter, args.memoryReference)
    value = _value_of(adapter, args.memoryReference) if address is None else None
    try:
        data = base64.b64decode(args.data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RewindError(f"writeMemory: 'data' is not base64: {exc}") from None
    if address is not None:  # a chip's physical address (instructions.py)
        return write_physical(adapter, address + args.offset, data)
    if args.allowPartial:
        room = len(adapter.session.read_memory(value, args.offset, len(data))) if args.offset >= 0 else 0
        data = data[:room]
    if data:
        adapter.session.write_memory(value, args.offset, data)
        if adapter.client.memory_event:
            adapter.emit("memory", {"memoryReference": args.memoryReference, "offset": args.offset,
                                    "count": len(data)})
        adapter.events.invalidate("variables")
    return {"bytesWritten": len(data)}
