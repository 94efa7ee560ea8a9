"""`valueAt`: which value lives at a device address at a tick, the reverse of `locate` (docs/protocol.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dap_server.frames import check_thread
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError, echo

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class ValueAtArguments(StrictArguments):
    address: str | int  # a device address: an integer, or a string "0x7f3a..." (a DAP memory reference)
    tick: int | None = None  # default: the current position
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("valueAt")
def value_at(adapter: "RequestContext", args: ValueAtArguments) -> dict:
    check_thread(adapter, args.threadId)
    session = adapter.session
    tick = session.position if args.tick is None else args.tick
    if not 0 <= tick <= session.end:
        raise RewindError(f"tick {tick} is outside the program (0..{session.end})")
    return session.value_at(_address(args.address), tick)


def _address(address: str | int) -> int:
    value = address
    if isinstance(address, str):
        try:
            value = int(address.strip(), 0) if len(address) <= 40 else None  # 40 characters hold any 64-bit one
        except ValueError:
            value = None
        if value is None:
            raise RewindError(f"'{echo(address)}' is not an address (write it as 0x7f3a... or in decimal)")
    if not 0 <= value < 2**64:
        raise RewindError(f"address {echo(str(value))} is outside the 64-bit address space")
    return value
