"""Traces of many ranks: one trace per rank, each recorded by its rank's Session the way a single session records
(checkpoint/recording.py), and a small index that names them (docs/ranks.md, "Traces of many ranks").

    header : b"RWNDRKS\\0" + u32 format version + u32 world size          (16 bytes: the trace header's shape)
    body   : u32 length n + u32 crc32(msgpack) + n bytes of msgpack: a map
             world_size, program, entry, ranks: [{rank, file, bytes, sha256, collectives}]

Rank r's trace lies beside the index (`rank_file`: run.rwd -> run.rank0.rwd). An index is a file someone else
may have made: every field is checked before it is used, a rank's file is a plain name in the index's own folder
(no folder part, no link) of the index's size, and nothing read from it is ever called. Its SHA-256 must be the
index's too: each rank checks its own file before opening it (`check_rank_trace`), so the ranks hash side by side.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from checkpoint.codec import shown
from checkpoint.safe_files import atomic_write, check_target
from checkpoint.trace import HEADER, adopt_partial, unpacked
from hardware.errors import RewindError, os_reason
from hardware.ranks.collectives import Collective
from hardware.ranks.launcher import MAX_RANKS

MAGIC = b"RWNDRKS\0"
VERSION = 2  # 2: a collective's `p2p` (a send's or recv's transfers) and the `groups`; version 1 is read too
BODY = struct.Struct("<II")  # the msgpack's length and crc32
MAX_INDEX = 64 << 20  # bytes: an index holds names and collectives, never tensors
MAX_COLLECTIVES = 1 << 20  # of one rank
_MAX_TEXT = 4096
_MAX_LIST = 64  # tensors or details of one collective
_I64 = 2**63
_COLLECTIVE_FIELDS = {"number": int, "tick": int, "op": str, "group": str, "tensors": list, "details": list,
                      "where": str, "value": str, "node": str}


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace, as the index names it (`path`: in the index's folder)."""

    rank: int
    path: Path
    size: int
    sha256: str
    collectives: tuple[Collective, ...]


@dataclass(frozen=True)
class TraceIndex:
    path: Path
    world_size: int
    program: str  # the model file that was recorded: shown, never opened
    entry: str
    ranks: tuple[RankTrace, ...]
    groups: dict[str, tuple[int, ...]]  # each process group's ranks, by name (none in version 1: every rank)


def rank_file(index: str | os.PathLike, rank: int) -> Path:
    """Rank `rank`'s trace beside the index: run.rwd -> run.rank0.rwd (run -> run.rank0)."""
    index = Path(index)
    return index.with_name(f"{index.stem}.rank{rank}{index.suffix}")


# -- recording -----------------------------------------------------------------------------------------------
def record_targets(index: str, world_size: int, overwrite: bool, in_use: dict[str, str],
                   doing: str = "record to") -> Path:
    """Refuse, before any rank starts (or saves), a recording that would destroy a file
    (checkpoint/safe_files.check_target): at the index or at any rank's trace. The index's absolute path."""
    target = Path(os.path.abspath(check_target(index, overwrite, in_use, doing)))
    for rank in range(world_size):
        check_target(rank_file(target, rank), overwrite, in_use, doing)
    return target


def write_index(index: Path, overwrite: bool, program: str, entry: str, collectives: list[list[Collective]],
                groups: dict[str, tuple[int, ...]]) -> Path:
    """The index of the ranks' finished traces (one list of collectives per rank, and the ranks of each process
    group they name), written whole or not at all."""
    ranks = []
    for rank, found in enumerate(collectives):
        path = rank_file(index, rank)
        size, digest = file_digest(path, f"rank {rank}'s trace")
        ranks.append({"rank": rank, "file": path.name, "bytes": size, "sha256": digest,
                      "collectives": [c.to_dict() for c in found]})
    body = msgpack.packb({"world_size": len(ranks), "program": program, "entry": entry, "ranks": ranks,
                          "groups": {name: list(members) for name, members in groups.items()}}, use_bin_type=True)
    with atomic_write(index, overwrite, doing="write the index of the ranks' traces") as out:
        out.write(HEADER.pack(MAGIC, VERSION, len(ranks)) + BODY.pack(len(body), zlib.crc32(body)) + body)
    return index


