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
from typing import Any, BinaryIO, Callable, Iterator

import msgpack

from checkpoint.codec import check_shape, decode_program, decode_tensor, dtype_of, encode_tensor, shown
from checkpoint.safe_files import AtomicFile, FileWriteError, place, write_error
from hardware.errors import RewindError, os_reason
from hardware.program import Program
from hardware.ticks import Tick
from provenance.writelog import KIND_BUFFER, KIND_EDIT, KIND_NODE, KIND_VIEW
from provenance.writelog import KIND_NAMES as KIND_NAMES_WRITES

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


class TraceWriter:
    """Appends frames to a hidden temporary beside the trace (`partial_path`, see checkpoint/safe_files.py);
    `close()` writes the index and footer, fsyncs and moves it onto `target_path` (`path`) in one step:
    the target is never a half-written trace, and an existing file there is replaced only with
    `overwrite`. `abort()` drops the temporary and leaves the target as it was.

    A writer that fails (a full disk) raises FileWriteError; a recording's writer (`on_error` set)
    instead reports the failure once, cuts the file back to its last complete frame and records no more."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = False, in_use: dict[str, str] | None = None,
                 doing: str = "write", on_error: Callable[[str], None] | None = None):
        self._out = AtomicFile(path, overwrite, in_use, doing, buffered=False)
        self.path = self.target_path = self._out.target_path
        self.partial_path = self._out.partial_path
        self._f: BinaryIO = self._out.file
        self._doing, self.on_error = doing, on_error
        self._index: list[list] = []
        self.bytes_raw = 0  # uncompressed tensor bytes written
        self.seconds = 0.0  # time spent encoding and writing frames
        self.closed = False
        self.failed: str | None = None  # why a recording stopped writing
        self._offset = 0
        self._append(HEADER.pack(MAGIC, VERSION, 0))

    def _append(self, *parts: bytes) -> None:
        """Write `parts` whole (the file is unbuffered: nothing stays pending), or cut the file back to where it
        was and fail."""
        try:
            for part in parts:
                view = memoryview(part)
                while view:
                    view = view[self._f.write(view):]
        except OSError as exc:
            error = write_error(self.target_path, exc, self._doing)
            try:
                self._f.truncate(self._offset)
                self._f.seek(self._offset)
            except (OSError, ValueError):
                pass
            if self.on_error is None:
                raise error from None
            self.failed = f"{error}; the recording stops here, the trace keeps what came before"
            self.on_error(self.failed)
            return
        self._offset += sum(len(part) for part in parts)

    def _frame(self, kind: int, payload: Any, key: list | None = None) -> None:
        if self.failed is not None:
            return
        started = time.perf_counter()
        body = _pack(payload)
        offset = self._offset
        crc = zlib.crc32(bytes([kind]) + body)
        self._append(FRAME.pack(len(body), crc, kind), body)
        if self.failed is None:
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

    def step(self, tick: Tick, unit: int, node: int | None, edit: dict | None = None) -> None:
        self._frame(STEP, [tick, unit, node, edit])

    def write(self, row: list) -> None:
        self._frame(WRITE, row)

    def version(self, name: str, tick: Tick, tensor: Any) -> None:
        started = time.perf_counter()
        enc = encode_tensor(tensor)
        self.seconds += time.perf_counter() - started
        self.bytes_raw += enc["nbytes"]
        self._frame(VERSION_FRAME, {"name": name, "tick": tick, "tensor": enc}, [name, tick])

    def checkpoint(self, tick: Tick, pins: list) -> None:
        self._frame(CHECKPOINT, [tick, [list(p) for p in pins]])

    def truncate(self, tick: Tick) -> None:
        self._frame(TRUNCATE, tick)

    def close(self) -> Path:
        """Finish the trace (index, footer) and move it onto the target. A recording that cannot be placed
        (the target appeared meanwhile, the disk filled) stays at `partial_path`, and the error says so."""
        if self.closed:
            return self.target_path
        self.closed = True
        if self.failed is None:
            offset = self._offset
            self._frame(INDEX, self._index)
            if self.failed is None:
                self._append(FOOTER.pack(offset, FOOTER_MAGIC))
        keep = self.on_error is not None
        try:
            return self._out.commit(keep_on_failure=keep)
        except FileWriteError as exc:
            if not keep:
                raise
            raise FileWriteError(f"{exc}; the recording is kept at {self.partial_path}", self.target_path) from None

    def abort(self) -> None:
        """Give up: the temporary is removed, the target is as it was."""
        self.closed = True
        self._out.abort()

    @property
    def size(self) -> int:
        return self._offset


def adopt_partial(partial_path: str | os.PathLike, target_path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Move a recording's temporary left by a writer that died (`TraceWriter.partial_path`) onto its target
    (`TraceWriter.target_path`), with the same rules as a finished one: an existing regular file at the
    target is replaced only with `overwrite`; a link, folder, FIFO or device there is refused. The file
    is moved as it is: the reader reads a trace with no footer up to its last complete frame (and says so).
    Refuses a file that is not a trace, so nothing else is ever moved over a user's file."""
    partial, target = Path(partial_path), Path(target_path)
    if os.path.lexists(partial) and (partial.is_symlink() or not partial.is_file()):
        raise FileWriteError(f"cannot adopt {partial}: it is not a regular file", partial)
    try:
        with open(partial, "rb") as f:
            head = f.read(HEADER.size)
            os.fsync(f.fileno())
    except FileNotFoundError:
        raise FileWriteError(f"cannot adopt {partial}: there is no such partial recording", partial) from None
    except OSError as exc:
        raise write_error(partial, exc, "read") from None
    if len(head) < HEADER.size or head[:8] != MAGIC:
        raise FileWriteError(f"cannot adopt {partial}: it is not a Rewind trace (no trace header)", partial)
    try:
        return place(partial, target, overwrite)
    except OSError as exc:
        raise write_error(target, exc) from None


