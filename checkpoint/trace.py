"""Trace files: a Timeline on disk, opened later and debugged without the device.

Layout (documented in docs/trace-format.md):

    header  : b"RWNDTRC\\0" + u32 version + u32 flags                    (16 bytes)
    frame*  : u32 payload length + u32 crc32(kind + payload) + u8 kind + msgpack payload
    footer  : u64 offset of the INDEX frame + b"RWNDEND\\0"              (16 bytes, on close)

Frames are appended as the run goes, each flushed, so a trace whose writer died is readable
up to its last complete frame (the reader says where it stopped). Bulk bytes (tensors) are
lz4-compressed inside VERSION and INITIAL frames; the INDEX frame lists every frame's
offset so opening reads the small frames and loads tensors only when asked.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import msgpack

from checkpoint.codec import decode_tensor, encode_tensor
from hardware.errors import RewindError

MAGIC = b"RWNDTRC\0"
FOOTER_MAGIC = b"RWNDEND\0"
VERSION = 1
HEADER = struct.Struct("<8sII")
FRAME = struct.Struct("<IIB")
FOOTER = struct.Struct("<Q8s")
MAX_FRAME = 2**31  # a frame longer than this is corruption, not data

META, PROGRAM, INITIAL, STEP, WRITE, VERSION_FRAME, CHECKPOINT, TRUNCATE, INDEX = range(1, 10)
KIND_NAMES = {META: "meta", PROGRAM: "program", INITIAL: "initial", STEP: "step", WRITE: "write",
              VERSION_FRAME: "version", CHECKPOINT: "checkpoint", TRUNCATE: "truncate", INDEX: "index"}


class TraceError(RewindError):
    """A trace file is not readable; the message names the problem and the byte offset."""


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes, offset: int, kind: int) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise TraceError(f"{KIND_NAMES.get(kind, kind)} frame at offset {offset} does not decode: {exc}") from None


class TraceWriter:
    """Appends frames; `close()` writes the index and footer."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._f: BinaryIO = open(self.path, "wb")
        except OSError as exc:
            raise TraceError(f"cannot write trace {self.path}: {exc.strerror}") from None
        self._f.write(HEADER.pack(MAGIC, VERSION, 0))
        self._index: list[list] = []
        self.bytes_raw = 0  # uncompressed tensor bytes written
        self.seconds = 0.0  # time spent encoding and writing frames
        self.closed = False

    def _frame(self, kind: int, payload: Any, key: list | None = None) -> None:
        started = time.perf_counter()
        body = _pack(payload)
        offset = self._f.tell()
        crc = zlib.crc32(bytes([kind]) + body)
        self._f.write(FRAME.pack(len(body), crc, kind))
        self._f.write(body)
        self._f.flush()
        self._index.append([kind, offset] + (key or []))
        self.seconds += time.perf_counter() - started

    def meta(self, **fields: Any) -> None:
        self._frame(META, fields)

    def program(self, encoded: dict) -> None:
        self._frame(PROGRAM, encoded)

    def initial(self, name: str, tensor: Any) -> None:
        started = time.perf_counter()
        enc = encode_tensor(tensor)
        self.seconds += time.perf_counter() - started
        self.bytes_raw += enc["nbytes"]
        self._frame(INITIAL, {"name": name, "tensor": enc}, [name])

    def step(self, tick: int, unit: int, node: int | None, edit: dict | None = None) -> None:
        self._frame(STEP, [tick, unit, node, edit])

    def write(self, row: list) -> None:
        self._frame(WRITE, row)

    def version(self, name: str, tick: int, tensor: Any) -> None:
        started = time.perf_counter()
        enc = encode_tensor(tensor)
        self.seconds += time.perf_counter() - started
        self.bytes_raw += enc["nbytes"]
        self._frame(VERSION_FRAME, {"name": name, "tick": tick, "tensor": enc}, [name, tick])

    def checkpoint(self, tick: int, pins: list) -> None:
        self._frame(CHECKPOINT, [tick, [list(p) for p in pins]])

    def truncate(self, tick: int) -> None:
        self._frame(TRUNCATE, tick)

    def close(self) -> None:
        if self.closed:
            return
        offset = self._f.tell()
        self._frame(INDEX, self._index)
        self._f.write(FOOTER.pack(offset, FOOTER_MAGIC))
        self._f.close()
        self.closed = True

    @property
    def size(self) -> int:
        return self._f.tell() if not self.closed else self.path.stat().st_size


