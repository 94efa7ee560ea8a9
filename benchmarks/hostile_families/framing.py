"""framing: malformed frames over stdio and TCP, each followed by a `threads` request.

Tries bad, huge, negative and 5000-digit Content-Lengths, header junk (no colon, 8 KiB of headers, 20 KiB of
random bytes, an HTTP request, a TLS hello), invalid UTF-8 and JSON, 1000-level nesting, non-objects, messages
missing seq or command, oversized bodies, split writes, frames that never complete (TCP only: the server's
--frame-timeout must close them), and seeded random ones (bytes flipped, cut, inserted, lengths off).

Handled: `threads` is answered afterwards, and every request the bytes carry is answered or refused with a message.
Crash: the server exits or the connection dies (an incomplete frame closed by the frame timeout is expected).
Hang: `threads` not answered within --timeout, or an incomplete frame's connection still open 15 s past the
frame timeout. Leak: an answer names a Python exception class the bytes did not contain.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

from .common import Crash, Family, Hang, Outcome, Server, SetupError, Wire, body, framed, goodbye, initialize, \
    preview, random_json

TITLE = "framing (stdio + TCP)"
BUDGET_S = (90, 25)  # (default, --quick) seconds
FRAME_TIMEOUT = 3.0  # and a 60 s handshake timeout: the blocking inputs are sent before any initialize


@dataclass
class Frames:
    label: str
    chunks: list[bytes]
    recipe: str  # how to build the bytes, for the repro
    pause: float = 0.0  # between chunks
    blocks: bool = False  # leaves the stream waiting for bytes that never come (TCP only: its frame timeout ends it)


class Inputs(list):
    def add(self, label: str, data: bytes | list[bytes], recipe: str, **kw: Any) -> None:
        self.append(Frames(label, data if isinstance(data, list) else [data], recipe, **kw))


def framing_inputs(rng: random.Random, randoms: int) -> list[Frames]:
    T = body()
    out = Inputs()
    bad_lengths(out, T)
    header_junk(out, T, rng)
    bad_bodies(out, T)
    bad_messages(out)
    split_and_short(out, T)
    for i in range(randoms):
        out.append(random_frame(rng, i))
    return out


def bad_lengths(out: Inputs, T: bytes) -> None:
    for value in [b"abc", b"-1", b"-100000", b"0x10", b"1e3", b"", b" ", b"+5", b"1.5", b"\xff\xfe", b"12\x0034",
                  b"\xef\xbc\x91\xef\xbc\x92", b"9" * 13, b"00000000000000000047", b"9" * 5000, b"-" + b"9" * 5000,
                  b"1" * 4301, b"0"]:
        out.add(f"Content-Length {preview(value, 40)}", b"Content-Length: " + value + b"\r\n\r\n" + T,
                f"b'Content-Length: ' + {preview(value, 60)} + b'\\r\\n\\r\\n' + <a threads request body>")
    out.add("Content-Length 0 then a body", framed(b"", 0) + T, "framed(b'', 0) + <threads body>")
    out.add("no Content-Length header", b"Content-Type: application/json\r\n\r\n" + T, "Content-Type header only")
    out.add("two Content-Lengths, the last right", b"Content-Length: 5\r\nContent-Length: %d\r\n\r\n" % len(T) + T,
            "two headers")
    out.add("lower-case header, tab", b"content-length:\t%d\r\n\r\n" % len(T) + T, "content-length:\\t")
    out.add("space before the colon", b"Content-Length : %d\r\n\r\n" % len(T) + T, "Content-Length : N")
    out.add("LF-only header", b"Content-Length: %d\n\n" % len(T) + T, "Content-Length: N\\n\\n")


def header_junk(out: Inputs, T: bytes, rng: random.Random) -> None:
    out.add("header line without a colon", b"Garbage line\r\n" + framed(T), "b'Garbage line\\r\\n' + frame")
    out.add("8 KiB of header lines", b"X-A: b\r\n" * 1200 + framed(T), "b'X-A: b\\r\\n' * 1200 + frame")
    out.add("20 KiB of junk with no header end",
            bytes(rng.randrange(256) for _ in range(20_000)).replace(b"\r\n\r\n", b"") + framed(T),
            "20000 random bytes (seeded) then a frame")
    out.add("64 KiB of CRLF", b"\r\n" * 32768 + framed(T), "b'\\r\\n' * 32768 + frame")
    out.add("HTTP request", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\r\n", "an HTTP GET")
    out.add("TLS ClientHello", bytes.fromhex("16030100c4010000c00303") + bytes(range(32)) + b"\x00" * 60, "TLS hello")
    out.add("junk before a header", b"\x00\x01junk\xff" * 20 + framed(T), "binary junk then a frame")


DEEP = {"list 1000": b"[" * 1000 + b"]" * 1000, "object 1000": b'{"a":' * 1000 + b"1" + b"}" * 1000,
        "arguments 1000": b'{"seq": 81, "type": "request", "command": "threads", "arguments": '
                          + b"[" * 1000 + b"]" * 1000 + b"}",
        "arguments 63": b'{"seq": 82, "type": "request", "command": "evaluate", "arguments": {"expression": '
                        + b"[" * 61 + b"]" * 61 + b"}}",
        "brackets in a string": b'{"seq": 83, "type": "request", "command": "threads", "arguments": {"s": "'
                                + b"[" * 5000 + b'"}}',
        "list 100000": b"[" * 100_000 + b"]" * 100_000}


def bad_bodies(out: Inputs, T: bytes) -> None:
    out.add("invalid UTF-8 body",
            framed(b'{"seq": 77, "type": "request", "command": "threads", "x": "\xff\xfe\xc0\xaf"}'),
            "a request with bytes ff fe c0 af in a string")
    out.add("UTF-8 BOM", framed(b"\xef\xbb\xbf" + T), "BOM + threads body")
    out.add("lone surrogate escape", framed(b'{"seq": 78, "type": "request", "command": "evaluate", '
                                            b'"arguments": {"expression": "\\ud800\\udfff\\ud800"}}'), "\\ud800 in JSON")
    out.add("NUL bytes in the body", framed(b'{"seq": 79, "type": "request", "command": "threads"}\x00\x00'),
            "threads body + 2 NUL")
    for text in [b"{", b"}", b'{"seq":1,}', b"NaN", b"[1,2", b'{"a":1}{"b":2}', b"'single'", b"{\"seq\": 1e99999}",
                 b'{"seq": 1' + b"0" * 5000 + b', "type": "request", "command": "threads"}', b'{"seq": -Infinity}',
                 b"\x00", b" " * 100, b'{"seq": 80, "type": "request", "command": "threads", "arguments": {"a": ]}}']:
        out.add(f"invalid JSON {preview(text, 40)}", framed(text), f"framed({preview(text, 80)})")
    for name, text in DEEP.items():
        out.add(f"deep nesting: {name}", framed(text), f"nesting: {name}")
    for value in [b"[]", b'"threads"', b"1", b"null", b"true", b'[{"seq":1,"type":"request","command":"threads"}]']:
        out.add(f"non-object JSON {value.decode()[:30]}", framed(value), f"framed({value!r})")


def threads_with(**fields: Any) -> dict:
    return {**fields, "type": "request", "command": "threads"}


ODD_MESSAGES = [
    {"type": "request", "command": "threads"}, threads_with(seq=0), threads_with(seq=-1), threads_with(seq="1"),
    threads_with(seq=1.5), threads_with(seq=True), threads_with(seq=2**64), threads_with(seq=10**30),
    {"seq": 84, "type": "request"}, {"seq": 85, "type": "request", "command": 5},
    {"seq": 86, "type": "request", "command": None}, {"seq": 87, "type": "request", "command": ""},
    {"seq": 88, "type": "response", "command": "threads"}, {"seq": 89, "type": "event", "event": "stopped"},
    {"seq": 90, "command": "threads"}, {"seq": 91, "type": "request", "command": ["threads"]},
    {"seq": 92, "type": "request", "command": "__init__"},
    {"seq": 93, "type": "request", "command": "../../etc/passwd"},
    {"seq": 94, "type": "request", "command": "threads\u0000"},
    {"seq": 95, "type": "request", "command": "threads", "arguments": "x" * 100},
    {"seq": 96, "type": "request", "command": "threads", "arguments": [1, 2]},
    {"seq": 97, "type": "request", "command": "é🙂\u202e" * 50}]


def bad_messages(out: Inputs) -> None:
    for message in ODD_MESSAGES:
        text = json.dumps(message).encode()
        out.add(f"message {preview(message, 60)}", framed(text), f"framed({preview(message, 200)})")
    out.add("a 2 MB command name", framed(body("x" * 2_000_000)), "command 'x' * 2_000_000")
    out.add("oversized body (17 MiB, sent)", [b"Content-Length: %d\r\n\r\n" % (17 * 2**20), b"x" * (17 * 2**20)],
            "Content-Length: 17825792 + that many bytes of 'x'")


def split_and_short(out: Inputs, T: bytes) -> None:
    out.add("declared longer than sent, then filler", [framed(b'{"seq": 98', 100), b" " * 10 + b"#" * 80],
            "framed(b'{\"seq\": 98', length=100), 0.2 s later 90 bytes of filler", pause=0.2)
    out.add("declared shorter than sent", framed(T, 5), "framed(<threads body>, length=5)")
    out.add("split: one byte at a time", [bytes([b]) for b in framed(T)], "a threads request, 1 byte per write",
            pause=0.002)
    cut = framed(T)
    out.add("split inside the header", [cut[:10], cut[10:17], cut[17:21], cut[21:]], "a frame in 4 writes", pause=0.05)
    out.add("two requests in one write", framed(T) + framed(body()), "two threads frames at once")
    out.add("valid, junk, valid", framed(T) + b"\x00junk\r\n" + framed(body()), "frame + junk + frame")
    out.add("header, pause, body", [framed(T)[:-len(T)], T], "header then body 0.3 s later", pause=0.3)
    for length in [999_999_999_999, 17 * 2**20, 2**31, 2**32 + 5]:
        out.add(f"declared {length} bytes, none sent", b"Content-Length: %d\r\n\r\n" % length,
                f"b'Content-Length: {length}\\r\\n\\r\\n' and nothing more", blocks=True)
    out.add("declared 100 bytes, 9 sent", framed(b'{"seq": 9', 100), "framed(b'{\"seq\": 9', 100), nothing more",
            blocks=True)
    out.add("half a header", b"Content-Len", "b'Content-Len' and nothing more", blocks=True)


SAFE_COMMANDS = ["threads", "source", "evaluate", "stackTrace", "scopes", "timeline", "loadedSources", "units", "x"]


def random_frame(rng: random.Random, i: int) -> Frames:
    """A seeded request damaged one way, declared a length near its own, maybe after junk, maybe in pieces."""
    command = rng.choice(SAFE_COMMANDS)
    data = bytearray(body(command, random_json(rng, 3)))
    how = rng.choice(["flip", "cut", "insert", "random", "valid"])
    data = damaged(rng, data, how)
    declared = len(data) + rng.choice([0, 0, 0, -1, 1, -rng.randint(0, 50), rng.randint(0, 300)])
    declared = max(0, declared)
    header = rng.choice([b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"Content-length"])
    blob = framed(bytes(data), declared, header)
    if declared > len(data):
        blob += b"#" * (declared - len(data))  # filler: the body completes, the stream stays in step
    if rng.random() < 0.2:
        blob = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) + blob
    chunks = [blob]
    if rng.random() < 0.3:
        cuts = sorted(rng.sample(range(1, len(blob)), min(3, len(blob) - 1))) if len(blob) > 1 else []
        chunks = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)])]
    return Frames(f"random #{i} ({how}, declared {declared} for {len(data)})", chunks,
                  f"seeded random frame #{i}: {preview(blob, 160)}", pause=0.01)


def damaged(rng: random.Random, data: bytearray, how: str) -> bytearray:
    if how == "flip":
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == "cut":
        del data[rng.randrange(len(data)):]
    elif how == "insert":
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.choice([b"\x00", b"\\", b'"', b"{", b"]", b"\r\n\r\n", b"Content-Length: 3\r\n\r\n",
                                  bytes(rng.randrange(256) for _ in range(8))])
    elif how == "random":
        data = bytearray(rng.randrange(256) for _ in range(rng.randint(0, 300)))
    return data


class Transport:
    """One transport's server: a fresh stdio server per connection, or one TCP server (restarted when it dies)."""

    def __init__(self, fam: Family, name: str):
        self.fam, self.name = fam, name
        self.server: Server | None = None

    def fresh(self) -> Wire:
        """An initialized connection (the initialize, not counted, is judged like an input)."""
        if self.server is None or not self.server.alive() or self.name == "stdio":
            if self.server is not None:
                self.server.stop()
            self.server = Server(self.fam.ctx, "--frame-timeout", str(FRAME_TIMEOUT), "--handshake-timeout", "60",
                                 tcp=self.name == "tcp")
        wire = self.server.wire if self.name == "stdio" else self.server.connect()
        with self.fam.check(f"{self.name}: initialize", "initialize on a fresh connection", counted=False) as chk:
            initialize(chk, wire)
        return wire


