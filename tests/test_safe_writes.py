"""Rewind never destroys a file a user has: saves and recordings go to a hidden temporary beside the
target and move into place whole; existing files are replaced only when asked; links, FIFOs, devices,
folders and the trace being debugged are refused; bad paths are sentences naming the path and why."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import checkpoint.safe_files as safe_files
from checkpoint.safe_files import FileWriteError, TargetExists
from checkpoint.trace import TraceReader, adopt_partial
from hardware.session import LaunchOptions, Session
from provenance.reference import save_values
from tests.conftest import MODELS, ROOT, open_session

MODEL = MODELS / "slow_mlp.py"  # 60 small layers: quick to run, many frames to save
OLD = b"a file the user cares about\n" * 64


@pytest.fixture(scope="module")
def live():
    session = open_session(MODEL, budget_mb=1)
    session.run()
    return session


def partials(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.partial"))


def existing(tmp_path: Path, name: str = "run.rwtrace") -> Path:
    path = tmp_path / name
    path.write_bytes(OLD)
    return path


def opened(path: Path, events: list | None = None) -> Session:
    session = Session(events.append if events is not None else None)
    session.launch(LaunchOptions(trace=str(path), budget_mb=1))
    return session


# -- saving ------------------------------------------------------------------------------------------
def test_saving_onto_an_existing_file_keeps_it_unless_asked_to_overwrite(live, tmp_path):
    path = existing(tmp_path)
    with pytest.raises(TargetExists, match=rf"cannot write {path}: it exists; set overwrite to true to replace it"):
        live.save_trace(str(path))
    assert path.read_bytes() == OLD and partials(tmp_path) == []


def test_saving_with_overwrite_replaces_the_file_whole_and_keeps_its_permissions(live, tmp_path):
    path = existing(tmp_path)
    path.chmod(0o640)
    info = live.save_trace(str(path), overwrite=True)
    assert info["bytes"] == path.stat().st_size and path.read_bytes()[:8] == b"RWNDTRC\0"
    assert path.stat().st_mode & 0o777 == 0o640 and partials(tmp_path) == []
    assert opened(path).end == live.end


def test_saving_onto_the_trace_being_debugged_is_refused_and_it_still_opens(live, tmp_path):
    path = tmp_path / "debugged.rwtrace"
    live.save_trace(str(path))
    before = path.read_bytes()
    trace = opened(path)
    trace.goto(trace.end)
    for target in (str(path), str(tmp_path / "." / "debugged.rwtrace")):
        with pytest.raises(FileWriteError, match="it is the trace this session has open"):
            trace.save_trace(target, overwrite=True)
    assert path.read_bytes() == before
    assert opened(path).end == live.end


def test_saving_onto_the_programs_source_file_is_refused(live, tmp_path):
    with pytest.raises(FileWriteError, match="it is the program being debugged"):
        live.save_trace(str(MODEL), overwrite=True)
    assert "class Deep" in MODEL.read_text()


def _finishes(fn, seconds: float = 20.0):
    """fn's exception (or None), failing the test when fn is still blocked after `seconds`."""
    outcome: list = []

    def call():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still blocked after {seconds} s"
    return outcome[0]


