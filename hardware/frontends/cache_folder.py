"""Where the program cache keeps its entries, and what is there (docs/cache.md).

An entry is one file, `<model>-<key>.rwprog`: two msgpack objects, what it was made from (a map of text), then the
Program as checkpoint/codec.py encodes it for trace files (hardware/session/program_cache.py writes and checks
it). The folder is `.rewind/programs/` beside the model file (`$REWIND_CACHE_DIR` instead
when set), marked for git and backup tools as a cache. Entries appear whole or not at all (written to a temporary
and renamed into place), a model's older entries go when its new one is written, and the least recently used go
once the folder holds more than its cap (`$REWIND_CACHE_MB`, default 256 MiB). Only files named as entries are
ever removed. This module knows files, not programs: `rewind cache` uses it without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import msgpack

from hardware.errors import RewindError, echo, os_reason

CACHE_DIR_ENV = "REWIND_CACHE_DIR"  # one folder for every model's entries, instead of one beside each model
NO_CACHE_ENV = "REWIND_NO_CACHE"  # set (to anything but 0): programs are exported every time, no entry written
CAP_ENV = "REWIND_CACHE_MB"
DEFAULT_CAP_MB = 256.0
FOLDER = Path(".rewind") / "programs"
SUFFIX = ".rwprog"  # the first format's entries (torch.export archives, `.pt2`) are listed and cleared, never read
_SHOWN = ("model", "entry", "driver", "torch")  # what `rewind cache list` shows of what an entry was made from
_ENTRY = re.compile(r"(?P<model>[0-9a-f]{12})-(?P<key>[0-9a-f]{40})\.(rwprog|pt2)")
_MAX_MADE_FROM = 2**16  # bytes of an entry's first object read to list it
# Written beside the entries the first time: git ignores the folder, backup tools skip it (bford.info/cachedir).
_MARKS = {Path(".rewind") / ".gitignore": "# Rewind's program cache (docs/cache.md): not part of the project\n*\n",
          Path(".rewind") / "CACHEDIR.TAG": "Signature: 8a477f597d28d172789f06886806bc55\n"
                                            "# Rewind's program cache (docs/cache.md)\n"}


def sealing_key() -> bytes | None:
    """This user's key for sealing entries (made once, readable by this user only, kept apart from every cache
    folder: $XDG_CACHE_HOME/rewind/entry-key, else ~/.cache/rewind/entry-key); None when there is nowhere to keep
    one (the cache is then not used). An entry sealed with it was written by Rewind for this user: one a project
    arrived with, or anyone else made, is not."""
    return _key_in(os.environ.get("XDG_CACHE_HOME", "").strip())


@lru_cache(maxsize=4)
def _key_in(base: str) -> bytes | None:
    try:
        folder = (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "rewind"
        path = folder / "entry-key"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with open(fd, "wb") as f:
                f.write(os.urandom(32).hex().encode())
        found = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
            return None  # not this user's own private file: no seal can be trusted
        key = path.read_bytes()
    except (OSError, RuntimeError):  # no home, a folder that cannot be written
        return None
    return key if len(key) == 64 else None


def cache_off() -> bool:
    return os.environ.get(NO_CACHE_ENV, "").strip() not in ("", "0")


def cap_bytes() -> int:
    """The folder's cap, from $REWIND_CACHE_MB; a value that is no size is refused in words."""
    text = os.environ.get(CAP_ENV, "").strip()
    try:
        mb = float(text) if text else DEFAULT_CAP_MB
    except ValueError:
        mb = -1.0
    if not 0 <= mb < 2**40:  # NaN fails this too
        raise RewindError(f"{CAP_ENV} is the program cache's size in MiB, a number such as {DEFAULT_CAP_MB:g} "
                          f"(0 keeps nothing); got {echo(repr(text))}")
    return int(mb * 2**20)


def model_id(model: Path, entry: str, driver: str, rank: str = "") -> str:
    """What names a model's entries: its file, entry, driver and rank (a newer entry of the same replaces the
    older)."""
    return hashlib.sha256(json.dumps([str(model.resolve()), entry, driver, rank]).encode()).hexdigest()[:12]


@dataclass
class Entry:
    path: Path
    size: int
    used: float  # when it was last written or loaded (seconds since the epoch)

    @cached_property
    def made_from(self) -> dict | None:
        """What its rewind.json says it was made from (_SHOWN); None when that cannot be read."""
        return _made_from(self.path)

    def describe(self) -> str:
        made = self.made_from
        what = (f"{echo(made['model'], 200)} ({echo(made['entry'])}, driver {echo(made['driver'])}, "
                f"torch {echo(made['torch'])})" if made else "an entry that cannot be read (damaged)")
        return f"{what}: {_size(self.size)}, used {_age(time.time() - self.used)} ago"

    def to_dict(self) -> dict:
        return {"file": str(self.path), "bytes": self.size, "used": self.used, "made_from": self.made_from,
                "made_from_reason": None if self.made_from else "the entry cannot be read"}