def run(fam: Family) -> None:
    inputs = framing_inputs(fam.rng, fam.n(30, 10))
    if fam.ctx.quick:
        inputs = fam.rng.sample(inputs, 20)
    for name in ("stdio", "tcp"):
        run_transport(fam, Transport(fam, name), inputs)


def run_transport(fam: Family, transport: Transport, inputs: list[Frames]) -> None:
    wire = None
    try:
        wire = transport.fresh()
        for inp in inputs:
            if fam.out_of_time():
                continue
            if inp.blocks and transport.name == "stdio":
                continue  # stdio has no frame timeout: the client that started the server owns the stream
            if send(fam, transport, wire, inp).broke:
                wire = transport.fresh()
    except (Crash, Hang, SetupError) as exc:
        fam.setup_failed(transport.name, exc)
    finally:
        if wire is not None:
            goodbye(wire)
        if transport.server is not None:
            transport.server.stop()


def send(fam: Family, transport: Transport, wire: Wire, inp: Frames) -> Outcome:
    """One input after initialize, then `threads`; a blocking one on a connection of its own, which must close."""
    whole = b"".join(inp.chunks)
    exact = f" (exactly {whole!r})" if len(whole) <= 300 else ""
    repro = (f"{transport.name} server (--frame-timeout {FRAME_TIMEOUT:g}), after initialize write "
             f"{inp.recipe}{exact}{f' in {len(inp.chunks)} writes' if len(inp.chunks) > 1 else ''}; "
             f"then a threads request")
    with fam.check(f"{transport.name}: {inp.label}", repro) as chk:
        target = transport.server.connect() if inp.blocks else wire
        for i, chunk in enumerate(inp.chunks):
            chk.raw(target, chunk)
            if inp.pause and i < len(inp.chunks) - 1:
                time.sleep(inp.pause)
        if inp.blocks:
            if not target.wait_closed(FRAME_TIMEOUT + 15):
                target.close()
                raise Hang(f"the connection stayed open {FRAME_TIMEOUT + 15:g} s after an incomplete "
                           "message (--frame-timeout should close it)")
            target.closing_ok = True
        chk.threads(wire)
    return chk.outcome
