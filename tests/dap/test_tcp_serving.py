"""TCP: no client starves another, the server says who may connect, and framing abuse never ends a session."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dap_server.protocol import encode
from tests.dap.wire import ROOT, DapError, Debugger, TcpServer


@pytest.fixture(scope="module")
def tight_server():
    """Short handshake and frame timeouts."""
    server = TcpServer("--handshake-timeout", "2", "--frame-timeout", "2")
    yield server
    server.stop()


def raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.settimeout(30)
    return sock


def read_until_closed(sock: socket.socket, limit_s: float = 30) -> bytes:
    data, deadline = b"", time.monotonic() + limit_s
    while time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the server kept the connection open for {limit_s} s")


def read_until(sock: socket.socket, wanted: bytes, limit_s: float = 60) -> bytes:
    data, deadline = b"", time.monotonic() + limit_s
    while wanted not in data:
        chunk = sock.recv(65536) if time.monotonic() < deadline else b""
        if not chunk:
            raise AssertionError(f"the server never said {wanted!r}; it said {data!r}")
        data += chunk
    return data


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_an_idle_client_does_not_block_another_clients_initialize(schema, tight_server):
    idle = raw(tight_server.port)  # connects and says nothing
    try:
        started = time.monotonic()
        other = Debugger.connect(schema, tight_server.port)
        assert other.initialize()["supportsStepBack"]
        assert time.monotonic() - started < 60
        other.close()
        assert b"no 'initialize' within 2 s" in read_until_closed(idle)  # and the idle one is let go
    finally:
        idle.close()


def test_a_slow_client_is_closed_when_its_handshake_time_is_up(tight_server):
    slow = raw(tight_server.port)
    try:
        started = time.monotonic()
        header = b"Content-Length: 80\r\n\r\n"
        closed = False
        for byte in header * 100:  # one byte every 50 ms, for longer than the handshake may take
            try:
                slow.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.05)
            if time.monotonic() - started > 10:
                break
        said = b"" if closed else read_until_closed(slow)
        assert closed or b"no 'initialize' within 2 s" in said
        assert time.monotonic() - started < 15
    finally:
        slow.close()


def test_an_incomplete_message_after_initialize_times_out(schema, tight_server):
    sock = raw(tight_server.port)
    try:
        sock.sendall(encode({"seq": 1, "type": "request", "command": "initialize",
                             "arguments": {"adapterID": "rewind"}}))
        said = read_until(sock, b'"command":"initialize","success":true')  # the clock starts once it is answered
        sock.sendall(b"Content-Length: 100\r\n\r\n{\"seq\": 2")  # and nothing more
        said += read_until_closed(sock)
        assert b"a message stayed incomplete for 2 s" in said
    finally:
        sock.close()


def test_sessions_beyond_the_limit_are_refused_in_words(schema):
    tight_server = TcpServer("--max-sessions", "2")
    first, second = Debugger.connect(schema, tight_server.port), Debugger.connect(schema, tight_server.port)
    try:
        first.initialize()
        second.initialize()
        third = Debugger.connect(schema, tight_server.port)
        with pytest.raises(DapError, match=r"serving 2 debug sessions, its limit \(--max-sessions 2\)"):
            third.initialize()
        third.client.close()
    finally:
        first.close()
        second.close()
    try:
        again = Debugger.connect(schema, tight_server.port)  # a place freed up
        assert again.initialize()["supportsStepBack"]
        again.close()
    finally:
        tight_server.stop()


@pytest.mark.parametrize("body, said", [
    (b"[" * 5000 + b"]" * 5000, "nested more than 64 levels"),
    (b'{"seq": 7, "type": "request", "command": "threads", "arguments": ' + b"[" * 3000 + b"]" * 3000 + b"}",
     "nested more than 64 levels"),
])
def test_deeply_nested_json_is_refused_and_the_session_goes_on(schema, tight_server, body, said):
    debugger = Debugger.connect(schema, tight_server.port)
    try:
        debugger.initialize()
        mark = debugger.client.mark()
        debugger.client.write_raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        if b'"seq": 7' in body:
            time.sleep(0.5)
            answered = [m for m in debugger.messages if m.get("request_seq") == 7]
            assert answered and not answered[0]["success"] and said in answered[0]["message"]
        else:
            assert said in debugger.client.wait_for("output", after=mark)["output"]
        assert debugger.request("threads") == {"threads": []}
    finally:
        debugger.close()


def test_a_content_length_of_thousands_of_digits_is_refused_and_the_session_goes_on(schema, tight_server):
    debugger = Debugger.connect(schema, tight_server.port)
    try:
        debugger.initialize()
        mark = debugger.client.mark()
        debugger.client.write_raw(b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n")
        assert "Content-Length of 5000 digits" in debugger.client.wait_for("output", after=mark)["output"]
        assert debugger.request("threads") == {"threads": []}
    finally:
        debugger.close()


def test_a_token_is_required_when_the_server_has_one(schema):
    server = TcpServer(env={**os.environ, "REWIND_TOKEN": "s3cret"})
    try:
        stranger = Debugger.connect(schema, server.port)
        with pytest.raises(DapError, match="needs a token: pass it as 'rewindToken'"):
            stranger.initialize()
        stranger.client.close()
        wrong = Debugger.connect(schema, server.port)
        with pytest.raises(DapError, match="needs a token"):
            wrong.initialize(rewindToken="guess")
        wrong.client.close()
        friend = Debugger.connect(schema, server.port)
        assert friend.initialize(rewindToken="s3cret")["supportsStepBack"]
        friend.close()
    finally:
        server.stop()


@pytest.mark.parametrize("args, said", [
    (["--host", "0.0.0.0"], "pass --allow-remote"),
    (["--host", "0.0.0.0", "--allow-remote"], "needs a token"),
])
def test_a_bind_beyond_loopback_needs_allow_remote_and_a_token(args, said):
    env = {k: v for k, v in os.environ.items() if k != "REWIND_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "dap_server", "--port", "0", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr


def test_the_servers_memory_stays_flat_across_sessions(schema):
    server = TcpServer()
    try:
        def one_session() -> None:
            debugger = Debugger.connect(schema, server.port)
            stop = debugger.start(ROOT / "tests" / "models" / "hostile.py", entry="build")
            assert stop["reason"] == "end"
            debugger.close()

        one_session()
        before = rss_kib(server.process.pid)
        for _ in range(4):
            one_session()
        grown = rss_kib(server.process.pid) - before
        assert grown < 8 * 1024, f"the server grew {grown} KiB over 4 sessions"
    finally:
        server.stop()


def test_a_request_named_with_megabytes_is_not_echoed_back(schema, tight_server):
    debugger = Debugger.connect(schema, tight_server.port)
    try:
        debugger.initialize()
        name = "x" * 2_000_000
        debugger.client.write_raw(encode({"seq": 99, "type": "request", "command": name}))
        deadline = time.monotonic() + 30
        while not any(m.get("request_seq") == 99 for m in debugger.messages) and time.monotonic() < deadline:
            time.sleep(0.05)
        (answer,) = [m for m in debugger.messages if m.get("request_seq") == 99]
        assert not answer["success"] and len(json.dumps(answer)) < 4000
    finally:
        debugger.close()
