"""Writing a user's file without ever destroying one: every file Rewind writes (traces, recordings,
saved reference values) goes through here.

- The target is checked first (`check_target`): a path with a NUL, a symbolic link (Rewind never
  writes through a link, nor replaces one: the user saves to the file the link points to, or removes
  it), anything but a regular file (a folder, a FIFO, a device, a socket), a file the session is using
  (the trace it has open, the file it records to, the program's sources) are refused; an existing
  regular file is replaced only when the caller says `overwrite`.
- The bytes go to a hidden temporary beside the target, `.NAME.XXXXXXXX.partial`, created exclusively
  (mode 0o666 less the umask, or the replaced file's mode), flushed and fsynced, then moved into place
  in one step (a hard link that fails when the target appeared meanwhile, or a rename when replacing)
  and the folder fsynced. A failure removes the temporary and leaves the target as it was; a writer
  killed mid-way leaves the target as it was and its temporary behind (`adopt_partial` in
  checkpoint/trace.py moves a recording's into place).
- Every OSError becomes one sentence naming the path and the reason in words (`write_error`).
"""

from __future__ import annotations

import errno
import glob
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Mapping

from hardware.errors import RewindError, os_reason

PARTIAL_SUFFIX = ".partial"
_NAME_KEEP = 160  # characters of the target's name kept in the temporary's (names are at most 255 bytes)


class FileWriteError(RewindError):
    """A file could not be written, or writing it would destroy something; the message says which and why."""

    def __init__(self, message: str, path: str | os.PathLike = ""):
        super().__init__(message)
        self.path = str(path)


class TargetExists(FileWriteError):
    """The target is an existing regular file and the caller did not ask to replace it."""


def write_error(path: str | os.PathLike, exc: OSError, doing: str = "write") -> FileWriteError:
    """The one sentence every writer shows for an OSError: 'cannot write PATH: REASON IN WORDS'."""
    return FileWriteError(f"cannot {doing} {path}: {_reason(Path(path), exc)}", path)


def _reason(path: Path, exc: OSError) -> str:
    code = exc.errno
    folder = path.parent
    if code == errno.ENOENT:
        missing = folder
        while not missing.parent.exists() and missing.parent != missing:
            missing = missing.parent
        return f"the folder {missing} does not exist"
    if code == errno.ENOTDIR:
        for ancestor in [folder, *folder.parents]:
            if ancestor.exists() or ancestor.is_symlink():
                if not ancestor.is_dir():
                    return f"{ancestor} is a file, not a folder"
                break
        return f"a part of the path before {path.name} is not a folder"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied (this user may not write in the folder {folder})"
    if code == errno.EISDIR:
        return "it is a folder, not a file"
    if code == errno.ENAMETOOLONG:
        return f"the name is too long for the file system ({len(path.name)} characters)"
    if code == errno.ENOSPC:
        return "the disk is full (no space left on the device)"
    if code == errno.EDQUOT:
        return "the disk quota is exceeded"
    if code == errno.EROFS:
        return "the file system is read-only"
    if code == errno.EINVAL:
        return "the file system does not accept this name"
    if code == errno.ELOOP:
        return "the path has too many symbolic links (a loop)"
    if code == errno.EIO:
        return "the disk reported an input/output error"
    if code in (errno.EMFILE, errno.ENFILE):
        return "too many files are open"
    if code == errno.EFBIG:
        return "the file would be larger than the file system allows"
    if code == errno.EEXIST:
        return "it exists"
    return os_reason(exc)


