"""Ranks that join the coordinator over TCP (hardware/ranks/join.py): started by a real torchrun on loopback, as on
several hosts, then debugged as forked ranks are; and the join port refusing what is not a proper rank, in words."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from hardware.errors import RewindError
from hardware.ranks.coordinator import Coordinator
from hardware.ticks import Direction
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.timeout(120)
TENSOR_PARALLEL = str(EXAMPLES / "tensor_parallel.py")
ROOT = str(Path(__file__).resolve().parents[1])
TOKEN = "a-test-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(address: str, token: str, module: str = "hardware.ranks.worker") -> subprocess.Popen:
    """torchrun starting 2 ranks of `module` (the rank of a Python-level Coordinator, or dap_server.engine's for a
    debug session) that join at `address`."""
    env = dict(os.environ, PYTHONPATH=ROOT, REWIND_JOIN_TOKEN=token)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", module, "--join", address],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _hello(address: str, line: bytes) -> tuple[socket.socket, dict | None]:
    """A raw client of the join port: say `line`, read the answer (None: the connection closed first)."""
    sock = _connect(address)
    sock.sendall(line)
    reply = sock.makefile("rb").readline()
    return sock, (json.loads(reply) if reply else None)


def _hello_of(rank, world_size, token) -> bytes:
    return json.dumps({"rank": rank, "world_size": world_size, "token": token}).encode() + b"\n"


def _coordinate(result: dict, **kwargs) -> threading.Thread:
    """A coordinator waiting for joining ranks in a thread of its own; what it raised lands in `result`."""
    def wait() -> None:
        try:
            Coordinator(TENSOR_PARALLEL, 2, **kwargs).close()
        except RewindError as exc:
            result["error"] = str(exc)
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_ranks_started_by_torchrun_join_and_debug_as_forked_ranks(launcher, monkeypatch):
    with Coordinator(TENSOR_PARALLEL, 2, timeout_s=60, launcher=launcher) as forked:
        forked.run()
        expected = forked.tensor(1, forked.outputs(1)[0])["bytes"]
    address = f"127.0.0.1:{_free_port()}"
    monkeypatch.setenv("REWIND_JOIN_TOKEN", TOKEN)
    torchrun = _torchrun(address, TOKEN)
    try:
        with Coordinator(TENSOR_PARALLEL, 2, timeout_s=60, launch_timeout_s=60, join=address) as joined:
            assert joined.pids() == [None, None]  # no process of the coordinator's
            workers = psutil.Process(torchrun.pid).children(recursive=True)
            assert joined.run().reason == "end"
            assert joined.tensor(1, joined.outputs(1)[0])["bytes"] == expected  # bit for bit the forked ranks'
            first = joined.collectives(1)[0]
            after = joined.tensor(1, first.value)["bytes"]
            joined.goto(first.tick - 1, 1)  # back across the all_reduce, every rank
            assert all(s["passed"] == 0 for s in joined.states().values())
            joined.run(Direction.FORWARD)
            assert joined.tensor(1, first.value)["bytes"] == after
            assert all(s["calls"] == len(joined.collectives(r)) for r, s in joined.states().items())  # none again
        assert torchrun.wait(20) == 0
        assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        torchrun.kill()
        torchrun.wait()


def test_what_is_not_a_proper_rank_is_refused_in_words_and_a_timeout_names_who_never_joined(monkeypatch):
    monkeypatch.setenv("REWIND_JOIN_TOKEN", TOKEN)
    address, result = f"127.0.0.1:{_free_port()}", {}
    waiting = _coordinate(result, join=address, launch_timeout_s=4)
    refusals = [_hello(address, line)[1] for line in [
        b"GET / HTTP/1.1\r\n\r\n", _hello_of(0, 2, "guess"), _hello_of(0, 3, TOKEN), _hello_of(5, 2, TOKEN)]]
    accepted = _connect(address)
    accepted.sendall(_hello_of(0, 2, TOKEN))
    duplicate = _hello(address, _hello_of(0, 2, TOKEN))[1]
    errors = [r["error"] for r in refusals + [duplicate]]
    assert all(r["ok"] is False for r in refusals + [duplicate])
    assert "not JSON" in errors[0] and "wrong join token" in errors[1]
    assert "world size is 3; this session has 2 ranks" in errors[2]
    assert "rank 5 is not one of this session's ranks 0..1" in errors[3] and "rank 0 has already joined" in errors[4]
    waiting.join(30)
    assert "rank 1 never joined at " + address + " within 4 s" in result["error"]
    assert accepted.recv(1) == b""  # the rank that did join is let go


def _printed_token(capsys) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(r"run REWIND_JOIN_TOKEN=(\w+) torchrun", capsys.readouterr().err)
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError("the coordinator printed no command with a token")


def test_only_the_printed_token_lets_a_rank_in_and_a_joined_rank_whose_connection_drops_is_gone(monkeypatch, capsys):
    monkeypatch.delenv("REWIND_JOIN_TOKEN", raising=False)  # the coordinator makes one and prints it
    address, result = f"127.0.0.1:{_free_port()}", {}
    waiting = _coordinate(result, join=address, launch_timeout_s=60)
    token = _printed_token(capsys)
    wrong = subprocess.run([sys.executable, "-m", "hardware.ranks.worker", "--join", address], timeout=60,
                           env=dict(os.environ, PYTHONPATH=ROOT, RANK="1", WORLD_SIZE="2", REWIND_JOIN_TOKEN="guess"),
                           capture_output=True, text=True)  # a real rank, refused: it says why and ends
    assert wrong.returncode == 1 and "refused: wrong join token" in wrong.stderr, wrong.stderr
    ranks = [_connect(address) for _ in range(2)]
    for rank, sock in enumerate(ranks):
        sock.sendall(_hello_of(rank, 2, token))
    for sock in ranks:
        lines = sock.makefile("rb")
        welcome, launch = json.loads(lines.readline()), json.loads(lines.readline())
        assert welcome["ok"] and welcome["store"].startswith("127.0.0.1:") and launch["op"] == "launch"
        sock.shutdown(socket.SHUT_RDWR)  # gone before answering
        sock.close()
    waiting.join(30)
    assert "rank 0 ended while loading its program (its connection closed)" in result["error"]



def test_the_console_says_how_to_join_before_it_waits_and_debugs_the_ranks_torchrun_started(tmp_path, monkeypatch):
    """`rewind debug --ranks 2 --join host:0`: the console shows what to run on each host (the port it listens on,
    the token it made) while the launch waits, the ranks torchrun starts with them join, and the session is theirs:
    the launch through DAP and its output event, every rank to the end and back across the collectives."""
    monkeypatch.delenv("REWIND_JOIN_TOKEN", raising=False)
    script = tmp_path / "session.rewind"
    script.write_text("continue\nrc\nquit\n")
    console = subprocess.Popen([sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())",
                                "debug", TENSOR_PARALLEL, "--ranks", "2", "--join", "127.0.0.1:0", "-x", str(script)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    torchrun = None
    try:
        said = console.stderr.readline()
        joining = re.search(r"waiting for 2 rank\(s\) to join at (\S+): on each host run REWIND_JOIN_TOKEN=(\w+) "
                            r"torchrun .* -m dap_server\.engine --join \1 ", said)
        assert joining, said
        torchrun = _torchrun(joining[1], joining[2], "dap_server.engine")
        out, err = console.communicate(timeout=240)
        assert console.returncode == 0, (out, err[-2000:])
        assert "stopped on entry (rank 0 at tick 0, rank 1 at tick 0)" in out, out
        assert re.search(r"end of program \(rank 0 at tick (\d+), rank 1 at tick \1\)", out), out
        assert "beginning of the program (rank 0 at tick 0, rank 1 at tick 0)" in out, out
        assert torchrun.wait(30) == 0  # the session's end ends the ranks torchrun started
    finally:
        console.kill()
        if torchrun is not None:
            torchrun.kill()
