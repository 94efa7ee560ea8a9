"""Relative paths mean what they mean where the user is: launch's `cwd`, the `rewind` commands run from any folder.

A model is written into a temporary folder (with a data file its build() reads by a relative path) and debugged
from there: over DAP with a relative `program`, `record` and `saveTrace` path and a `cwd`; with `rewind debug`,
`rewind forensics` and `rewind repair` run in that folder. A `cwd` that cannot be one is refused in words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dap.processes import engines, wait_until
from tests.dap.test_engine_process import HOSTILE
from tests.dap.wire import DapError, Debugger

MODEL = '''"""A model that reads its input's value from a file beside the folder it runs in."""
import torch
from torch import nn


class Scale(nn.Module):
    def forward(self, x):
        doubled = x * 2.0  # first line
        return doubled + 1.0  # second line


def build():
    scale = float(open("scale.txt").read())  # relative: the program runs in the session's working directory
    return Scale(), (torch.full((2, 3), scale),)
'''
SCALE = 3.5
PLAIN = MODEL.replace('float(open("scale.txt").read())', "3.5")  # the same model, reading no file
LEAKS = ("Error", "Traceback", "Exception", "errno", "pydantic", "NoneType")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The user's folder: models/tiny.py, and scale.txt that its build() reads."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.py").write_text(MODEL)
    (tmp_path / "scale.txt").write_text(str(SCALE))
    return tmp_path


@pytest.fixture
def server(schema):
    debugger = Debugger.spawn(schema)  # started in the Rewind checkout, as `rewind debug` starts it
    debugger.initialize(supportsProgressReporting=True)
    yield debugger
    debugger.close()


def launch(debugger: Debugger, **arguments) -> dict:
    mark = debugger.client.mark()
    debugger.request("launch", {"driver": "torch:cpu", "stopOnEntry": True, **arguments})
    debugger.client.wait_for("initialized", after=mark)
    return debugger.motion("configurationDone", {})


def line(text: str) -> int:
    return next(i for i, source in enumerate(MODEL.splitlines(), 1) if text in source)


def test_a_relative_program_record_and_save_resolve_against_cwd_where_the_program_runs(server, folder):
    assert launch(server, program="models/tiny.py", record="run.rwtrace", cwd=str(folder))["reason"] == "entry"
    sources = [s["path"] for s in server.request("loadedSources")["sources"]]
    assert str(folder / "models" / "tiny.py") in sources
    assert server.number("x.mean()") == SCALE  # build() read scale.txt from the cwd
    assert list(folder.glob(".run.rwtrace.*.partial")), "the recording is not beside run.rwtrace in the cwd"
    saved = server.request("saveTrace", {"path": "saved.rwtrace"})
    assert saved["path"] == str(folder / "saved.rwtrace") and (folder / "saved.rwtrace").is_file()
    with pytest.raises(DapError, match=f"saveTrace: {folder / 'saved.rwtrace'} exists; send overwrite"):
        server.request("saveTrace", {"path": "saved.rwtrace"})
    # A restart with new arguments and no `cwd` keeps the session's: the relaunch finishes the recording.
    stop = server.motion("restart", {"arguments": {"program": "./models/tiny.py", "driver": "torch:cpu",
                                                   "stopOnEntry": True}})
    assert stop["reason"] == "entry" and server.number("x.mean()") == SCALE
    assert (folder / "run.rwtrace").is_file() and not list(folder.glob(".run.rwtrace.*.partial"))
    assert server.top()["source"]["path"] == str(folder / "models" / "tiny.py")


def test_a_relative_trace_and_reference_resolve_against_cwd(server, folder, schema):
    saver = Debugger.spawn(schema)
    try:
        saver.initialize()
        assert launch(saver, program=str(folder / "models" / "tiny.py"), cwd=str(folder),
                      stopOnEntry=False)["reason"] == "end"
        saver.request("saveTrace", {"path": "run.rwtrace"})
    finally:
        saver.close()
    assert launch(server, trace="run.rwtrace", cwd=str(folder))["reason"] == "entry"
    assert server.number("x.mean()") == SCALE
    again = server.motion("restart", {"arguments": {"program": "models/tiny.py", "reference": "run.rwtrace",
                                                    "driver": "torch:cpu", "stopOnEntry": True}})
    assert again["reason"] == "entry"
    found = server.request("firstDivergence", {})
    assert found["reference"] == str(folder / "run.rwtrace") and found["divergence"] is None  # its own recording


@pytest.mark.parametrize("cwd, said", [
    (5, "field 'cwd': input should be a valid string, got 5"),
    (["/tmp"], "field 'cwd': input should be a valid string"),
    ("models", "'cwd' must be an absolute path (the folder relative paths start from), got 'models'"),
    ("", "'cwd' is empty"),
    ("/no/such/folder", "cwd /no/such/folder does not exist"),
    ("FILE", "is a file, not a folder"),
    ("/tmp\u0000/x", "'cwd' contains a NUL character"),
])
def test_a_cwd_that_cannot_be_one_is_refused_in_words_and_the_server_keeps_serving(server, folder, cwd, said):
    cwd = str(folder / "scale.txt") if cwd == "FILE" else cwd
    with pytest.raises(DapError) as refused:
        server.request("launch", {"program": "models/tiny.py", "driver": "torch:cpu", "cwd": cwd})
    message = refused.value.message
    assert message.startswith("launch: ") and said in message, message
    assert not any(leak in message for leak in LEAKS), message
    assert launch(server, program="models/tiny.py", cwd=str(folder))["reason"] == "entry"


def test_a_restart_after_the_engine_died_keeps_the_launchs_cwd(server, folder):
    assert launch(server, program="models/tiny.py", cwd=str(folder))["reason"] == "entry"
    mark = server.client.mark()
    (engine,) = engines(server.client.process.pid)
    os.kill(engine, signal.SIGKILL)
    server.client.wait_for("terminated", after=mark)
    # VS Code sends its configuration again; a client may leave `cwd` out: the session keeps the one it had.
    stop = server.motion("restart", {"arguments": {"program": "models/tiny.py", "driver": "torch:cpu",
                                                   "stopOnEntry": True}})
    assert stop["reason"] == "entry", stop
    assert server.top()["source"]["path"] == str(folder / "models" / "tiny.py")
    assert server.number("x.mean()") == SCALE


def test_an_engine_killed_mid_save_to_a_relative_path_leaves_no_temporary_in_cwd(server, tmp_path):
    launch(server, program=str(HOSTILE), entry="build_big", cwd=str(tmp_path), stopOnEntry=False,
           checkpoint={"budgetMB": 1024})
    (engine,) = engines(server.client.process.pid)
    saving = server.client.send("saveTrace", {"path": "big.rwtrace"})
    assert wait_until(lambda: any(tmp_path.glob(".big.rwtrace.*.partial")), 60), "the save never began in cwd"
    os.kill(engine, signal.SIGKILL)
    answer = saving.wait(30)
    assert not answer.success and "engine ended" in str(answer.body)
    assert not list(tmp_path.glob(".*.partial")), "the killed save left its temporary in the cwd"
    assert not (tmp_path / "big.rwtrace").exists()


# -- the `rewind` commands, run from the user's folder ----------------------------------------------------------

def rewind_in(folder: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())", *args]
    return subprocess.run(command, cwd=folder, input=stdin, capture_output=True, text=True, timeout=300)


def test_rewind_debug_takes_paths_relative_to_the_folder_it_runs_in(folder):
    script = folder / "session.rewind"
    script.write_text(f"break tiny.py:{line('second line')}\ncontinue\nprint x.mean()\nsave out.rwtrace\nquit\n")
    run = rewind_in(folder, "debug", "models/tiny.py", "-x", "session.rewind", "--driver", "torch:cpu",
                    "--record", "rec.rwtrace")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"breakpoint 1 at tiny.py:{line('second line')}" in run.stdout
    assert f"x.mean() = float32[] cpu = {SCALE}" in run.stdout
    assert "saved " in run.stdout and (folder / "out.rwtrace").is_file()
    assert (folder / "rec.rwtrace").is_file()
    inside = rewind_in(folder / "models", "debug", "./tiny.py", "--json", "--driver", "torch:cpu",
                       stdin="print x.mean()\nquit\n")
    records = [json.loads(text) for text in inside.stdout.splitlines()]
    # build() reads scale.txt relative to where the console runs: models/ has none, and says so
    assert inside.returncode == 1 and "scale.txt" in inside.stderr and "No such file" in inside.stderr, inside.stderr
    assert records == []
    (folder / "models" / "scale.txt").write_text("1.25")
    inside = rewind_in(folder / "models", "debug", "./tiny.py", "--json", "--driver", "torch:cpu",
                       stdin="print x.mean()\nquit\n")
    records = [json.loads(text) for text in inside.stdout.splitlines()]
    assert inside.returncode == 0, inside.stderr
    assert records[0]["command"] == "launch ./tiny.py" and records[1]["result"]["result"] == "float32[] cpu = 1.25"


def test_rewind_forensics_and_repair_name_the_files_they_were_given_from_the_folder_they_run_in(folder):
    forensics = rewind_in(folder, "forensics", "models/tiny.py", "--driver", "torch:cpu", "--no-ablate", "--json",
                          "--save-reference", "ref.pt")
    assert forensics.returncode == 0, forensics.stderr
    assert json.loads(forensics.stdout)["program"] == str(folder / "models" / "tiny.py")
    assert (folder / "ref.pt").is_file()
    (folder / "fix.py").write_text('PATCHES = {"mul": "float64"}\n')
    repair = rewind_in(folder, "repair", "./models/tiny.py", "--driver", "torch:cpu", "--json", "--fix", "fix.py",
                       "--knowledge", "kb.json", "--reference", "ref.pt")
    assert repair.returncode == 0, repair.stderr
    report = json.loads(repair.stdout)
    assert report["program"] == str(folder / "models" / "tiny.py") and report["verdict"] == "validated"
    assert report["reference"] == str(folder / "ref.pt")
    assert report["knowledge"]["path"] == str(folder / "kb.json")
    assert report["attempts"][0]["candidate"]["name"] == "fix.py"


# -- breakpoint numbers are never given twice -------------------------------------------------------------------

def test_the_console_never_gives_a_breakpoint_number_twice(tmp_path):
    (tmp_path / "plain.py").write_text(PLAIN)
    first, second = line("first line"), line("second line")
    script = (f"break plain.py:{first}\nbreak plain.py:{second}\ndelete 2\nbreak add\ndelete 1\n"
              f"break plain.py:{first}\nbreak\ncontinue\nquit\n")
    run = rewind_in(tmp_path, "debug", str(tmp_path / "plain.py"), "--json", "--driver", "torch:cpu", stdin=script)
    assert run.returncode == 0, run.stdout + run.stderr
    records = {r["command"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert records[f"break plain.py:{second}"]["result"]["number"] == 2
    assert records["break add"]["result"]["number"] == 3  # not 2 again, after delete 2
    assert records[f"break plain.py:{first}"]["result"]["number"] == 4  # not 1 again, after delete 1
    assert [bp["number"] for bp in records["break"]["result"]["breakpoints"]] == [3, 4]
    assert records["continue"]["result"]["breakpoints"] == [3]  # the hit is named by its own number


def test_breakpoint_ids_are_never_given_twice_in_a_session_over_dap(server, tmp_path):
    """The engine's ids are unique in the session, across kinds, after a setBreakpoints replaces a file's and after
    all of a kind are cleared (the console's numbering above rests on this)."""
    program = tmp_path / "plain.py"
    program.write_text(PLAIN)
    assert launch(server, program=str(program))["reason"] == "entry"
    seen: list[int] = []

    def ids(answer: dict) -> list[int]:
        got = [bp["id"] for bp in answer["breakpoints"]]
        assert not set(got) & set(seen), f"ids {got} were given before: {seen}"
        seen.extend(got)
        return got

    ids({"breakpoints": server.set_breakpoints(program, [{"line": line("first line")},
                                                          {"line": line("second line")}])})
    (kept,) = ids({"breakpoints": server.set_breakpoints(program, [{"line": line("second line")}])})
    ids(server.request("setFunctionBreakpoints", {"breakpoints": [{"name": "mul"}]}))
    ids(server.request("setFunctionBreakpoints", {"breakpoints": []}))
    (node,) = ids(server.request("setFunctionBreakpoints", {"breakpoints": [{"name": "add"}]}))
    ids(server.request("setDataBreakpoints", {"breakpoints": [{"dataId": "add"}]}))
    stop = server.motion("continue")
    assert stop["reason"] in ("breakpoint", "function breakpoint") and set(stop["hitBreakpointIds"]) <= {kept, node}