def adopt_rank_trace(index: Path, rank: int, overwrite: bool, partial: str | None) -> Path:
    """The recording of rank `rank`, whose process ended before it finished its trace, moved onto its file beside
    the index as it is (it reads up to its last complete step: checkpoint/trace.adopt_partial): `partial`, the
    temporary the rank said at launch it records to (a temporary's name keeps only the start of a long target's, so
    a search by name could take another rank's), which must lie beside that file; a RewindError naming the rank and
    why otherwise."""
    target = rank_file(index, rank)
    if partial is None or Path(partial).parent != target.parent or not os.path.lexists(partial):
        why = "it left no recording"
    else:
        try:
            return adopt_partial(Path(partial), target, overwrite)
        except RewindError as exc:  # a file the user did not allow to be replaced, what is no trace
            why = str(exc)
    raise RewindError(f"rank {rank} ended before finishing its trace {target.name}, and what it recorded could not be "
                      f"kept: {why}")


def file_digest(path: Path, what: str) -> tuple[int, str]:
    """(size, SHA-256 in hex) of a regular file that is no link."""
    size, digest = 0, hashlib.sha256()
    with _open_regular(path, what) as f:
        while chunk := _read(f, 1 << 20, path, what):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _size(path: Path, what: str) -> int:
    """The size of a regular file that is no link (opened, not read)."""
    with _open_regular(path, what) as f:
        return os.fstat(f.fileno()).st_size


