"""The engine pool (dap_server/pool/, docs/engine-pool.md) through the wire: a server given REWIND_ENGINE_POOL runs
each session in an engine the pool forks, with the server's environment and the launch's cwd, drawing what a fresh
process draws; it starts the engine itself when the pool refuses or is gone; the pool refuses what it cannot read
and keeps serving; an engine outlives a killed pool, and a stopped pool waits for its engines.

The pools here are this module's own (not the suite's, tests/conftest.py), so what is done to them reaches no other
test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dap_server import pool
from dap_server.pool.forks import Pool
from tests.dap.processes import alive, children, engines, wait_until
from tests.dap.wire import MODELS, DapError, Debugger

PROBE = MODELS / "pool_probe.py"


def start_pool(folder: Path) -> tuple[subprocess.Popen, str, Path]:
    """A pool of its own at folder/engines.sock, saying what it forks in folder/pool.log."""
    path, log = str(folder / "engines.sock"), folder / "pool.log"
    with open(log, "wb") as said:
        process = pool.spawn(path, verbose=True, stderr=said.fileno())
    assert pool.wait_ready(process, 120), log.read_text()
    return process, path, log


def stop_pool(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(30)


@pytest.fixture(scope="module")
def own_pool(tmp_path_factory):
    process, path, log = start_pool(tmp_path_factory.mktemp("own-pool"))
    yield process, path, log
    stop_pool(process)


@pytest.fixture
def pooled(own_pool, monkeypatch):
    """The servers this test spawns ask the module's pool."""
    monkeypatch.setenv(pool.POOL_VARIABLE, own_pool[1])
    return own_pool[0]


def probe(debugger: Debugger, cwd: Path, entry: str = "build") -> dict[str, str]:
    """Launch the probe in `cwd`, stopped on entry; what its build() said, by name."""
    mark = debugger.client.mark()
    assert debugger.start(PROBE, stopOnEntry=True, cwd=str(cwd), entry=entry)["reason"] == "entry"
    said = "".join(b["output"] for name, b in debugger.client.events_since(mark) if name == "output")
    line = next(line for line in said.splitlines() if line.startswith("probe "))
    return dict(part.split("=", 1) for part in line.split()[1:])


def test_a_pooled_engine_is_the_pools_child_with_the_servers_environment_and_the_launchs_cwd(schema, pooled,
                                                                                             monkeypatch, tmp_path):
    monkeypatch.setenv("REWIND_PROBE_MARK", "set-for-this-server")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read by Triton as it loads, which the pool has not loaded
    debugger = Debugger.spawn(schema)
    try:
        said = probe(debugger, tmp_path)
        assert said["mark"] == "set-for-this-server"  # not in the pool's environment: the server's, applied
        assert said["cwd"] == str(tmp_path)
        engine = int(said["pid"])
        assert engine in children(pooled.pid) and children(debugger.client.process.pid) == []
        assert engines(debugger.client.process.pid) == [engine]
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
    finally:
        debugger.close()
    assert wait_until(lambda: not alive(engine), 30), "the engine outlived its session"


def test_pooled_engines_draw_what_a_fresh_process_draws(schema, own_pool, monkeypatch, tmp_path):
    draws = []
    for how in ("pool", "pool", "spawn"):
        if how == "pool":
            monkeypatch.setenv(pool.POOL_VARIABLE, own_pool[1])
        else:
            monkeypatch.delenv(pool.POOL_VARIABLE)
        debugger = Debugger.spawn(schema)
        try:
            said = probe(debugger, tmp_path)
            forked = int(said["pid"]) in children(own_pool[0].pid)
            assert forked == (how == "pool"), how
            draws.append(said)
        finally:
            debugger.close()
    # torch's and numpy's global generators are seeded afresh in each process, as a fresh interpreter seeds them:
    # two engines forked from the same pool draw different numbers, as two started engines do
    assert len({d["torch"] for d in draws}) == 3 and len({d["numpy"] for d in draws}) == 3, draws


def test_an_environment_torch_reads_as_it_loads_is_refused_and_the_server_starts_the_engine(schema, pooled,
                                                                                         monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "7" if os.environ.get("OMP_NUM_THREADS") != "7" else "5")
    debugger = Debugger.spawn(schema, ["--log-level", "INFO"])
    try:
        said = probe(debugger, tmp_path)
        assert int(said["pid"]) in children(debugger.client.process.pid)
        assert int(said["pid"]) not in children(pooled.pid)
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
    finally:
        debugger.close()
    log = "\n".join(debugger.client.stderr_tail)
    assert "gave no engine (the engine's environment differs from the pool's in OMP_NUM_THREADS" in log, log


def test_a_pool_that_is_not_there_leaves_the_server_starting_engines_itself(schema, monkeypatch, tmp_path):
    monkeypatch.setenv(pool.POOL_VARIABLE, str(tmp_path / "nobody.sock"))
    debugger = Debugger.spawn(schema)
    try:
        said = probe(debugger, tmp_path)
        assert int(said["pid"]) in children(debugger.client.process.pid)
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
    finally:
        debugger.close()


