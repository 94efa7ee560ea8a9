"""Lower tiers of the checkpoint ring: host memory (lz4-compressed), then a spill file on disk.

The ring (device tier) spills what it evicts into the host tier; the host tier, when over its
budget, moves its oldest entries to the disk tier; the disk tier, when over its budget, drops
its oldest (they can still be recomputed from retained ancestors). Each tier has a byte budget
it never exceeds.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from typing import Any

import msgpack

from checkpoint.codec import decode_tensor, encode_tensor
from checkpoint.ring import VersionKey
from hardware.errors import RewindError
from hardware.ticks import Tick


class HostTier:
    def __init__(self, budget: int, below: "DiskTier | None" = None):
        self.budget = budget
        self.below = below
        self._items: OrderedDict[VersionKey, dict] = OrderedDict()
        self.used = 0
        self.raw = 0  # uncompressed bytes held

    def __contains__(self, key: VersionKey) -> bool:
        return key in self._items

    def put(self, key: VersionKey, tensor: Any) -> None:
        if key not in self._items:
            self.put_encoded(key, encode_tensor(tensor))

    def put_encoded(self, key: VersionKey, enc: dict) -> None:
        """Keep a version already compressed (`codec.encode_tensor`)."""
        if key in self._items:
            return
        size = len(enc["data"])
        if size > self.budget:
            if self.below is not None:
                self.below.put_encoded(key, enc)
            return
        while self.used + size > self.budget and self._items:
            old_key, old = self._items.popitem(last=False)
            self.used -= len(old["data"])
            self.raw -= old["nbytes"]
            if self.below is not None:
                self.below.put_encoded(old_key, old)
        self._items[key] = enc
        self.used += size
        self.raw += enc["nbytes"]

    def load(self, key: VersionKey) -> Any | None:
        enc = self._items.get(key)
        if enc is not None:
            return decode_tensor(enc)
        return self.below.load(key) if self.below is not None else None

    def drop_after(self, tick: Tick) -> None:
        for key in [k for k in self._items if k[1] >= tick]:
            enc = self._items.pop(key)
            self.used -= len(enc["data"])
            self.raw -= enc["nbytes"]
        if self.below is not None:
            self.below.drop_after(tick)

    def tier_of(self, key: VersionKey) -> str | None:
        if key in self._items:
            return "host (lz4)"
        return self.below.tier_of(key) if self.below is not None else None

    def close(self) -> None:
        if self.below is not None:
            self.below.close()


class DiskTier:
    """An append-only spill file; the budget counts live entries, and the file is compacted when
    dead entries outweigh live ones."""

    def __init__(self, budget: int, directory: str | None = None):
        self.budget = budget
        fd, self.path = _spill_file(directory)
        self._f = os.fdopen(fd, "w+b")
        self._where: OrderedDict[VersionKey, tuple[int, int]] = OrderedDict()
        self.used = 0

    def put_encoded(self, key: VersionKey, enc: dict) -> None:
        blob = msgpack.packb(enc, use_bin_type=True)
        if len(blob) > self.budget or key in self._where:
            return
        while self.used + len(blob) > self.budget and self._where:
            _, (_, size) = self._where.popitem(last=False)
            self.used -= size
        self._f.seek(0, os.SEEK_END)
        offset = self._f.tell()
        if offset > 2 * self.budget + (64 << 20):
            offset = self._compact()
        self._f.write(blob)
        self._where[key] = (offset, len(blob))
        self.used += len(blob)

    def _compact(self) -> int:
        live = [(k, self._read(k)) for k in self._where]
        self._f.seek(0)
        self._f.truncate()
        self._where.clear()
        for k, blob in live:
            self._where[k] = (self._f.tell(), len(blob))
            self._f.write(blob)
        return self._f.tell()

    def _read(self, key: VersionKey) -> bytes:
        offset, size = self._where[key]
        self._f.seek(offset)
        return self._f.read(size)

    def load(self, key: VersionKey) -> Any | None:
        if key not in self._where:
            return None
        return decode_tensor(msgpack.unpackb(self._read(key), raw=False))

    def drop_after(self, tick: Tick) -> None:
        for key in [k for k in self._where if k[1] >= tick]:
            self.used -= self._where.pop(key)[1]

    def tier_of(self, key: VersionKey) -> str | None:
        return "disk" if key in self._where else None

    def close(self) -> None:
        self._f.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _spill_file(directory: str | None) -> tuple[int, str]:
    """A new spill file in `directory` (the temp directory by default); a clear error naming the folder if not."""
    shown = directory if directory is None or len(directory) <= 200 else directory[:199] + "…"
    where = f"checkpoint.spillDir {shown}" if directory else f"the temp directory {tempfile.gettempdir()}"
    if directory is not None:
        if not directory.strip():
            raise RewindError("checkpoint.spillDir is empty: give a folder, or leave it out for the temp directory")
        if "\0" in directory:
            raise RewindError("checkpoint.spillDir contains a NUL character: it is not a folder name")
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise RewindError(f"{where} is a file, not a folder")
        if not os.path.exists(directory):
            raise RewindError(f"{where} does not exist: create the folder, or leave spillDir out")
    try:
        return tempfile.mkstemp(prefix="rewind-spill-", suffix=".bin", dir=directory)
    except PermissionError:
        raise RewindError(f"{where} is not writable: the disk tier cannot put its spill file there") from None
    except OSError as exc:
        reason = exc.strerror or "the file could not be created"
        raise RewindError(f"{where}: the disk tier's spill file could not be created ({reason.lower()})") from None