def _open_regular(path: Path, what: str, follow: bool = False) -> BinaryIO:
    """`path` opened to read, refused unless a regular file: not a folder, a FIFO or a device (never waited on),
    nor a link unless `follow` (a rank's trace behind a link could lie outside the index's folder)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise RewindError(f"{what} {path} is not there") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        if getattr(exc, "errno", None) == errno.ELOOP and not follow:
            raise RewindError(f"{what} {path} is a link: the ranks' traces are plain files beside their index") \
                from None
        raise RewindError(f"cannot read {what} {path}: {os_reason(exc)}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RewindError(f"{what} {path} is not a regular file")
    return os.fdopen(fd, "rb")


def _read(f: BinaryIO, size: int, path: Path, what: str) -> bytes:
    """Up to `size` bytes of an open file; a RewindError in words when the system cannot read it (/proc/self/mem)."""
    try:
        return f.read(size)
    except OSError as exc:
        raise RewindError(f"cannot read {what} {path}: {os_reason(exc)}") from None


# -- opening -------------------------------------------------------------------------------------------------
def index_ranks(path: str | None) -> int | None:
    """The world size an index's header gives; None when `path` is no index of many ranks' traces (a single trace:
    opening it says what it is). Only the header is read: `read_index` checks the rest."""
    if not path:
        return None
    try:
        with _open_regular(Path(path), "index", follow=True) as f:
            head = _read(f, HEADER.size, Path(path), "index")
    except RewindError:
        return None
    if len(head) < HEADER.size or head[:len(MAGIC)] != MAGIC:
        return None
    return HEADER.unpack(head)[2]


def read_index(path: str) -> TraceIndex:
    """The index at `path`, checked whole, with every rank's trace beside it, of its size (its SHA-256 is checked by
    the rank that opens it: `check_rank_trace`); a RewindError naming the problem otherwise."""
    with _open_regular(Path(path), "index", follow=True) as f:  # first: a path the system refuses is said in words
        data = _read(f, MAX_INDEX + 1, Path(path), "index")
    index = Path(os.path.realpath(path))  # its ranks' traces lie beside the file itself, not beside a link to it
    if len(data) > MAX_INDEX:
        raise RewindError(f"{index} is over {MAX_INDEX >> 20} MiB: it is no index of ranks' traces")
    if len(data) < HEADER.size or data[:len(MAGIC)] != MAGIC:
        raise RewindError(f"{index} is not an index of ranks' traces (no index header at offset 0)")
    _, version, world_size = HEADER.unpack_from(data)
    if version not in (1, VERSION):
        raise RewindError(f"{index} is rank index format version {version}; this reader reads versions 1 and "
                          f"{VERSION}")
    if not 1 <= world_size <= MAX_RANKS:
        raise RewindError(f"index {index} says {world_size} ranks; a world size is from 1 to {MAX_RANKS}")
    body = _body(index, data[HEADER.size:])
    return _checked(index, world_size, body)


def _body(index: Path, data: bytes) -> Any:
    if len(data) < BODY.size:
        raise RewindError(f"index {index} ends before its body (truncated)")
    length, crc = BODY.unpack_from(data)
    payload = data[BODY.size:]
    if len(payload) != length:
        raise RewindError(f"index {index}: its body is {len(payload)} bytes where its header says {length} "
                          "(truncated or damaged)")
    if zlib.crc32(payload) != crc:
        raise RewindError(f"index {index}: its body fails its checksum (damaged)")
    body, problem = unpacked(payload, max_bin_len=0, max_ext_len=0)
    if problem is None:
        return body
    raise RewindError(f"index {index}: its body does not decode: {problem}")


def _checked(index: Path, world_size: int, body: Any) -> TraceIndex:
    def bad(what: str) -> RewindError:
        return RewindError(f"index {index}: {what}")

    if not isinstance(body, dict):
        raise bad("its body is not a map")
    if body.get("world_size") != world_size or type(body.get("world_size")) is not int:
        raise bad(f"its body says world size {shown(body.get('world_size'))}, its header {world_size}")
    program, entry = body.get("program"), body.get("entry")
    for value, what in ((program, "program"), (entry, "entry")):
        if not _text(value):
            raise bad(f"its {what} is {shown(value)}, not a name")
    ranks = body.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != world_size:
        raise bad(f"it lists {shown(ranks)} as its ranks, not one entry for each of its {world_size} ranks")
    traces = tuple(_rank_trace(index, r, entry, bad) for r, entry in enumerate(ranks))
    if len({t.path for t in traces}) != world_size:
        raise bad("it names one file for two ranks")
    return TraceIndex(index, world_size, program, entry, traces, _groups(body.get("groups", {}), world_size, bad))


def _groups(groups: Any, world_size: int, bad) -> dict[str, tuple[int, ...]]:
    """The process groups' ranks: a map of names to distinct ranks of the index, in order."""
    if not isinstance(groups, dict) or len(groups) > MAX_COLLECTIVES:
        raise bad(f"its groups are {shown(groups)}, not a map of names to ranks")
    for name, members in groups.items():
        if not _text(name) or type(members) is not list or not members or not all(
                type(r) is int and 0 <= r < world_size for r in members) or members != sorted(set(members)):
            raise bad(f"its group {shown(name)} is {shown(members)}, not ranks of the index in order")
    return {name: tuple(members) for name, members in groups.items()}