class CacheFolder:
    """One folder of entries."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def beside(cls, place: Path) -> "CacheFolder":
        """The folder for a model file or a project folder `place`: $REWIND_CACHE_DIR, else `.rewind/programs/`
        in the folder (the model's own)."""
        chosen = os.environ.get(CACHE_DIR_ENV, "").strip()
        if chosen:
            return cls(Path(chosen).expanduser().resolve())
        folder = place if place.is_dir() else place.parent
        return cls(folder.resolve() / FOLDER)

    def file_for(self, model: str, key: str) -> Path:
        return self.path / f"{model}-{key}{SUFFIX}"

    def read(self, file: Path, limit: int) -> bytes | None:
        """An entry's bytes, marked as just used; None when there is none (or it is larger than `limit`: no entry
        the cap allows is)."""
        try:  # without blocking: a pipe or a device named as an entry is not one
            with open(os.open(file, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                found = os.fstat(f.fileno())
                if not stat.S_ISREG(found.st_mode) or found.st_size > limit:
                    return None
                data = f.read(limit + 1)
            os.utime(file)
        except OSError:  # none yet, or removed by another process meanwhile
            return None
        return data if len(data) <= limit else None

    def write(self, model: str, key: str, data: bytes, cap: int) -> None:
        """Put an entry in place (whole, or not at all) instead of the model's older ones, then keep to `cap`."""
        target = self.file_for(model, key)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            self._mark()
            _write_new(partial, data)
            os.replace(partial, target)
            for entry in self.entries():
                if entry.path.name.startswith(model + "-") and entry.path != target:
                    self.remove(entry.path)
            self.keep_to(cap)
        except (OSError, RewindError):  # a folder that cannot be written leaves the cache unused, the launch as it was
            self.remove(partial)

    def keep_to(self, cap: int) -> None:
        """Remove the least recently used entries until the folder holds at most `cap` bytes."""
        entries = sorted(self.entries(), key=lambda e: e.used)
        total = sum(e.size for e in entries)
        for entry in entries:
            if total <= cap:
                break
            self.remove(entry.path)
            total -= entry.size

    def entries(self, model: Path | None = None) -> list[Entry]:
        """The entries here (those made from `model` only, when given), least recently used first."""
        found = []
        for file in self._files():
            try:
                info = file.stat()
            except OSError:  # removed meanwhile
                continue
            entry = Entry(file, info.st_size, info.st_mtime)
            if model is None or (entry.made_from and entry.made_from.get("model") == str(model.resolve())):
                found.append(entry)
        return sorted(found, key=lambda e: e.used)

    def remove(self, file: Path) -> bool:
        """Remove an entry; False when it was not there (or could not be removed)."""
        try:
            file.unlink()
            return True
        except OSError:
            return False

    def _files(self) -> list[Path]:
        try:
            return [p for p in self.path.iterdir() if _ENTRY.fullmatch(p.name)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise RewindError(f"cannot read the program cache {self.path}: {os_reason(exc)}") from None

    def _mark(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.path.name == FOLDER.name and self.path.parent.name == FOLDER.parent.name:
            for name, text in _MARKS.items():
                mark = self.path.parent.parent / name
                if not os.path.lexists(mark):
                    _write_new(mark, text.encode())


def _write_new(path: Path, data: bytes) -> None:
    """Write a file that must not exist yet, never through a link someone left at its name (a shared cache
    folder): O_EXCL and O_NOFOLLOW refuse both."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _made_from(file: Path) -> dict | None:
    """What an entry says it was made from, read as data (it is shown, never trusted)."""
    if file.suffix != SUFFIX:
        return None  # the first format's: shown as one that cannot be read, cleared like the others
    try:
        with open(file, "rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False, max_buffer_size=_MAX_MADE_FROM, read_size=4096)
            made = next(unpacker)
    except (OSError, StopIteration, ValueError, TypeError, msgpack.UnpackException):  # damaged, or not an entry
        return None
    if not isinstance(made, dict) or not all(isinstance(made.get(k), str) for k in _SHOWN):
        return None
    return {k: made[k] for k in _SHOWN}


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def _age(seconds: float) -> str:
    for unit, length in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            count = int(seconds // length)
            return f"{count} {unit}{'s' if count > 1 else ''}"
    return "seconds"