@dataclass
class TraceContents:
    """What opening a trace reads: everything but the tensors, which load on demand. Every field has been
    checked: steps, writes, versions and checkpoints name nodes, values and ticks the trace holds, and
    they end at the last step whose writes all reached the file."""

    meta: dict = field(default_factory=dict)
    program: dict | None = None
    initial: dict[str, int] = field(default_factory=dict)  # name -> frame offset
    steps: list[list] = field(default_factory=list)
    writes: list[list] = field(default_factory=list)
    versions: dict[tuple[str, int], int] = field(default_factory=dict)  # (name, tick) -> frame offset
    checkpoints: list[list] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    damaged: str | None = None  # why the file ends early (a recording that did not finish), None if whole


_MAX_NAME = 4096  # the longest unit, chip or driver name a reader takes
_MAX_UNITS = 1 << 16
_I64 = 2**63


class TraceReader:
    """Opens a trace and checks it whole: the header, every frame's length and checksum, and every field of
    every frame (types, ranges, the nodes, values and ticks it refers to). A damaged file is refused with a
    TraceError naming the file, the frame and its byte offset; a recording cut short opens at its last step
    whose writes all reached the file, and says so in `contents.warnings`."""

    def __init__(self, path: str | os.PathLike):
        from stat import S_ISDIR, S_ISREG

        self.path = Path(path)
        try:  # not blocking: a FIFO or device named as a trace is refused, not waited on
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            raise TraceError(f"trace file not found: {self.path}") from None
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
            raise TraceError(f"cannot open trace {self.path}: {os_reason(exc)}") from None
        st = os.fstat(fd)
        if not S_ISREG(st.st_mode):
            os.close(fd)
            what = "a folder" if S_ISDIR(st.st_mode) else "not a regular file"
            raise TraceError(f"cannot open trace {self.path}: it is {what}")
        self._f: BinaryIO = os.fdopen(fd, "rb")
        self.size = st.st_size
        self.program: Program | None = None  # decoded from the PROGRAM frame (its `initial` is empty)
        self.interrupted_at: int | None = None
        self.index_at: int | None = None  # where a scan found the index of a trace whose footer is damaged
        self._meta_seen = False
        self._at = (0, "header")  # the frame being read, for messages
        try:
            self._check_header()
            self.contents = self._load()
        except TraceError:
            self._f.close()
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, struct.error,
                RewindError) as exc:  # a check missed: still a clear refusal, naming where
            self._f.close()
            offset, kind = self._at
            raise TraceError(f"trace {self.path}: the {kind} frame at offset {offset} is malformed "
                             f"({exc})") from None

    def close(self) -> None:
        self._f.close()

    def _error(self, offset: int, kind: int, what: str) -> TraceError:
        return TraceError(f"trace {self.path}: {KIND_NAMES.get(kind, 'unknown')} frame at offset {offset}: {what}")

    def _check_header(self) -> None:
        head = self._read_at(0, HEADER.size)
        if len(head) < HEADER.size or head[:8] != MAGIC:
            raise TraceError(f"{self.path} is not a Rewind trace (no trace header at offset 0)")
        _, version, _ = HEADER.unpack(head)
        if version != VERSION:
            raise TraceError(f"{self.path} is trace format version {version}; this reader reads version {VERSION}")

    def _frame_header(self, offset: int, end: int) -> tuple[int, int, int]:
        """(kind, length, crc) of the frame at `offset`, which must end by `end`."""
        if offset + FRAME.size > end:
            raise _Truncated(self.path, offset)
        head = self._read_at(offset, FRAME.size)
        if len(head) != FRAME.size:
            raise _Truncated(self.path, offset)  # the file shrank while it was read
        length, crc, kind = FRAME.unpack(head)
        if kind not in KIND_NAMES:
            raise TraceError(f"trace {self.path}: unknown frame kind {kind} at offset {offset} (corrupt trace)")
        if length > MAX_FRAME:
            raise TraceError(f"trace {self.path}: frame at offset {offset} claims {length} bytes (corrupt trace)")
        if offset + FRAME.size + length > end:
            raise _Truncated(self.path, offset)
        return kind, length, crc

    def _read_frame(self, offset: int, end: int) -> tuple[int, bytes, int]:
        """(kind, payload, next offset); TraceError naming the file and offset on any damage."""
        kind, length, crc = self._frame_header(offset, end)
        body = self._read_at(offset + FRAME.size, length)
        if len(body) != length:
            raise _Truncated(self.path, offset)  # the file shrank while it was read
        if zlib.crc32(bytes([kind]) + body) != crc:
            raise TraceError(f"trace {self.path}: {KIND_NAMES[kind]} frame at offset {offset} fails its checksum "
                             f"(corrupt trace)")
        return kind, body, offset + FRAME.size + length

    def _read_at(self, offset: int, count: int) -> bytes:
        try:
            self._f.seek(offset)
            return self._f.read(count)
        except OSError as exc:
            raise TraceError(f"cannot read trace {self.path} at offset {offset}: {exc.strerror}") from None

    def _footer(self) -> int | None:
        if self.size < HEADER.size + FOOTER.size:
            return None
        tail = self._read_at(self.size - FOOTER.size, FOOTER.size)
        if len(tail) != FOOTER.size:
            return None
        offset, magic = FOOTER.unpack(tail)
        return offset if magic == FOOTER_MAGIC and HEADER.size <= offset < self.size - FOOTER.size else None

    def _frames(self) -> Iterator[tuple[int, int, bytes | None, list]]:
        """(kind, offset, payload, key) in file order. With an index, bulk frames are not read (only their
        headers): their payload is None and their key ([name] or [name, tick]) comes from the index."""
        index_at = self._footer()
        if index_at is not None:
            yield from self._indexed(index_at)
            return
        offset = HEADER.size
        while offset < self.size:
            self._at = (offset, "next")
            try:
                kind, payload, nxt = self._read_frame(offset, self.size)
            except _Truncated as cut:
                self.interrupted_at = cut.offset
                return
            if kind == INDEX:  # the index of a finished trace whose footer is damaged: nothing follows it
                self.index_at = offset
                return
            yield kind, offset, payload, []
            offset = nxt

    def _indexed(self, index_at: int) -> Iterator[tuple[int, int, bytes | None, list]]:
        self._at = (index_at, "index")
        kind, body, _ = self._read_frame(index_at, self.size - FOOTER.size)
        if kind != INDEX:
            raise TraceError(f"trace {self.path}: the footer points at a {KIND_NAMES[kind]} frame at offset "
                             f"{index_at}, not the index")
        entries = _unpack(body, index_at, kind, self.path)
        if not isinstance(entries, list):
            raise self._error(index_at, INDEX, "it is not a list")
        end = HEADER.size
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) >= 2 and type(entry[0]) is int
                    and type(entry[1]) is int and entry[0] in KIND_NAMES and entry[0] != INDEX):
                raise self._error(index_at, INDEX, f"malformed entry {entry!r:.80}")
            kind, offset, key = entry[0], entry[1], entry[2:]
            if not end <= offset < index_at:
                raise self._error(index_at, INDEX, f"entry {entry!r:.80} points at offset {offset}, outside the "
                                                   f"frames ({end}..{index_at})")
            self._at = (offset, KIND_NAMES[kind])
            if kind in (INITIAL, VERSION_FRAME):
                found, length, _ = self._frame_header(offset, index_at)
                payload, end = None, offset + FRAME.size + length
                if not (isinstance(key, list) and len(key) == (1 if kind == INITIAL else 2)
                        and isinstance(key[0], str) and (kind == INITIAL or type(key[1]) is int)):
                    raise self._error(index_at, INDEX, f"entry {entry!r:.80} has a malformed key")
            else:
                found, payload, end = self._read_frame(offset, index_at)
            if found != kind:
                raise TraceError(f"trace {self.path}: the index says a {KIND_NAMES[kind]} frame is at offset "
                                 f"{offset}, found a {KIND_NAMES[found]} frame")
            yield kind, offset, payload, key

    def _load(self) -> TraceContents:
        c = TraceContents()
        rows: dict[int, dict[str, int]] = {}  # tick -> value -> the kind of its write
        for kind, offset, payload, key in self._frames():
            self._at = (offset, KIND_NAMES[kind])
            obj = None if payload is None else _unpack(payload, offset, kind, self.path)
            if kind not in (META, PROGRAM) and self.program is None:
                raise self._error(offset, kind, "it comes before the program frame")
            try:
                self._take(c, rows, kind, obj, key)
            except _Bad as bad:
                raise self._error(offset, kind, str(bad)) from None
            except RewindError as exc:
                raise self._error(offset, kind, str(exc)) from None
        if self.program is None:
            raise TraceError(f"{self.path} holds no program frame (offset {HEADER.size} onwards)")
        if self.interrupted_at is not None:
            c.damaged = f"an incomplete frame at offset {self.interrupted_at}"
        elif self._footer() is None and self.index_at is None:
            c.damaged = f"no index: it ends at offset {self.size}"
        missing = [n for n, v in self.program.values.items() if v.producer is None and n not in c.initial]
        if missing:
            names = ", ".join(f"'{n}'" for n in missing[:5]) + (" ..." if len(missing) > 5 else "")
            if c.damaged:
                raise TraceError(f"trace {self.path} is cut short ({c.damaged}) before the initial values of "
                                 f"{names} were stored: there is nothing to debug")
            raise TraceError(f"trace {self.path} holds no initial value for {names} (corrupt trace)")
        ran = self._complete(c, rows)
        if ran < len(c.steps):
            _apply_truncate(c, ran)
        if self.interrupted_at is not None:
            c.warnings.append(f"trace {self.path.name} ends with an incomplete frame at offset {self.interrupted_at} "
                              f"(the recording was interrupted): {ran} steps are readable")
        elif c.damaged:
            c.warnings.append(f"trace {self.path.name} has no index (the recording did not finish): read every "
                              f"frame up to offset {self.size}, {ran} steps")
        elif self.index_at is not None:
            c.warnings.append(f"trace {self.path.name} has a damaged footer: read every frame up to its index at "
                              f"offset {self.index_at}, {ran} steps")
        absent = sorted({n.op for n in self.program.nodes if getattr(n.target, "unavailable_op", False)})
        if absent:
            c.warnings.append(f"trace {self.path.name} runs ops this torch does not register ({', '.join(absent)}): "
                              f"their recorded values are shown, they cannot run again")
        return c

    def _take(self, c: TraceContents, rows: dict[int, dict[str, int]], kind: int, obj: Any, key: list) -> None:
        """Check one frame's payload and add it to `c` (raises _Bad or RewindError saying what is wrong)."""
        program = self.program
        if kind == META:
            if self._meta_seen or program is not None:
                raise _Bad("a second meta frame, or one after the program frame")
            self._meta_seen = True
            c.meta = _check_meta(obj)
        elif kind == PROGRAM:
            if program is not None:
                raise _Bad("a second program frame")
            self.program = decode_program(obj, {})
            c.program = obj
        elif kind == INITIAL:
            name = key[0] if key else _named(obj, ("name",))[0]
            info = program.values.get(name)
            if info is None or info.producer is not None:
                raise _Bad(f"'{name:.80}' is not an input, parameter, buffer or constant of the program")
            if name in c.initial:
                raise _Bad(f"a second initial value of '{name:.80}'")
            c.initial[name] = self._at[0]
        elif kind == STEP:
            if not isinstance(obj, list) or len(obj) != 4:
                raise _Bad(f"it is {shown(obj)}, not [tick, unit, node, edit]")
            tick = _int(obj[0], 0, len(c.steps) + 1, "its tick")
            if tick < len(c.steps):  # the step was tried again (its first try failed): the first try is void
                _apply_truncate(c, tick)
                for t in [t for t in rows if t >= tick]:
                    del rows[t]
            _check_step(obj, c, program, len(c.meta.get("units", ["host"])))
            c.steps.append(obj)
        elif kind == WRITE:
            value, kind_of = _check_write(obj, c, program)
            rows.setdefault(obj[0], {})[value] = kind_of
            c.writes.append(obj)
        elif kind == VERSION_FRAME:
            name, tick = (key[0], key[1]) if key else _named(obj, ("name", "tick"))
            if not c.steps or tick != c.steps[-1][0] or name not in rows.get(tick, {}):
                raise _Bad(f"it holds '{name:.80}' at tick {tick}, which the steps before it did not write")
            c.versions[(name, tick)] = self._at[0]
        elif kind == CHECKPOINT:
            c.checkpoints.append(_check_checkpoint(obj, len(c.steps), c.initial, rows))
        elif kind == TRUNCATE:
            if type(obj) is not int or not 0 <= obj <= len(c.steps):
                raise _Bad(f"it voids from tick {shown(obj)}, not a tick of the {len(c.steps)} recorded")
            _apply_truncate(c, obj)
            for t in [t for t in rows if t >= obj]:
                del rows[t]

    def _complete(self, c: TraceContents, rows: dict[int, dict[str, int]]) -> int:
        """How many recorded steps are whole: each wrote what its node writes (its outputs and the buffers they
        update; an edit its value) and, in a recording that did not finish, stored the values it wrote. A
        recording killed part way can end between a step's frame and its writes' frames."""
        program = self.program
        buffers = set(program.buffer_mutations.values())
        for i, (tick, _unit, node, edit) in enumerate(c.steps):
            if edit is not None:
                expected = {edit["value"]}
            else:
                outputs = program.nodes[node].outputs
                mutations = program.buffer_mutations
                expected = set(outputs) | {mutations[o] for o in outputs if o in mutations}
            written = rows.get(tick, {})
            if not expected <= written.keys():
                return i
            if c.damaged and any((name, tick) not in c.versions for name, k in written.items()
                                 if k in (KIND_NODE, KIND_EDIT) and name not in buffers):
                return i
        return len(c.steps)

    def _tensor(self, offset: int, kinds: tuple[int, ...], expect: tuple | None) -> Any:
        self._at = (offset, "value")
        kind, payload, _ = self._read_frame(offset, self.size)
        if kind not in kinds:
            raise TraceError(f"trace {self.path}: a {KIND_NAMES[kind]} frame is at offset {offset}, where a value "
                             f"was expected")
        obj = _unpack(payload, offset, kind, self.path)
        try:
            if not isinstance(obj, dict) or "tensor" not in obj:
                raise _Bad("it holds no tensor")
            if expect is not None:
                got = _named(obj, ("name",) if kind == INITIAL else ("name", "tick"))
                if got != expect:
                    raise _Bad(f"it holds {shown(got)}, where the index says {shown(expect)}")
            tensor = decode_tensor(obj["tensor"])
            info = self.program.values.get(str(obj.get("name"))) if self.program is not None else None
            if info is not None and tuple(tensor.shape) != info.shape:  # (a driver may compute in another dtype)
                raise _Bad(f"it holds shape {list(tensor.shape)} for '{info.name}', which the program says has shape "
                           f"{list(info.shape)}")
            return tensor
        except (_Bad, RewindError) as exc:
            raise self._error(offset, kind, str(exc)) from None

    def tensor_at(self, offset: int) -> Any:
        """The tensor of the INITIAL or VERSION frame at `offset`."""
        return self._tensor(offset, (INITIAL, VERSION_FRAME), None)

    def initial_value(self, name: str) -> Any | None:
        """The initial contents of input, parameter, buffer or constant `name`; None if the trace holds none."""
        offset = self.contents.initial.get(name)
        return None if offset is None else self._tensor(offset, (INITIAL,), (name,))

    def version(self, name: str, tick: Tick) -> Any | None:
        """`name` as written at `tick`; None if the trace does not hold it."""
        offset = self.contents.versions.get((name, tick))
        return None if offset is None else self._tensor(offset, (VERSION_FRAME,), (name, tick))