def ask(path: str, message: bytes, fds: list[int]) -> dict:
    """One raw request to the pool; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(30)
        sock.connect(path)
        socket.send_fds(sock, [message], fds)
        data, got, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        for fd in got:
            os.close(fd)
        return json.loads(data) if data else {}


def good_request(**changes) -> dict:
    return {"argv": [], "env": dict(os.environ), "cwd": os.getcwd(), "executable": sys.executable, "root": pool.ROOT,
            **changes}


@pytest.mark.parametrize("message, fds, said", [
    (b"\xff not json", 3, "the request is not JSON"),
    (b"[1, 2]", 3, "the request is not a JSON object"),
    (json.dumps(good_request()).encode(), 0, "carries 0 descriptors"),
    (json.dumps(good_request()).encode(), 1, "carries 1 descriptors"),
    (json.dumps(good_request(argv=["--rank-launcher", "5"])).encode(), 3, "plain session engines"),
    (json.dumps(good_request(argv=["--log-level", "LOUD"])).encode(), 3, "plain session engines"),
    (json.dumps(good_request(env={"A": 1})).encode(), 3, "'env' is not an environment"),
    (json.dumps(good_request(env={"A=B": "c"})).encode(), 3, "'env' is not an environment"),
    (json.dumps(good_request(cwd="/no/such/folder")).encode(), 3, "/no/such/folder is not a folder"),
    (json.dumps(good_request(cwd=None)).encode(), 3, "'cwd' is not a path"),
    (json.dumps(good_request(root="/elsewhere")).encode(), 3, "it serves the Rewind in"),
    (json.dumps(good_request(executable="/usr/bin/python2")).encode(), 3, "and this server runs /usr/bin/python2"),
])
def test_the_pool_refuses_a_request_it_cannot_take_and_keeps_serving(own_pool, schema, monkeypatch, tmp_path,
                                                                     message, fds, said):
    process, path, log = own_pool
    ends = [os.open(os.devnull, os.O_RDWR) for _ in range(fds)]
    try:
        answer = ask(path, message, ends)
    finally:
        for fd in ends:
            os.close(fd)
    assert said in answer.get("refused", ""), answer
    assert "Traceback" not in log.read_text()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as leaving:  # a peer that says nothing and leaves
        leaving.connect(path)
    monkeypatch.setenv(pool.POOL_VARIABLE, path)
    debugger = Debugger.spawn(schema)  # and the pool still forks sessions
    try:
        assert int(probe(debugger, tmp_path)["pid"]) in children(process.pid)
    finally:
        debugger.close()


def test_a_rewind_file_changed_since_the_pool_imported_it_is_refused(tmp_path):
    edited = tmp_path / "module.py"
    edited.write_text("x = 1\n")
    st = edited.stat()
    unopened = Pool(str(tmp_path / "unused.sock"))
    unopened.files = {str(edited): (st.st_size, st.st_mtime_ns)}
    request = good_request(env={})
    assert unopened._refusal(request) is None
    edited.write_text("x = 22\n")
    assert "has changed since the pool imported it: restart the pool" in unopened._refusal(request)


def test_an_engine_outlives_a_killed_pool_and_its_end_is_said_to_be_unknown(schema, monkeypatch, tmp_path):
    process, path, _ = start_pool(tmp_path)
    monkeypatch.setenv(pool.POOL_VARIABLE, path)
    debugger = Debugger.spawn(schema)
    try:
        engine = int(probe(debugger, tmp_path)["pid"])
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        assert debugger.request("threads")["threads"]  # the session goes on without the pool
        assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
        mark = debugger.client.mark()
        os.kill(engine, signal.SIGKILL)
        debugger.client.wait_for("terminated", after=mark)
        said = "".join(b["output"] for name, b in debugger.client.events_since(mark) if name == "output")
        assert "the engine pool that started it ended first, so how it ended is not known" in said, said
        assert debugger.client.process.poll() is None
    finally:
        debugger.close()
        stop_pool(process)


def test_a_stopped_pool_listens_no_more_and_ends_after_its_engines_have(schema, monkeypatch, tmp_path):
    process, path, log = start_pool(tmp_path)
    monkeypatch.setenv(pool.POOL_VARIABLE, path)
    debugger = Debugger.spawn(schema)
    try:
        debugger.initialize()
        assert wait_until(lambda: engines(debugger.client.process.pid), 30)  # a stdio server starts its engine at once
        (engine,) = engines(debugger.client.process.pid)
        assert engine in children(process.pid)
        process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: not os.path.exists(path), 30), "the stopped pool's socket is still there"
        assert process.poll() is None and alive(engine)  # it waits for the engine it forked
        mark = debugger.client.mark()
        with pytest.raises(DapError, match="engine ended: its process exited with status 3"):
            debugger.request("launch", {"program": str(PROBE), "entry": "build_exit_3", "driver": "torch:cpu"})
        debugger.client.wait_for("terminated", after=mark)
        assert process.wait(30) == 0
        assert f"engine {engine} ended with exit code 3" in log.read_text()
        mark = debugger.client.mark()  # a new launch: the server starts its engine itself
        debugger.request("launch", {"program": str(PROBE), "driver": "torch:cpu", "stopOnEntry": True})
        debugger.client.wait_for("initialized", after=mark)
        assert debugger.motion("configurationDone", {})["reason"] == "entry"
        assert len(engines(debugger.client.process.pid)) == 1
        assert engines(debugger.client.process.pid) == children(debugger.client.process.pid)
    finally:
        debugger.close()
        stop_pool(process)


def test_rewind_pool_says_why_it_cannot_listen_where_it_is_told(tmp_path, own_pool):
    taken = tmp_path / "a-file"
    taken.write_text("not a socket")
    command = [sys.executable, "-m", "dap_server.pool", "--socket"]
    for where, said in ((str(taken), "exists and is not a socket: give another --socket"),
                        (own_pool[1], "a pool already listens at"),
                        (str(tmp_path / ("x" * 120)), "too long for a Unix socket")):
        run = subprocess.run([*command, where], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": pool.ROOT})
        assert run.returncode == 1 and said in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    assert taken.read_text() == "not a socket" and os.path.exists(own_pool[1])
