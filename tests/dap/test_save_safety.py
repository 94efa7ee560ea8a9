"""saveTrace and launch's `record` through the wire never destroy a user's file: an existing file is replaced
only with `overwrite: true`; the open trace, links, FIFOs, devices and folders are refused; a path that
cannot be written is a sentence naming it and why. The console asks (or, from a script, refuses)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from checkpoint.trace import TraceReader
from dap_server.client import DapClient, DapError
from dap_server.console import Console
from dap_server.console_result import CommandError
from tests.dap.wire import MODELS, Debugger, rewind

MODEL = MODELS / "slow_mlp.py"
OLD = b"a file the user cares about\n" * 64


@pytest.fixture(scope="module")
def live(schema):
    debugger = Debugger.spawn(schema)
    debugger.start(MODEL, stopOnEntry=True)
    debugger.motion("continue")  # to the end
    yield debugger
    debugger.close()


def existing(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(OLD)
    return path


def refused(debugger: Debugger, arguments: dict, command: str = "saveTrace") -> str:
    with pytest.raises(DapError) as caught:
        debugger.request(command, arguments, timeout=30)
    message = caught.value.message
    assert "internal error" not in message and "Error" not in message and "Traceback" not in message
    return message


def test_save_trace_keeps_an_existing_file_unless_overwrite_is_sent(live, tmp_path):
    path = existing(tmp_path, "run.rwtrace")
    assert refused(live, {"path": str(path)}) == f"saveTrace: {path} exists; send overwrite: true to replace it"
    assert path.read_bytes() == OLD
    info = live.request("saveTrace", {"path": str(path), "overwrite": True})
    assert info["bytes"] == path.stat().st_size and TraceReader(path).contents.warnings == []
    assert [p.name for p in tmp_path.iterdir()] == ["run.rwtrace"]  # no temporary left beside it


@pytest.mark.parametrize("make, reason", [
    (lambda d: d / "nope" / "x.rwtrace", "cannot write {d}/nope/x.rwtrace: the folder {d}/nope does not exist"),
    (lambda d: d / "file.txt" / "x.rwtrace", "{d}/file.txt is a file, not a folder"),
    (lambda d: d / ("n" * 300), "the name is too long for the file system (300 characters)"),
    (lambda d: str(d / "a\0b.rwtrace"), "the path contains a NUL character"),
    (lambda d: d, "cannot write {d}: it is a folder, not a regular file"),
    (lambda d: "/dev/null", "cannot write /dev/null: it is a device file, not a regular file"),
])
def test_a_path_that_cannot_be_written_is_refused_in_words(live, tmp_path, make, reason):
    (tmp_path / "file.txt").write_text("a regular file")
    message = refused(live, {"path": str(make(tmp_path))})
    assert message.startswith("saveTrace: cannot write ") and reason.format(d=tmp_path) in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_a_fifo_and_a_symbolic_link_are_refused_without_blocking_or_writing_through(live, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "it is a named pipe (FIFO), not a regular file" in refused(live, {"path": str(fifo), "overwrite": True})
    real = existing(tmp_path, "real.rwtrace")
    link = tmp_path / "link.rwtrace"
    link.symlink_to(real)
    assert "it is a symbolic link" in refused(live, {"path": str(link), "overwrite": True})
    assert real.read_bytes() == OLD and link.is_symlink() and fifo.is_fifo()


def test_saving_onto_the_trace_being_debugged_is_refused_and_it_still_opens(live, schema, tmp_path):
    path = tmp_path / "debugged.rwtrace"
    live.request("saveTrace", {"path": str(path)})
    before = path.read_bytes()
    trace = Debugger.spawn(schema)
    try:
        trace.start(MODEL, trace=str(path), stopOnEntry=True)
        for overwrite in (False, True):
            message = refused(trace, {"path": str(path), "overwrite": overwrite})
            assert message == f"saveTrace: cannot write {path}: it is the trace this session has open; choose another file"
        assert trace.motion("continue")["reason"] == "end"
        assert trace.request("stackTrace", {"threadId": 1})["stackFrames"]
    finally:
        trace.close()
    assert path.read_bytes() == before and TraceReader(path).contents.warnings == []


def test_launch_records_over_an_existing_file_only_with_overwrite_and_only_when_closed(schema, tmp_path):
    path = existing(tmp_path, "recorded.rwtrace")
    debugger = Debugger.spawn(schema)
    try:
        debugger.initialize()
        launch = {"program": str(MODEL), "driver": "torch:cpu", "stopOnEntry": True}
        message = refused(debugger, {**launch, "record": str(path)}, "launch")
        assert message == f"cannot record to {path}: it exists; set overwrite to true to replace it"
        message = refused(debugger, {**launch, "overwrite": True}, "launch")
        assert "'overwrite' replaces an existing 'record' file: give 'record' too" in message
        debugger.request("launch", {**launch, "record": str(path), "overwrite": True})
        debugger.request("configurationDone")
        debugger.motion("continue")
        assert path.read_bytes() == OLD  # recording: the old file stays until the recording is closed
    finally:
        debugger.close()
    assert TraceReader(path).contents.warnings == [] and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_console_asks_before_replacing_and_refuses_from_a_script(tmp_path):
    path = existing(tmp_path, "console.rwtrace")
    console = Console(DapClient.spawn(), io.StringIO())
    questions: list[str] = []
    try:
        console.start({"program": str(MODEL)}, "torch:cpu", "build")
        with pytest.raises(CommandError, match=f"{path} exists and is kept; `save {path} --overwrite` replaces it"):
            console.cmd_save(str(path))  # no terminal to ask at: refused
        console.ask = lambda question: questions.append(question) or False
        assert console.cmd_save(str(path)).data == {"saved": False, "path": str(path)}
        assert path.read_bytes() == OLD and questions == [f"{path} exists: replace it? [y/N] "]
        console.ask = lambda question: True
        assert console.cmd_save(str(path)).data["bytes"] == path.stat().st_size
    finally:
        client = console.client
        client.request("disconnect", {}, timeout=20)
        client.close()


def test_rewind_debug_record_and_save_take_the_same_decision(tmp_path):
    recorded, saved = existing(tmp_path, "recorded.rwtrace"), existing(tmp_path, "saved.rwtrace")
    run = rewind("debug", str(MODEL), "--driver", "torch:cpu", "--record", str(recorded), "--json", stdin="quit\n")
    assert run.returncode == 2 and f"{recorded} exists and is kept; --overwrite replaces it" in run.stderr
    assert recorded.read_bytes() == OLD
    script = f"continue\nsave {saved}\nsave {saved} --overwrite\nquit\n"
    run = rewind("debug", str(MODEL), "--driver", "torch:cpu", "--record", str(recorded), "--overwrite", "--json",
                 stdin=script)
    records = [json.loads(line) for line in run.stdout.splitlines()]
    refusal, replaced = records[2], records[3]
    assert refusal["ok"] is False and f"`save {saved} --overwrite` replaces it" in refusal["error"]
    assert replaced["ok"] is True and replaced["result"]["bytes"] == saved.stat().st_size
    assert TraceReader(recorded).contents.warnings == [] and TraceReader(saved).contents.warnings == []