class TraceArchive:
    """The versions a trace holds, loaded on demand: a Timeline's archive (looked in before recomputing)."""

    def __init__(self, reader: TraceReader):
        self.reader = reader

    def has(self, key: tuple[str, Tick]) -> bool:
        return key in self.reader.contents.versions

    def load(self, key: tuple[str, Tick]) -> Any | None:
        return self.reader.version(*key)


class _Bad(Exception):
    """Inside the reader: what is wrong with a frame's payload (the reader adds the file, frame and offset)."""


class _Truncated(TraceError):
    def __init__(self, path: Path, offset: int):
        super().__init__(f"trace {path}: frame at offset {offset} runs past the end of the file (truncated trace)")
        self.offset = offset


def _unpack(data: bytes, offset: int, kind: int, path: Path | None = None) -> Any:
    where = f"trace {path}: " if path is not None else ""
    value, problem = unpacked(data, strict_map_key=False)
    if problem is None:
        return value
    raise TraceError(f"{where}{KIND_NAMES.get(kind, kind)} frame at offset {offset} does not decode: {problem}")


def unpacked(data: bytes, **options: Any) -> tuple[Any, str | None]:
    """msgpack's value of untrusted bytes, or None and what is wrong with them in words."""
    try:
        return msgpack.unpackb(data, raw=False, **options), None
    except msgpack.StackError:
        return None, "it nests too deeply"
    except msgpack.ExtraData:
        return None, "it has bytes after its end"
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError):  # msgpack's own: malformed data
        return None, "it is not valid msgpack"


