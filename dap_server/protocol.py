"""DAP's wire format: `Content-Length: N\\r\\n\\r\\n` then N bytes of UTF-8 JSON.

`MessageReader` is a pure state machine fed whatever the transport delivers: a header cut in
two, half a body, three messages at once. Bad input never stops it. A header block without a
usable Content-Length, a body that is not a JSON object, or a message over the size cap comes
out as a `FramingError` (the oversized body is skipped unread); the reader then resynchronises
on the next `Content-Length` header and goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hardware.jsonable import json_safe

MAX_MESSAGE_BYTES = 16 * 2**20
MAX_HEADER_BYTES = 8192
MAX_LENGTH_DIGITS = 12  # a longer Content-Length is no size at all (Python refuses ints past 4300 digits)
MAX_NESTING = 64  # DAP messages nest a few levels; deeper JSON is refused before anything walks it
_HEADER_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)
_NEXT_HEADER = re.compile(rb"content-length[ \t]*:[ \t]*\d{1,12}[ \t]*\r\n(?:[A-Za-z0-9-]+[ \t]*:[^\r\n]*\r\n)*\r\n",
                          re.IGNORECASE)
_HEADER_LINE = re.compile(rb"^[A-Za-z0-9-]+[ \t]*:[^\r\n]*$")


@dataclass(frozen=True)
class FramingError:
    """A part of the input that is not a DAP message; `seq`/`command` when the JSON got that far."""

    message: str
    seq: int | None = None
    command: str | None = None


class MessageReader:
    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES):
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self._body_length: int | None = None
        self._skip = 0  # bytes of an oversized body still to discard
        self._resyncing = False  # after an error, junk before the next header is expected, not reported again
        self._scanned = 0  # how much of an unfinished body was searched for a header already
        self._skip_declared = 0  # the Content-Length of the oversized message being skipped

    @property
    def partial(self) -> bool:
        """A message has begun and is not complete yet."""
        return bool(self._buffer) or self._body_length is not None or self._skip > 0

    def feed(self, data: bytes) -> list[dict[str, Any] | FramingError]:
        """Everything complete in the input so far, in order."""
        self._buffer += data
        out: list[dict[str, Any] | FramingError] = []
        while (item := self._next()) is not None:
            out.append(item)
        return out

    def _next(self) -> dict[str, Any] | FramingError | None:
        if (self._skip or self._body_length is not None) and (cut := self._cut_short()) is not None:
            return cut
        if self._skip:
            n = min(self._skip, len(self._buffer))
            del self._buffer[:n]
            self._skip -= n
            if self._skip:
                return None
        if self._body_length is None:
            return self._read_header()
        if len(self._buffer) < self._body_length:
            return None
        body = bytes(self._buffer[: self._body_length])
        del self._buffer[: self._body_length]
        self._body_length = None
        return decode(body)

    def _cut_short(self) -> FramingError | None:
        """A message header where a body's bytes were expected: the body was shorter than its Content-Length
        said (a JSON text never holds a raw header line), so reading resumes at that header. Only bytes not
        searched before are searched."""
        expected = self._skip or self._body_length or 0
        end = min(len(self._buffer), expected)
        match = _NEXT_HEADER.search(self._buffer, max(0, self._scanned - 64), end)
        self._scanned = 0 if self._skip else end  # a skipped body's bytes are dropped as they come
        if match is None:
            return None
        declared = self._skip_declared if self._skip else self._body_length
        del self._buffer[: match.start()]
        self._skip, self._body_length, self._scanned = 0, None, 0
        return FramingError(f"a message ended before the {declared} bytes its Content-Length announced: it was "
                            "discarded and reading went on at the next header")

    def _read_header(self) -> FramingError | None:
        end = self._buffer.find(_HEADER_END)
        if end < 0:
            if len(self._buffer) <= MAX_HEADER_BYTES:
                return None
            return self._discard_junk()
        block = bytes(self._buffer[:end])
        del self._buffer[: end + len(_HEADER_END)]
        matches = list(_CONTENT_LENGTH.finditer(block))
        if not matches:
            return self._error(f"a header block without Content-Length was discarded: {_preview(block)}")
        match = matches[-1]
        junk = block[: match.start()].rstrip(b"\r\n")
        value = match[1].strip()
        if not value.isdigit():
            return self._error(f"malformed Content-Length {_preview(value)}: the message was discarded")
        if len(value) > MAX_LENGTH_DIGITS:
            return self._error(f"a Content-Length of {len(value)} digits is not a message size: the header was "
                               "discarded")
        length = int(value)
        self._scanned = 0
        if length > self.max_bytes:
            self._skip = self._skip_declared = length
            return self._error(f"a message of {length} bytes exceeds the {self.max_bytes // 2**20} MiB limit "
                               "and was skipped")
        self._body_length = length
        report = junk and not self._resyncing and not all(_HEADER_LINE.match(ln) for ln in junk.split(b"\r\n"))
        self._resyncing = False
        if report:
            return FramingError(f"{len(junk)} bytes before a header were discarded: {_preview(junk)}")
        return self._next()

    def _discard_junk(self) -> FramingError | None:
        """No header end within the limit: drop all but a possible header start, report once."""
        match = None
        for match in _CONTENT_LENGTH.finditer(self._buffer):
            pass
        keep_from = match.start() if match and match.start() > 0 else len(self._buffer) - 32
        dropped = bytes(self._buffer[:keep_from])
        del self._buffer[:keep_from]
        if self._resyncing:
            return self._next() if match else None
        return self._error(f"{len(dropped)} bytes without a message header were discarded: {_preview(dropped)}")

    def _error(self, message: str) -> FramingError:
        self._resyncing = True
        return FramingError(message)


def decode(body: bytes) -> dict[str, Any] | FramingError:
    seq, command = _salvage(body)
    try:
        if _nesting(body) > MAX_NESTING:
            return FramingError(f"a message nested more than {MAX_NESTING} levels deep was refused", seq, command)
        message = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return FramingError(f"a message body is not UTF-8 text (byte {exc.start}): {_preview(body)}", seq, command)
    except ValueError as exc:
        return FramingError(f"invalid JSON in a message body ({exc}): {_preview(body)}", seq, command)
    if not isinstance(message, dict):
        return FramingError(f"a message must be a JSON object, got {JSON_KINDS.get(type(message), 'a value')}")
    seq, command = message.get("seq"), message.get("command")
    # 0 too (nvim-dap 0.6 starts there, and debugpy answers it); below 0 are the front's own (server.py's replays)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        return FramingError(f"a message needs a whole-number 'seq' of 0 or more, got {json.dumps(seq)[:40]}",
                            seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
                            command=command if isinstance(command, str) else None)
    if message.get("type") != "request" or not isinstance(command, str):
        kind = message.get("type")
        return FramingError(f"expected a request with a string 'command', got type {kind!r} command {command!r}",
                            seq=seq, command=command if isinstance(command, str) else "")
    return message


JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")
_SEQ = re.compile(rb'"seq"\s*:\s*(-?\d{1,15})\b')
_COMMAND = re.compile(rb'"command"\s*:\s*"([A-Za-z0-9_]{1,64})"')


def _salvage(body: bytes) -> tuple[int | None, str | None]:
    """`seq` and `command` read from the raw text of a body that may not parse, so it can still be answered."""
    seq, command = _SEQ.search(body[:4096]), _COMMAND.search(body[:4096])
    return (int(seq[1]) if seq else None), (command[1].decode() if command else None)


def _nesting(body: bytes) -> int:
    """The deepest bracket nesting of a JSON text, brackets inside strings ignored (no recursion)."""
    if body.count(b"[") + body.count(b"{") <= MAX_NESTING:
        return 0  # too few brackets to nest deeply: the common case costs two counts
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_STRING.sub(b'""', body)):
        depth += 1 if bracket[0] in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def encode_body(message: dict[str, Any]) -> bytes:
    """A message as JSON text. JSON has no NaN or Infinity: such floats are sent as the strings "nan", "inf",
    "-inf"."""
    try:
        text = json.dumps(message, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(json_safe(message), separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")


ERROR_ID = 1


def response(request: dict[str, Any], body: Any = None) -> dict[str, Any]:
    """A successful response to `request` (no `seq`: the front numbers what the client receives)."""
    return {"type": "response", "request_seq": request["seq"], "command": request["command"], "success": True,
            **({} if body is None else {"body": body})}


def error_response(request: dict[str, Any], text: str, command: str, show_user: bool = True) -> dict[str, Any]:
    """A failed response: `message` and `body.error.format` are the same plain sentence; `show_user` False for a
    refusal the user did nothing to cause (the editor asked for what a motion had just cleared)."""
    return {"type": "response", "request_seq": request["seq"], "command": command, "success": False,
            "message": text, "body": {"error": {"id": ERROR_ID, "format": text, "showUser": show_user}}}


def event(name: str, body: Any = None) -> dict[str, Any]:
    return {"type": "event", "event": name, **({} if body is None else {"body": body})}


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def encode(message: dict[str, Any]) -> bytes:
    """Frame a message (its `seq` included)."""
    return frame(encode_body(message))


def with_seq(seq: int, body: bytes) -> bytes:
    """The JSON text of a message that has no `seq` yet, with `seq` as its first field."""
    return b'{"seq":%d,' % seq + body[1:] if body != b"{}" else b'{"seq":%d}' % seq


def _preview(data: bytes, limit: int = 60) -> str:
    text = data[:limit].decode("utf-8", "replace")
    return repr(text) + ("…" if len(data) > limit else "")