def _rank_trace(index: Path, rank: int, entry: Any, bad) -> RankTrace:
    if not isinstance(entry, dict) or entry.get("rank") != rank or type(entry.get("rank")) is not int:
        raise bad(f"its entry for rank {rank} is {shown(entry)}")
    name = entry.get("file")
    if (not _text(name) or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
            or name == index.name):
        raise bad(f"rank {rank}'s trace is named {shown(name)}: a file name in the index's own folder, with no "
                  "folder part")
    size, digest = entry.get("bytes"), entry.get("sha256")
    if type(size) is not int or not 0 <= size < _I64:
        raise bad(f"rank {rank}'s trace size is {shown(size)}")
    if not isinstance(digest, str) or len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
        raise bad(f"rank {rank}'s digest is {shown(digest)}, not a SHA-256 in hex")
    collectives = entry.get("collectives")
    if not isinstance(collectives, list) or len(collectives) > MAX_COLLECTIVES:
        raise bad(f"rank {rank}'s collectives are {shown(collectives)}")
    found: list[Collective] = []
    for c in collectives:
        found.append(_collective(c, len(found) + 1, found[-1].tick if found else -1, f"rank {rank}'s", bad))
    path = index.parent / name
    _check_size(index, rank, path, _size(path, f"rank {rank}'s trace"), size)
    return RankTrace(rank, path, size, digest, tuple(found))


def check_rank_trace(index: str, rank: int, path: str, size: int, sha256: str) -> None:
    """Refuse rank `rank`'s trace at `path` unless it holds the bytes its index says (size and SHA-256): run by the
    rank itself before it opens the file, so every rank hashes its own at once."""
    got_size, got_digest = file_digest(Path(path), f"rank {rank}'s trace")
    _check_size(Path(index), rank, Path(path), got_size, size)
    if got_digest != sha256:
        raise RewindError(f"index {index}: rank {rank}'s trace {Path(path).name} does not match its SHA-256 in the "
                          "index (the file was changed or replaced)")


def _check_size(index: Path, rank: int, path: Path, got: int, size: int) -> None:
    if got != size:
        raise RewindError(f"index {index}: rank {rank}'s trace {path.name} has {got} bytes; the index says {size} (the "
                          "file was changed or replaced)")


def _collective(d: Any, number: int, after: int, whose: str, bad) -> Collective:
    what = f"{whose} collective #{number}"
    if not isinstance(d, dict):
        raise bad(f"{what} is {shown(d)}, not a map")
    for key, kind in _COLLECTIVE_FIELDS.items():
        value = d.get(key)
        if type(value) is not kind or (kind is str and not _text(value, empty=True)):
            raise bad(f"{what}: its {key} is {shown(value)}")
        if kind is list and (len(value) > _MAX_LIST or not all(_text(v) for v in value)):
            raise bad(f"{what}: its {key} are {shown(value)}")
    if d["number"] != number:
        raise bad(f"{what} is numbered {shown(d['number'])}")
    if not _transfers(d.get("p2p", [])):
        raise bad(f"{what}: its p2p transfers are {shown(d.get('p2p'))}")
    if not after < d["tick"] < _I64:
        raise bad(f"{what} is at tick {shown(d['tick'])}, not after the one before it")
    return Collective.from_dict(d)


def _transfers(value: Any) -> bool:
    """A send's or recv's transfers as an index holds them: [["send" or "recv", peer, tag, "float32[8]"], …]."""
    return type(value) is list and len(value) <= _MAX_LIST and all(
        type(t) is list and len(t) == 4 and t[0] in ("send", "recv") and type(t[1]) is int and 0 <= t[1] < MAX_RANKS
        and type(t[2]) is int and -_I64 <= t[2] < _I64 and _text(t[3]) for t in value)


def check_agrees(index: TraceIndex, rank: int, found: list[Collective]) -> None:
    """Refuse a rank's trace whose collectives (read from its Program) are not the ones its index lists."""
    said, name = index.ranks[rank].collectives, index.ranks[rank].path.name
    if tuple(found) == said:
        return
    for a, b in zip(found, said):
        if a != b:
            raise RewindError(f"index {index.path}: rank {rank}'s trace {name} has {a.describe()} at tick {a.tick} "
                              f"where the index says {b.describe()} at tick {b.tick}")
    raise RewindError(f"index {index.path}: rank {rank}'s trace {name} has {len(found)} collective(s); the index "
                      f"says {len(said)}")


def _text(value: Any, empty: bool = False) -> bool:
    return isinstance(value, str) and (empty or bool(value)) and len(value) <= _MAX_TEXT