def _int(value: Any, lo: int, hi: int, what: str) -> int:
    if type(value) is not int or not lo <= value < hi:
        raise _Bad(f"{what} is {shown(value)}, not an integer in {lo}..{hi - 1}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > _MAX_NAME:
        raise _Bad(f"{what} is {shown(value)}, not a name")
    return value


def _named(obj: Any, keys: tuple[str, ...]) -> tuple:
    """(name,) or (name, tick) from an INITIAL or VERSION frame's own payload."""
    if not isinstance(obj, dict):
        raise _Bad("it is not a map")
    name = obj.get("name")
    if not isinstance(name, str):
        raise _Bad(f"its name is {shown(name)}")
    if len(keys) == 1:
        return (name,)
    return name, _int(obj.get("tick"), 0, _I64, "its tick")


def _check_meta(obj: Any) -> dict:
    if not isinstance(obj, dict):
        raise _Bad("it is not a map")
    meta = dict(obj)
    for key in ("driver", "chip"):
        if key in meta:
            _text(meta[key], f"'{key}'")
    if "units" in meta:
        units = meta["units"]
        if not isinstance(units, list) or not 0 < len(units) <= _MAX_UNITS:
            raise _Bad(f"'units' is {shown(units)}, not a list of unit names")
        for u in units:
            _text(u, "a unit name")
    locations = meta.get("initial_locations", {})
    if not isinstance(locations, dict):
        raise _Bad("'initial_locations' is not a map")
    for name, loc in locations.items():
        what = f"the location of {shown(name)}"
        if not isinstance(name, str) or not isinstance(loc, dict):
            raise _Bad(f"{what} is malformed")
        for key in ("chip", "unit", "space", "dtype"):
            _text(loc.get(key), f"{what}: '{key}'")
        _int(loc.get("address"), 0, 2**64, f"{what}: 'address'")
        _int(loc.get("nbytes"), 0, _I64, f"{what}: 'nbytes'")
        try:
            check_shape(loc.get("shape"), f"{what}: shape", 2**48)
        except RewindError as exc:
            raise _Bad(str(exc)) from None
        strides = loc.get("strides")
        if not isinstance(strides, list) or len(strides) > 64:
            raise _Bad(f"{what}: 'strides' is {shown(strides)}")
        for s in strides:
            _int(s, -_I64, _I64, f"{what}: a stride")
    return meta


def _check_step(obj: list, c: TraceContents, program: Program, units: int) -> None:
    """A step at tick len(c.steps): its unit, and its node (after the last node run) or its edit."""
    _tick, unit, node, edit = obj
    _int(unit, 0, units, "its unit")
    if (node is None) == (edit is None):
        raise _Bad("it must run a node or apply an edit, and not both")
    if node is not None:
        _int(node, 0, len(program.nodes), "its node")
        last = next((s[2] for s in reversed(c.steps) if s[2] is not None), -1)
        if node != last + 1:
            raise _Bad(f"it runs node {node} where node {last + 1} comes next: nodes run in the program's order, "
                       f"each once")
        return
    if not isinstance(edit, dict):
        raise _Bad(f"its edit is {shown(edit)}")
    value = edit.get("value")
    info = program.values.get(value) if isinstance(value, str) else None
    if info is None:
        raise _Bad(f"its edit writes {shown(value)}, which is not a value of the program")
    data = edit.get("data")
    if not isinstance(data, bytes):
        raise _Bad("its edit's data are not bytes")
    size = info.numel * dtype_of(info.dtype).itemsize
    _int(edit.get("offset"), 0, max(size - len(data), 0) + 1, "its edit's offset")
    if len(data) > size:
        raise _Bad(f"its edit writes {len(data)} bytes into '{value}', which has {size}")
    if not isinstance(edit.get("description", ""), str):
        raise _Bad("its edit's description is not text")


def _check_write(obj: Any, c: TraceContents, program: Program) -> tuple[str, int]:
    if not isinstance(obj, list) or len(obj) != 14:
        raise _Bad(f"it is not a write-log row of 14 fields: {shown(obj)}")
    tick, unit, node, value, kind, space, address, nbytes, digest, nan, inf, lo, hi, mean = obj
    if not c.steps or tick != c.steps[-1][0]:
        raise _Bad(f"it writes at tick {shown(tick)}, not at the tick of the step before it")
    step_node, edit = c.steps[-1][2], c.steps[-1][3]
    _text(unit, "its unit")
    _text(space, "its memory space")
    if node != (-1 if step_node is None else step_node):
        raise _Bad(f"it names node {shown(node)}, not the node its step ran")
    if kind not in KIND_NAMES_WRITES:
        raise _Bad(f"its kind is {shown(kind)}")
    if edit is not None:
        allowed = {edit["value"]: (KIND_EDIT,)}
    else:
        outputs = program.nodes[step_node].outputs
        allowed = {o: (KIND_NODE, KIND_VIEW) for o in outputs}
        allowed.update({program.buffer_mutations[o]: (KIND_BUFFER,) for o in outputs if o in program.buffer_mutations})
    if value not in allowed or kind not in allowed[value]:
        raise _Bad(f"it logs a {KIND_NAMES_WRITES[kind]} of {shown(value)}, which its step does not write")
    _int(address, 0, 2**64, "its address")
    _int(nbytes, 0, _I64, "its size")
    _int(digest, -_I64, _I64, "its digest")
    _int(nan, 0, _I64, "its NaN count")
    _int(inf, 0, _I64, "its Inf count")
    for stat, what in ((lo, "minimum"), (hi, "maximum"), (mean, "mean")):
        if type(stat) not in (int, float) or (type(stat) is int and not -_I64 <= stat < _I64):
            raise _Bad(f"its {what} is {shown(stat)}")
    return value, kind


def _check_checkpoint(obj: Any, ticks: int, initial: dict[str, int], rows: dict[int, dict[str, int]]) -> list:
    """[tick, pins]: a tick reached, and pins [value, version] naming versions the trace recorded before it (an
    initial value's version is -1)."""
    if not isinstance(obj, list) or len(obj) != 2 or not isinstance(obj[1], list):
        raise _Bad(f"it is {shown(obj)}, not [tick, pins]")
    tick, pins = obj
    _int(tick, 0, ticks + 1, "its tick")
    for pin in pins:
        if (not isinstance(pin, list) or len(pin) != 2 or not isinstance(pin[0], str) or type(pin[1]) is not int
                or not -1 <= pin[1] < tick
                or not (pin[0] in initial if pin[1] == -1 else pin[0] in rows.get(pin[1], {}))):
            raise _Bad(f"it pins {shown(pin)}, not a version recorded before tick {tick}")
    return obj


def _apply_truncate(c: TraceContents, tick: Tick) -> None:
    c.steps = [s for s in c.steps if s[0] < tick]
    c.writes = [w for w in c.writes if w[0] < tick]
    c.versions = {k: v for k, v in c.versions.items() if k[1] < tick}
    c.checkpoints = [cp for cp in c.checkpoints if cp[0] <= tick]
