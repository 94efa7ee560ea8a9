"""A program cannot take the server down: each session's engine is its own process, and its end is explained.

Every test drives a real server through the wire with a hostile `build()` from tests/models/hostile.py.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from dap_server import pool
from tests.dap.processes import alive, children, engines, wait_until
from tests.dap.wire import MODELS, DapError, Debugger, TcpServer

HOSTILE = MODELS / "hostile.py"
GRACE = "1"  # --stop-grace: seconds a hung engine gets before it is stopped


def launch(debugger: Debugger, entry: str, **options) -> dict:
    return debugger.request("launch", {"program": str(HOSTILE), "entry": entry, "driver": "torch:cpu", **options})


def launch_good_program(debugger: Debugger) -> dict:
    """The same connection still debugs: launch the well-behaved entry and run it to its end."""
    mark = debugger.client.mark()
    launch(debugger, "build")
    debugger.client.wait_for("initialized", after=mark)
    return debugger.motion("configurationDone", {})


@pytest.fixture(params=["pool"])
def server(request, schema, monkeypatch):
    """A server whose engines come from the engine pool, or, as `spawn`, that it starts itself."""
    if request.param == "spawn":
        monkeypatch.delenv(pool.POOL_VARIABLE, raising=False)
    debugger = Debugger.spawn(schema, ["--stop-grace", GRACE])
    debugger.initialize()
    yield debugger
    debugger.close()


@pytest.mark.parametrize("entry, said", [("build_exit", r"the program called sys\.exit\(3\) while Rewind ran 'launch'"),
                                         ("build_interrupt", "the program raised a keyboard interrupt")])
def test_a_program_that_exits_or_is_interrupted_in_build_fails_only_its_launch(server, entry, said):
    engine = engines(server.client.process.pid)
    with pytest.raises(DapError, match=said):
        launch(server, entry)
    assert engines(server.client.process.pid) == engine  # the same engine goes on
    assert launch_good_program(server)["reason"] == "end"


@pytest.mark.parametrize("server", ["pool", "spawn"], indirect=True)  # forked by the pool, or started by the server
def test_os_exit_ends_the_engine_and_a_new_launch_gets_a_fresh_one(server):
    mark = server.client.mark()
    with pytest.raises(DapError, match="engine ended: its process exited with status 3"):
        launch(server, "build_os_exit")
    server.client.wait_for("terminated", after=mark)
    (said,) = [b for name, b in server.client.events_since(mark) if name == "output" and "engine ended" in b["output"]]
    assert said["category"] == "important"
    with pytest.raises(DapError, match="this debug session has ended .* send 'launch'"):
        server.request("stackTrace", {"threadId": 1})
    assert server.request("threads") == {"threads": []}
    assert launch_good_program(server)["reason"] == "end"
    assert server.client.process.poll() is None


@pytest.mark.parametrize("server", ["pool", "spawn"], indirect=True)  # forked by the pool, or started by the server
def test_a_segfault_in_native_code_is_named_and_the_server_keeps_serving(server):
    with pytest.raises(DapError, match=r"crashed \(SIGSEGV: a fault in native code"):
        launch(server, "build_segfault")
    assert launch_good_program(server)["reason"] == "end"


def assert_stopped_by(server: Debugger, stop: str, command: str, arguments: dict, what: str) -> None:
    """`command` runs the program's code that never returns; `stop` (a pause, or a cancel of it) ends the engine
    after the grace period, the request fails saying why, and the next launch gets a fresh engine."""
    mark = server.client.mark()
    running = server.client.send(command, arguments)
    time.sleep(0.5)
    (engine,) = engines(server.client.process.pid)
    server.request(stop, {"threadId": 1} if stop == "pause" else {"requestId": running.seq}, timeout=30)
    response = running.wait(30)
    assert not response.success
    assert f"{what} did not return within {GRACE} s after '{stop}'" in str(response.body)
    server.client.wait_for("terminated", after=mark)
    assert wait_until(lambda: not alive(engine), 10), "the engine was left running"
    assert launch_good_program(server)["reason"] == "end"


@pytest.mark.parametrize("stop", ["pause", "cancel"])
def test_pause_or_cancel_stops_a_build_that_never_returns(server, stop):
    assert_stopped_by(server, stop, "launch", {"program": str(HOSTILE), "entry": "build_spin"}, "build()")


def test_disconnect_ends_a_hung_engine_and_the_server(schema):
    debugger = Debugger.spawn(schema, ["--stop-grace", GRACE])
    debugger.initialize()
    debugger.client.send("launch", {"program": str(HOSTILE), "entry": "build_spin"})
    time.sleep(0.5)
    (engine,) = engines(debugger.client.process.pid)
    started = time.monotonic()
    debugger.request("disconnect", {}, timeout=30)
    debugger.client.close(timeout=30)
    assert debugger.client.process.returncode == 0
    assert not alive(engine), "the hung engine outlived its server"
    assert time.monotonic() - started < 30


def test_what_a_program_prints_arrives_as_output_up_to_a_limit(server):
    mark = server.client.mark()
    launch(server, "build_chatty")
    server.client.wait_for("initialized", after=mark)
    outputs = [b for name, b in server.client.events_since(mark) if name == "output"]
    printed = [b["output"] for b in outputs if b.get("category") == "stdout"]
    shown = sum(len(text) for text in printed)
    assert 2**20 - 1024 <= shown <= 2**20  # 4 MiB printed, the first MiB shown
    assert set("".join(printed)) == {"x", "\n"}
    assert any("printed more than 1 MiB" in b["output"] for b in outputs)
    assert server.motion("configurationDone", {})["reason"] == "end"


@pytest.mark.parametrize("server", ["pool", "spawn"], indirect=True)  # forked by the pool, or started by the server
def test_an_engine_that_dies_while_recording_leaves_the_recording_to_reopen(server, tmp_path):
    target = tmp_path / "run.rwtrace"
    mark = server.client.mark()
    launch(server, "build", record=str(target), stopOnEntry=True)
    server.client.wait_for("initialized", after=mark)
    server.motion("configurationDone", {})
    for _ in range(3):
        server.motion("next")
    (engine,) = engines(server.client.process.pid)
    os.kill(engine, signal.SIGKILL)  # what a device fault does to a process
    terminated = server.client.wait_for("terminated", after=mark)
    assert terminated["restart"] == {"trace": str(target)}
    (said,) = [b["output"] for name, b in server.client.events_since(mark)
               if name == "output" and "engine ended" in b["output"]]
    assert "killed (SIGKILL" in said and str(target) in said
    # The client restarts as DAP says: the launch arguments again, with the restart value as `__restart`.
    again = server.client.mark()
    launch(server, "build", record=str(target), __restart=terminated["restart"])
    server.client.wait_for("initialized", after=again)
    assert server.motion("configurationDone", {})["reason"] in ("end", "entry")
    assert server.motion("stepBack")["reason"] in ("step", "entry")


def test_a_tcp_server_outlives_an_engine_that_exits(schema):
    tcp = TcpServer("--stop-grace", GRACE)
    try:
        first = Debugger.connect(schema, tcp.port)
        first.initialize()
        with pytest.raises(DapError, match="exited with status 3"):
            launch(first, "build_os_exit")
        second = Debugger.connect(schema, tcp.port)
        second.initialize()
        assert launch_good_program(second)["reason"] == "end"
        second.close()
        first.close()
        assert tcp.process.poll() is None
    finally:
        tcp.stop()


def test_restart_after_the_engine_died_reopens_the_recording_with_the_same_breakpoints(server, tmp_path):
    """VS Code restarts with a `restart` request when the adapter supports it: the front brings a fresh engine
    to where the client was (initialized, the recording opened, its breakpoints set) and runs it from tick 0."""
    target = tmp_path / "run.rwtrace"
    source = HOSTILE.read_text().splitlines()
    line = next(i + 1 for i, text in enumerate(source) if "return torch.relu(h) * 2" in text)
    mark = server.client.mark()
    launch(server, "build", record=str(target))
    server.client.wait_for("initialized", after=mark)
    server.set_breakpoints(HOSTILE, [{"line": line}])
    assert server.motion("configurationDone", {})["reason"] == "breakpoint"
    (engine,) = engines(server.client.process.pid)
    os.kill(engine, signal.SIGKILL)
    server.client.wait_for("terminated", after=mark)
    again = server.client.mark()
    stop = server.motion("restart", {})
    assert stop["reason"] == "breakpoint" and server.top()["line"] == line  # the breakpoint came back with it
    assert not any(name == "initialized" for name, _ in server.client.events_since(again))
    (fresh,) = engines(server.client.process.pid)
    assert fresh != engine
    assert server.motion("stepBack")["reason"] in ("step", "entry")


def test_the_console_offers_the_recording_after_its_engine_died(tmp_path):
    """`rewind debug --record`: the engine is killed between two commands; the next motion says so and names
    `reopen`, which opens the recording with the same breakpoints."""
    import json
    import subprocess
    import sys

    from tests.dap.wire import ROOT

    target = tmp_path / "run.rwtrace"
    line = next(i + 1 for i, text in enumerate(HOSTILE.read_text().splitlines()) if "return torch.relu(h) * 2" in text)
    console = subprocess.Popen([sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())",
                                "debug", str(HOSTILE), "--record", str(target), "--json"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def command(text: str) -> dict:
            console.stdin.write(text + "\n")
            console.stdin.flush()
            return json.loads(console.stdout.readline())

        assert json.loads(console.stdout.readline())["ok"]  # the launch
        assert command(f"break hostile.py:{line}")["ok"]
        assert command("continue")["result"]["reason"] == "breakpoint"
        assert command("continue")["result"]["reason"] == "end"
        assert wait_until(lambda: children(console.pid) and engines(children(console.pid)[0]))
        (server,) = children(console.pid)
        (engine,) = engines(server)
        os.kill(engine, signal.SIGKILL)
        ended = command("continue")
        assert not ended["ok"] and "engine ended; `reopen` opens the recording it left" in ended["error"]
        reopened = command("reopen")
        assert reopened["ok"] and reopened["result"]["reason"] == "entry", reopened  # launched stopped on entry
        assert command("continue")["result"]["reason"] == "breakpoint"  # the breakpoint came back with it
        assert command("back")["ok"]
        console.stdin.close()
        assert console.wait(60) == 1  # one command failed: the continue the crash ended
    finally:
        console.kill()


def test_an_engine_killed_mid_save_leaves_the_old_file_and_no_temporary(server, tmp_path):
    target = tmp_path / "run.rwtrace"
    target.write_bytes(b"the user's own file")
    mark = server.client.mark()
    launch(server, "build_big", checkpoint={"budgetMB": 1024})
    server.client.wait_for("initialized", after=mark)
    assert server.motion("configurationDone", {})["reason"] == "end"
    (engine,) = engines(server.client.process.pid)
    saving = server.client.send("saveTrace", {"path": str(target), "overwrite": True})
    assert wait_until(lambda: any(tmp_path.glob(".run.rwtrace.*.partial")), 60), "the save never began"
    os.kill(engine, signal.SIGKILL)
    answer = saving.wait(30)
    assert not answer.success and "engine ended: it was killed" in str(answer.body)
    assert target.read_bytes() == b"the user's own file"
    assert not list(tmp_path.glob(".*.partial")), "the killed save left its temporary"


def test_a_file_that_appeared_at_the_recordings_path_is_not_replaced_by_it(server, tmp_path):
    target = tmp_path / "run.rwtrace"
    mark = server.client.mark()
    launch(server, "build", record=str(target), stopOnEntry=True)
    server.client.wait_for("initialized", after=mark)
    server.motion("configurationDone", {})
    server.motion("next")
    target.write_bytes(b"written by someone else meanwhile")
    (engine,) = engines(server.client.process.pid)
    os.kill(engine, signal.SIGKILL)
    terminated = server.client.wait_for("terminated", after=mark)
    assert target.read_bytes() == b"written by someone else meanwhile"
    (kept,) = tmp_path.glob(".run.rwtrace.*.partial")
    assert terminated["restart"] == {"trace": str(kept)}  # the recording is still offered, under its own name


@pytest.mark.parametrize("stop", ["pause", "cancel"])
def test_a_fix_files_code_that_never_returns_is_stopped_by_pause_or_cancel(server, stop):
    """repair runs the client's fix file: Python that computes without end holds the engine (and its GIL);
    only the front can end it."""
    assert launch_good_program(server)["reason"] == "end"
    fix = {"fixes": [{"text": "x = 9 ** 9 ** 9\nPATCHES = []\n"}]}
    assert_stopped_by(server, stop, "repair", fix, "the program")