@dataclass
class TraceContents:
    """What opening a trace reads: everything but the tensors, which load on demand."""

    meta: dict = field(default_factory=dict)
    program: dict | None = None
    initial: dict[str, int] = field(default_factory=dict)  # name -> frame offset
    steps: list[list] = field(default_factory=list)
    writes: list[list] = field(default_factory=list)
    versions: dict[tuple[str, int], int] = field(default_factory=dict)  # (name, tick) -> frame offset
    checkpoints: list[list] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class TraceReader:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._f: BinaryIO = open(self.path, "rb")
        except FileNotFoundError:
            raise TraceError(f"trace file not found: {self.path}") from None
        except OSError as exc:
            raise TraceError(f"cannot open trace {self.path}: {exc.strerror}") from None
        self.size = os.fstat(self._f.fileno()).st_size
        try:
            self._check_header()
            self.contents = self._load()
        except TraceError:
            self._f.close()
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, RewindError) as exc:
            self._f.close()
            raise TraceError(f"{self.path} is corrupt: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._f.close()

    def _check_header(self) -> None:
        head = self._f.read(HEADER.size)
        if len(head) < HEADER.size or head[:8] != MAGIC:
            raise TraceError(f"{self.path} is not a Rewind trace (no trace header at offset 0)")
        _, version, _ = HEADER.unpack(head)
        if version != VERSION:
            raise TraceError(f"{self.path} is trace format version {version}; this reader reads version {VERSION}")

    def _read_frame(self, offset: int, end: int) -> tuple[int, bytes, int]:
        """(kind, payload, next offset); TraceError naming the offset on any damage."""
        if offset + FRAME.size > end:
            raise _Truncated(offset)
        self._f.seek(offset)
        length, crc, kind = FRAME.unpack(self._f.read(FRAME.size))
        if kind not in KIND_NAMES:
            raise TraceError(f"unknown frame kind {kind} at offset {offset} (corrupt trace)")
        if length > MAX_FRAME:
            raise TraceError(f"frame at offset {offset} claims {length} bytes (corrupt trace)")
        if offset + FRAME.size + length > end:
            raise _Truncated(offset)
        body = self._f.read(length)
        if zlib.crc32(bytes([kind]) + body) != crc:
            raise TraceError(f"{KIND_NAMES[kind]} frame at offset {offset} fails its checksum (corrupt trace)")
        return kind, body, offset + FRAME.size + length

    def _footer(self) -> int | None:
        if self.size < HEADER.size + FOOTER.size:
            return None
        self._f.seek(self.size - FOOTER.size)
        offset, magic = FOOTER.unpack(self._f.read(FOOTER.size))
        return offset if magic == FOOTER_MAGIC and HEADER.size <= offset < self.size - FOOTER.size else None

    def _frames(self) -> Iterator[tuple[int, int, bytes | None, list]]:
        """(kind, offset, payload, key) in file order. With an index, bulk frames are not read: their
        payload is None and their key ([name] or [name, tick]) comes from the index."""
        index_at = self._footer()
        if index_at is not None:
            kind, body, _ = self._read_frame(index_at, self.size - FOOTER.size)
            if kind != INDEX:
                raise TraceError(f"the footer points at a {KIND_NAMES[kind]} frame at offset {index_at}, not the index")
            entries = _unpack(body, index_at, kind)
            if not isinstance(entries, list):
                raise TraceError(f"index frame at offset {index_at} is not a list")
            for entry in entries:
                if not (isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[1], int)):
                    raise TraceError(f"index frame at offset {index_at} has a malformed entry {entry!r:.80}")
                kind, offset = entry[0], entry[1]
                if kind in (INITIAL, VERSION_FRAME):
                    if not 0 < offset < index_at:
                        raise TraceError(f"index frame at offset {index_at} points outside the file ({offset})")
                    yield kind, offset, None, entry[2:]
                else:
                    k, payload, _ = self._read_frame(offset, index_at)
                    if k != kind:
                        raise TraceError(f"index says a {KIND_NAMES.get(kind, kind)} frame is at offset {offset}, "
                                         f"found {KIND_NAMES[k]}")
                    yield kind, offset, payload, []
            return
        offset = HEADER.size
        while offset < self.size:
            try:
                kind, payload, nxt = self._read_frame(offset, self.size)
            except _Truncated as cut:
                self.interrupted_at = cut.offset
                return
            yield kind, offset, payload, []
            offset = nxt

    def _load(self) -> TraceContents:
        c = TraceContents()
        self.interrupted_at: int | None = None
        for kind, offset, payload, key in self._frames():
            if kind == INITIAL:
                c.initial[str(key[0]) if key else self._key(offset, payload, kind)[0]] = offset
                continue
            if kind == VERSION_FRAME:
                name, tick = (str(key[0]), int(key[1])) if len(key) == 2 else self._key(offset, payload, kind)
                c.versions[(name, tick)] = offset
                continue
            obj = _unpack(payload, offset, kind)
            if kind == META:
                c.meta.update(obj)
            elif kind == PROGRAM:
                c.program = obj
            elif kind == STEP:
                c.steps.append(obj)
            elif kind == WRITE:
                c.writes.append(obj)
            elif kind == CHECKPOINT:
                c.checkpoints.append(obj)
            elif kind == TRUNCATE:
                _apply_truncate(c, int(obj))
        if self.interrupted_at is not None:
            c.warnings.append(f"trace {self.path.name} ends with an incomplete frame at offset {self.interrupted_at} "
                              f"(the recording was interrupted): {len(c.steps)} steps are readable")
        elif self._footer() is None:
            c.warnings.append(f"trace {self.path.name} has no index (the recording did not finish): read every "
                              f"frame up to offset {self.size}, {len(c.steps)} steps")
        if c.program is None:
            raise TraceError(f"{self.path} holds no program frame (offset {HEADER.size} onwards)")
        return c

    def _key(self, offset: int, payload: bytes | None, kind: int) -> tuple:
        """(name,) for INITIAL, (name, tick) for VERSION: from the index entry or the frame itself."""
        if payload is None:
            payload = self._read_frame(offset, self.size)[1]
        obj = _unpack(payload, offset, kind)
        try:
            return (obj["name"],) if kind == INITIAL else (obj["name"], int(obj["tick"]))
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{KIND_NAMES[kind]} frame at offset {offset} lacks its name") from None

    def tensor_at(self, offset: int) -> Any:
        kind, payload, _ = self._read_frame(offset, self.size)
        obj = _unpack(payload, offset, kind)
        try:
            return decode_tensor(obj["tensor"])
        except (RewindError, KeyError, TypeError) as exc:
            raise TraceError(f"{KIND_NAMES[kind]} frame at offset {offset}: {exc}") from None


class _Truncated(TraceError):
    def __init__(self, offset: int):
        super().__init__(f"frame at offset {offset} runs past the end of the file (truncated trace)")
        self.offset = offset


def _apply_truncate(c: TraceContents, tick: int) -> None:
    c.steps = [s for s in c.steps if s[0] < tick]
    c.writes = [w for w in c.writes if w[0] < tick]
    c.versions = {k: v for k, v in c.versions.items() if k[1] < tick}
    c.checkpoints = [cp for cp in c.checkpoints if cp[0] <= tick]