def test_a_fifo_a_device_a_folder_and_a_socket_are_refused_without_blocking(live, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    error = _finishes(lambda: live.save_trace(str(fifo), overwrite=True))
    assert isinstance(error, FileWriteError) and "it is a named pipe (FIFO), not a regular file" in str(error)
    error = _finishes(lambda: live.save_trace("/dev/null", overwrite=True))
    assert isinstance(error, FileWriteError) and "cannot write /dev/null: it is a device file" in str(error)
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(FileWriteError, match=f"cannot write {folder}: it is a folder, not a regular file"):
        live.save_trace(str(folder), overwrite=True)
    assert fifo.is_fifo() and list(folder.iterdir()) == [] and partials(tmp_path) == []


def test_a_symbolic_link_is_refused_and_neither_it_nor_its_file_changes(live, tmp_path):
    real = existing(tmp_path, "real.rwtrace")
    link = tmp_path / "link.rwtrace"
    link.symlink_to(real)
    dangling = tmp_path / "dangling.rwtrace"
    dangling.symlink_to(tmp_path / "nowhere.rwtrace")
    for path in (link, dangling):
        with pytest.raises(FileWriteError, match=f"cannot write {path}: it is a symbolic link .*does not write "
                                                 f"through links"):
            live.save_trace(str(path), overwrite=True)
    assert link.is_symlink() and real.read_bytes() == OLD
    assert dangling.is_symlink() and not (tmp_path / "nowhere.rwtrace").exists()


@pytest.mark.parametrize("make, reason", [
    (lambda d: d / "nope" / "deeper" / "x.rwtrace", "the folder {d}/nope does not exist"),
    (lambda d: d / "file.txt" / "x.rwtrace", "{d}/file.txt is a file, not a folder"),
    (lambda d: d / ("n" * 300 + ".rwtrace"), "the name is too long for the file system (308 characters)"),
    (lambda d: d / "a\0b.rwtrace", "the path contains a NUL character"),
    (lambda d: "", "cannot write a file with no name"),
])
def test_a_path_that_cannot_be_written_is_a_sentence_naming_it_and_why(live, tmp_path, make, reason):
    (tmp_path / "file.txt").write_text("a regular file")
    path = make(tmp_path)
    with pytest.raises(FileWriteError) as caught:
        live.save_trace(str(path))
    message = str(caught.value)
    assert reason.format(d=tmp_path) in message
    assert "Error" not in message and "errno" not in message.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_write_error_says_each_reason_in_words():
    path = Path("/data/run.rwtrace")
    words = {errno.ENOSPC: "the disk is full", errno.EACCES: "permission denied", errno.EROFS: "read-only",
             errno.EINVAL: "does not accept this name", errno.EISDIR: "it is a folder", errno.EDQUOT: "quota"}
    for code, text in words.items():
        message = str(safe_files.write_error(path, OSError(code, os.strerror(code)), "write"))
        assert message.startswith("cannot write /data/run.rwtrace: ") and text in message


class FullDisk:
    """A file whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, file, room: int):
        self._file, self.room = file, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)


def full_disk_after(monkeypatch, room: int) -> None:
    real = os.fdopen
    monkeypatch.setattr(safe_files.os, "fdopen", lambda *args, **kw: FullDisk(real(*args, **kw), room))


def test_a_disk_full_mid_save_keeps_the_old_file_and_leaves_no_temporary(live, tmp_path, monkeypatch):
    path = existing(tmp_path)
    full_disk_after(monkeypatch, 20_000)
    with pytest.raises(FileWriteError, match=f"cannot write {path}: the disk is full"):
        live.save_trace(str(path), overwrite=True)
    assert path.read_bytes() == OLD and partials(tmp_path) == []


# -- recording -------------------------------------------------------------------------------------
def test_a_recording_goes_to_a_temporary_and_moves_onto_its_file_when_closed(tmp_path):
    path = existing(tmp_path)
    events: list = []
    with pytest.raises(TargetExists, match=f"cannot record to {path}: it exists; set overwrite to true"):
        open_session(MODEL, budget_mb=1, record=str(path))
    assert path.read_bytes() == OLD and partials(tmp_path) == []
    path.chmod(0o600)
    session = open_session(MODEL, budget_mb=1, record=str(path), overwrite=True, events=events)
    [started] = [e for e in events if e.kind == "recording"]
    partial = Path(started.partial)
    assert started.target == str(path) and partial.parent == tmp_path and partial.name.startswith(".run.rwtrace.")
    session.run()
    with pytest.raises(FileWriteError, match="it is the file this session is recording to"):
        session.save_trace(str(path), overwrite=True)
    assert path.read_bytes() == OLD and partial.stat().st_size > 10_000
    session.close()
    assert not partial.exists() and partials(tmp_path) == []
    assert path.stat().st_mode & 0o777 == 0o600  # the replaced file's permissions
    assert TraceReader(path).contents.warnings == [] and opened(path).end == session.end


def test_a_disk_full_mid_recording_stops_the_recording_and_keeps_what_came_before(tmp_path, monkeypatch):
    path = tmp_path / "full.rwtrace"
    events: list = []
    full_disk_after(monkeypatch, 1_150_000)  # past the initial values, into the run
    old = os.umask(0o027)
    try:
        session = open_session(MODEL, budget_mb=1, record=str(path), events=events)
    finally:
        os.umask(old)
    session.run()  # the run goes on
    said = [e.text for e in events if e.kind == "output" and "disk is full" in e.text]
    assert len(said) == 1 and said[0].startswith(f"cannot record to {path}: the disk is full")
    assert "the recording stops here, the trace keeps what came before" in said[0]
    monkeypatch.undo()
    session.close()
    assert path.stat().st_mode & 0o777 == 0o640  # a new file: 0o666 less the umask
    events.clear()
    trace = opened(path, events)
    assert 0 < trace.tl.frontier < session.end
    assert any("did not finish" in e.text for e in events if e.kind == "output")


def test_adopting_a_partial_recording_moves_it_only_with_the_overwrite_rule(tmp_path):
    events: list = []
    session = open_session(MODEL, budget_mb=1, record=str(tmp_path / "rec.rwtrace"), events=events)
    session.run()
    [partial] = [Path(e.partial) for e in events if e.kind == "recording"]
    target = existing(tmp_path, "adopted.rwtrace")
    with pytest.raises(TargetExists):
        adopt_partial(partial, target)
    assert target.read_bytes() == OLD and partial.exists()
    assert adopt_partial(partial, target, overwrite=True) == target
    assert not partial.exists() and opened(target).tl.frontier > 0
    junk = tmp_path / ".junk.rwtrace.0000.partial"
    junk.write_bytes(b"not a trace at all")
    with pytest.raises(FileWriteError, match="it is not a Rewind trace"):
        adopt_partial(junk, tmp_path / "other.rwtrace")
    assert not (tmp_path / "other.rwtrace").exists()


# -- saved reference values (torch.save) ------------------------------------------------------------
def test_saved_reference_values_keep_an_existing_file_unless_asked_to_overwrite(tmp_path):
    session = open_session(MODEL, budget_mb=1)
    path = existing(tmp_path, "ref.pt")
    with pytest.raises(TargetExists, match=f"cannot write {path}: it exists"):
        save_values(session.forensics.reference, str(path))
    assert path.read_bytes() == OLD
    assert save_values(session.forensics.reference, str(path), overwrite=True) == len(session.program.nodes)
    assert path.read_bytes()[:2] == b"PK" and partials(tmp_path) == []
    with pytest.raises(FileWriteError, match="it is a device file"):
        save_values(session.forensics.reference, "/dev/null", overwrite=True)


# -- kill -9 -----------------------------------------------------------------------------------------
CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from checkpoint import trace
from hardware.session import LaunchOptions, Session
events = []
s = Session(events.append)
s.launch(LaunchOptions({model!r}, driver="torch:cpu", budget_mb=1, record={record!r}, overwrite=True))
for e in events:
    if e.kind == "recording":
        print("partial", e.partial, flush=True)
s.run()
frame = trace.TraceWriter._frame
def slow(self, *args, **kw):  # a save that takes long enough to be killed in the middle
    frame(self, *args, **kw)
    time.sleep(0.002)
trace.TraceWriter._frame = slow
print("saving", flush=True)
s.save_trace({save!r}, overwrite=True)
print("saved", flush=True)
"""


def _grown(folder: Path, name: str, exclude: Path | None, timeout: float = 30.0) -> Path:
    """The temporary of a write to `name` in `folder` once it holds a few frames."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in folder.glob(f".{name}.*.partial"):
            if p != exclude and p.stat().st_size > 20_000:
                return p
        time.sleep(0.005)
    raise AssertionError(f"no growing temporary of {name} appeared in {timeout} s")


def test_a_kill_9_mid_save_and_mid_recording_leaves_the_old_files_whole(tmp_path):
    saved, recorded = existing(tmp_path, "saved.rwtrace"), existing(tmp_path, "recorded.rwtrace")
    script = CHILD.format(root=str(ROOT), model=str(MODEL), record=str(recorded), save=str(saved))
    child = subprocess.Popen([sys.executable, "-W", "ignore", "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        word, partial = child.stdout.readline().split()
        assert word == "partial"
        assert child.stdout.readline().strip() == "saving"
        in_flight = _grown(tmp_path, "saved.rwtrace", exclude=None)
        child.send_signal(signal.SIGKILL)
        assert child.stdout.read() == ""  # killed before "saved"
    finally:
        child.kill()
        child.wait()
    assert saved.read_bytes() == OLD and recorded.read_bytes() == OLD  # no garbage replaced either
    assert in_flight.exists()  # the dead save's temporary, hidden beside the file it would have become
    reader = TraceReader(partial)  # the dead recording: readable up to its last complete frame
    assert reader.contents.steps and any("did not finish" in w or "interrupted" in w for w in reader.contents.warnings)
    reader.close()
    with pytest.raises(TargetExists):
        adopt_partial(partial, recorded)
    adopt_partial(partial, recorded, overwrite=True)
    trace = opened(recorded)
    assert trace.tl.frontier == len(reader.contents.steps) > 0
