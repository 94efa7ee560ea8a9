"""The reverse of `locate`: which value lives at a device address at a tick.

A caching allocator hands one address to many values over a run, so the answer depends on the
tick: the Program's own memory (parameters, inputs, buffers) never moves; other memory holds the
last value the run wrote there before the tick, live if the Program still uses that version then
(else its block was free for reuse); the checkpoint ring's copies (the device pool) hold retained
versions. The allocator's own view of the address (segment, block, stream, pool) is added when the
driver has one; it describes the memory now, not at the tick.
"""

from __future__ import annotations

from typing import Any

from checkpoint.timeline import Timeline
from hardware.driver import allocator_info
from hardware.ticks import Tick


def occupant(tl: Timeline, address: int, position: Tick) -> dict[str, Any]:
    """What is at `address` when `position` steps have run (`found` False when nothing the run knows is)."""
    found = _program_owned(tl, address) or _written(tl, address, position) or _retained(tl, address)
    out: dict[str, Any] = {"address": hex(address), "tick": position, "found": found is not None, **(found or {})}
    allocator = allocator_info(tl.driver, address)
    if allocator:
        out["allocatorNow"] = allocator
    return out


def _program_owned(tl: Timeline, address: int) -> dict[str, Any] | None:
    owned = {name: t for name, t in tl.initial.items() if name not in tl.physical}
    for kind, tensors in (("program value", owned), ("buffer", tl.physical)):
        for name, tensor in tensors.items():
            loc = tl.driver.locate(tensor)
            if loc.contains(address):
                return {"value": name, "kind": kind, "offset": address - loc.address, "live": True,
                        "version": "initial" if kind == "program value" else tl.version_at(name, tl.position)}
    return None


def _written(tl: Timeline, address: int, position: Tick) -> dict[str, Any] | None:
    rec = tl.log.last_writer(address=address, before=position)
    while rec is not None and rec.kind == "view":  # a view wrote nothing: what it views was written earlier
        rec = tl.log.last_writer(address=address, before=rec.tick)
    if rec is None:
        return None
    live = tl.version_at(rec.value, position) == rec.tick and position <= tl.last_use_tick(rec.value)
    return {"value": rec.value, "kind": rec.kind, "version": rec.tick, "writtenBy": rec.node_name,
            "offset": address - rec.location.address, "live": live,
            "retained": (rec.value, rec.tick) in tl.ring and _holds(tl, (rec.value, rec.tick), address)}


def _retained(tl: Timeline, address: int) -> dict[str, Any] | None:
    """A version the ring keeps as a copy (in the device pool), not in the memory the run wrote it to."""
    for key in tl.ring.keys():
        loc = tl.driver.locate(tl.ring.get(key))
        rec = tl.log.last_writer(value=key[0], before=key[1] + 1)
        if loc.contains(address) and (rec is None or rec.location.address != loc.address):
            return {"value": key[0], "kind": "checkpoint copy", "version": key[1], "live": False,
                    "offset": address - loc.address, "retained": True}
    return None


def _holds(tl: Timeline, key: tuple[str, int], address: int) -> bool:
    tensor = tl.ring.get(key)
    return tensor is not None and tl.driver.locate(tensor).contains(address)