def check_target(path: str | os.PathLike, overwrite: bool = False, in_use: Mapping[str, str] | None = None,
                 doing: str = "write") -> Path:
    """Refuse a target that must not be written (see the module's docstring); the Path when it may be.

    `in_use` maps files the session is using to what they are ("the trace this session has open")."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise FileWriteError(f"cannot {doing} a file with no name: give a path", text)
    if "\0" in text:
        raise FileWriteError(f"cannot {doing} {text!r}: the path contains a NUL character", text)
    target = Path(text)
    if target.name in ("", ".", ".."):
        raise FileWriteError(f"cannot {doing} {text}: it names a folder, not a file", text)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise write_error(target, exc, doing) from None
    for used, what in (in_use or {}).items():
        if _same_file(target, st, used):
            raise FileWriteError(f"cannot {doing} {text}: it is {what}; choose another file", text)
    if st is None:
        return target
    if stat.S_ISLNK(st.st_mode):
        try:
            points_to = f" (to {os.readlink(target)})"
        except OSError:
            points_to = ""
        raise FileWriteError(f"cannot {doing} {text}: it is a symbolic link{points_to}; Rewind does not write "
                             f"through links: give the file it points to, or remove the link", text)
    if not stat.S_ISREG(st.st_mode):
        raise FileWriteError(f"cannot {doing} {text}: it is {_kind(st.st_mode)}, not a regular file", text)
    if not overwrite:
        raise TargetExists(f"cannot {doing} {text}: it exists; set overwrite to true to replace it", text)
    return target


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _same_file(target: Path, st: os.stat_result | None, used: str) -> bool:
    try:
        if os.path.realpath(target) == os.path.realpath(used):
            return True
        if st is None:
            return False
        other = os.stat(used)
        here = os.stat(target)  # follows a link: a link to the file in use is the file in use
        return (here.st_dev, here.st_ino) == (other.st_dev, other.st_ino)
    except (OSError, ValueError):
        return False


def partial_name(target: Path) -> Path:
    """A fresh hidden temporary beside `target`: .NAME.XXXXXXXX.partial."""
    return target.with_name(f".{target.name[:_NAME_KEEP]}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")


def partials_of(target: str | os.PathLike, since: float) -> list[Path]:
    """The temporaries of writes onto `target` last written at or after `since` (a writer that was killed
    leaves its temporary behind)."""
    target = Path(target)
    pattern = f".{glob.escape(target.name[:_NAME_KEEP])}.{'[0-9a-f]' * 8}{PARTIAL_SUFFIX}"
    found = []
    for path in target.parent.glob(pattern):
        try:
            if path.stat().st_mtime >= since:
                found.append(path)
        except OSError:
            pass
    return found


class AtomicFile:
    """A file written under a temporary name and moved onto `target` by `commit()`; `abort()` removes it.

    `file` is the binary file to write (unbuffered with `buffered=False`: a write that fails then leaves
    nothing pending); `partial_path` and `target_path` say where the bytes are and go."""

    def __init__(self, target: str | os.PathLike, overwrite: bool = False, in_use: Mapping[str, str] | None = None,
                 doing: str = "write", buffered: bool = True):
        self.target_path = check_target(target, overwrite, in_use, doing)
        self.overwrite, self.doing = overwrite, doing
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        for _ in range(8):
            self.partial_path = partial_name(self.target_path)
            try:
                fd = os.open(self.partial_path, flags, 0o666)
                break
            except FileExistsError:
                continue
            except OSError as exc:
                raise write_error(self.target_path, exc, doing) from None
        else:
            raise FileWriteError(f"cannot {doing} {self.target_path}: no free temporary name beside it",
                                 self.target_path)
        self.file: BinaryIO = os.fdopen(fd, "wb", buffering=-1 if buffered else 0)

    def commit(self, keep_on_failure: bool = False) -> Path:
        """Flush and fsync the bytes, move them onto the target, fsync the folder. On failure the target is
        as it was and the temporary is removed (kept, with `keep_on_failure`: a recording that cannot be
        placed stays at `partial_path`)."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            place(self.partial_path, self.target_path, self.overwrite, self.doing)
        except BaseException as exc:
            if keep_on_failure:
                try:
                    self.file.close()
                except OSError:
                    pass
            else:
                self.abort()
            if isinstance(exc, OSError):
                raise write_error(self.target_path, exc, self.doing) from None
            raise
        return self.target_path

    def abort(self) -> None:
        """Drop what was written: the target is untouched."""
        try:
            self.file.close()
        except OSError:
            pass
        try:
            os.unlink(self.partial_path)
        except OSError:
            pass


def place(partial: Path, target: Path, overwrite: bool, doing: str = "write") -> Path:
    """Move the finished temporary `partial` onto `target` in one step, with the overwrite rule, and fsync
    the folder. Refuses (FileWriteError, the temporary left where it is) a target that must not be replaced."""
    check_target(target, overwrite, doing=doing)
    existing = _lstat(target)
    if existing is not None:  # replacing a regular file, as asked: keep its permissions
        os.chmod(partial, stat.S_IMODE(existing.st_mode))
        os.replace(partial, target)
    else:
        try:
            os.link(partial, target)  # fails when the target appeared since the check: never clobbers
        except FileExistsError:
            raise TargetExists(f"cannot {doing} {target}: it exists; set overwrite to true to replace it",
                               target) from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                raise
            os.rename(partial, target)  # a file system without hard links: checked just above
        else:
            os.unlink(partial)
    _sync_folder(target.parent)
    return target


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # a file system that cannot sync a folder: the rename itself is done
    finally:
        os.close(fd)


@contextmanager
def atomic_write(target: str | os.PathLike, overwrite: bool = False, in_use: Mapping[str, str] | None = None,
                 doing: str = "write") -> Iterator[BinaryIO]:
    """`with atomic_write(path) as f: ...`: the file appears whole at `path` when the block ends, or not at all."""
    out = AtomicFile(target, overwrite, in_use, doing)
    try:
        yield out.file
    except BaseException as exc:
        out.abort()
        if isinstance(exc, OSError):
            raise write_error(out.target_path, exc, doing) from None
        raise
    out.commit()
