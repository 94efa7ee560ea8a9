"""The pipe between the adapter and an engine process: a few typed messages in length-prefixed msgpack frames.

    frame = u32 length (little-endian) + msgpack map

To the engine:   Request   a DAP request the front has framed and checked, as the client sent it
From the engine: Message   a DAP response or event as JSON text without `seq` (the front numbers what the
                           client receives), with what the front needs to route it
                 Recording a recording began: its partial file, the path it goes to when complete, and
                           whether a file there may be replaced

Both sides are ours, but the engine runs the user's code: the front reads its frames with the same care
as a client's (a bounded length, a known kind, typed fields), and a frame it cannot read ends the engine.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, AsyncIterator, Union

import msgpack

LENGTH = struct.Struct("<I")
MAX_FRAME = 64 * 2**20  # an engine's one answer is capped far below this (dispatch.MAX_RESPONSE_BYTES)


class ChannelError(Exception):
    """A frame on the pipe is not one of the messages below."""


@dataclass(frozen=True)
class Request:
    message: dict[str, Any]


@dataclass(frozen=True)
class Message:
    kind: str  # "response" or "event"
    json: bytes
    success: bool | None = None  # of a response
    request_seq: int | None = None
    command: str | None = None
    event: str | None = None


@dataclass(frozen=True)
class Recording:
    partial: str
    target: str
    overwrite: bool  # the user allowed an existing file at `target` to be replaced


Frame = Union[Request, Message, Recording]
_UNPACKABLE = {OverflowError: "a number in the message is beyond 64 bits",
               UnicodeEncodeError: "a string in the message is not valid Unicode (a lone surrogate)"}
_FIELDS: dict[str, tuple[type, dict[str, tuple[type, ...]]]] = {
    "request": (Request, {"message": (dict,)}),
    "message": (Message, {"kind": (str,), "json": (bytes,), "success": (bool, type(None)),
                          "request_seq": (int, type(None)),
                          "command": (str, type(None)), "event": (str, type(None))}),
    "recording": (Recording, {"partial": (str,), "target": (str,), "overwrite": (bool,)}),
}
_TAGS = {cls: tag for tag, (cls, _) in _FIELDS.items()}


def pack(frame: Frame) -> bytes:
    try:
        body = msgpack.packb({"k": _TAGS[type(frame)], **frame.__dict__}, use_bin_type=True)
    except (OverflowError, UnicodeEncodeError, ValueError) as exc:  # what JSON holds and msgpack cannot
        raise ChannelError(_UNPACKABLE.get(type(exc), "the message nests too deeply")) from None
    return LENGTH.pack(len(body)) + body


def unpack(body: bytes) -> Frame:
    try:
        obj = msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several types for bad input
        raise ChannelError(f"a frame does not decode: {exc}") from None
    if not isinstance(obj, dict) or obj.get("k") not in _FIELDS:
        raise ChannelError("a frame of an unknown kind")
    cls, fields = _FIELDS[obj.pop("k")]
    if set(obj) != set(fields) or not all(isinstance(obj[name], types) for name, types in fields.items()):
        raise ChannelError(f"a {cls.__name__} frame with wrong fields")
    return cls(**obj)


async def frames(reader) -> AsyncIterator[Frame]:
    """Every frame from an asyncio StreamReader, until the stream ends (the other process is gone). Reads what
    is there in one go and splits it: a response and the event after it cost one wake-up, not four."""
    buffer = bytearray()
    while True:
        try:
            chunk = await reader.read(1 << 20)
        except ConnectionError:
            return
        if not chunk:
            return
        buffer += chunk
        while len(buffer) >= LENGTH.size:
            (length,) = LENGTH.unpack_from(buffer)
            if length > MAX_FRAME:
                raise ChannelError(f"a frame of {length} bytes is over the {MAX_FRAME // 2**20} MiB limit")
            end = LENGTH.size + length
            if len(buffer) < end:
                break
            body = bytes(buffer[LENGTH.size:end])
            del buffer[:end]
            yield unpack(body)
