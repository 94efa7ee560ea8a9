"""Seeded fuzz of the wire format through a real server: whatever bytes arrive, the server answers in words and
goes on serving; no answer names a Python exception."""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dap_server.protocol import encode
from tests.dap.wire import Debugger, TcpServer

LEAK = re.compile(r"\b(?:[A-Z][A-Za-z]*(?:Error|Exception)|KeyboardInterrupt|SystemExit|StopIteration|Traceback"
                  r"|struct\.error|internal error)\b")
FIRST_SEQ = 100_000  # far above the client's own numbering

junk = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"Content-Length: -1\r\n\r\n", b"Content-Length: 1e9\r\n\r\n", b"Content-Length: 0\r\n\r\n",
                     b"Content-Length: " + b"7" * 5000 + b"\r\n\r\n", b"Content-Length: 99999999999\r\n\r\n",
                     b"\r\n\r\n", b"Content-Type: x\r\n\r\n{}", b"Content-Length: 4\r\n\r\n\xff\xfe\x00\x01"]),
)


@st.composite
def bodies(draw) -> bytes:
    """A framed body: JSON of every shape (deep, wrong types, no seq) or not JSON at all."""
    depth = draw(st.integers(0, 300))
    value = draw(st.one_of(
        st.just("[" * depth + "]" * depth),
        st.just('{"a":' * depth + "1" + "}" * depth),
        st.builds(lambda seq, command, arguments: json.dumps({"seq": seq, "type": "request", "command": command,
                                                              "arguments": arguments}),
                  st.one_of(st.integers(FIRST_SEQ, FIRST_SEQ + 10**6), st.just(-1), st.just(0), st.text(max_size=5)),
                  st.one_of(st.sampled_from(["threads", "stackTrace", "evaluate", "launch", "variables",
                                             "readMemory", "timeline", "x" * 5000]), st.text(max_size=20)),
                  st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(),
                                         st.text(max_size=30)),
                               lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                                            inner, max_size=4),
                               max_leaves=20)),
        st.text(max_size=100),
    ))
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return b"Content-Length: %d\r\n\r\n" % len(data) + data


@pytest.fixture(scope="module", params=["stdio", "tcp"])
def fuzzed(request, schema):
    tcp = TcpServer() if request.param == "tcp" else None
    debugger = Debugger.spawn(schema) if tcp is None else Debugger.connect(schema, tcp.port)
    debugger.initialize()
    yield debugger
    debugger.close()
    if tcp is not None:
        assert tcp.process.poll() is None, "the TCP server died"
        tcp.stop()


@settings(derandomize=True, max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pieces=st.lists(st.one_of(junk, bodies()), min_size=1, max_size=4))
def test_any_bytes_are_answered_in_words_and_the_server_keeps_serving(fuzzed, pieces):
    before = len(fuzzed.messages)
    for piece in pieces:
        fuzzed.client.write_raw(piece)
    # A complete frame ends whatever the pieces left open (a body that is still being read swallows it).
    fuzzed.client.write_raw(encode({"seq": FIRST_SEQ - 1, "type": "request", "command": "threads"}) * 2)
    assert fuzzed.request("threads", timeout=30) == {"threads": []}
    for message in fuzzed.messages[before:]:
        text = json.dumps(message.get("body", {})) + str(message.get("message", ""))
        assert not LEAK.search(text), f"an internal error reached the client: {text[:300]}"


@pytest.mark.parametrize("text", [
    '{"seq": 18446744073709551616, "type": "request", "command": "threads"}',
    '{"seq": 100001, "type": "request", "command": "evaluate", "arguments": {"expression": "x\\ud800y"}}',
    '{"seq": 100002, "type": "request", "command": "evaluate", "arguments": {"expression": "x", '
    '"frameId": 18446744073709551616}}',
    '{"seq": 100003, "type": "request", "command": "disconnect", "arguments": {"restart": true, '
    '"suspendDebuggee": "text"}}',
    '{"seq": 100004, "type": "request", "command": "cancel", "arguments": {"requestId": {"a": 1}}}',
    '{"seq": 100005, "type": "request", "command": "setBreakpoints", "arguments": {"source": {"path": {}}, '
    '"breakpoints": []}}',
])
def test_what_json_holds_and_the_engine_pipe_cannot_is_answered_and_the_session_goes_on(fuzzed, text):
    seq = json.loads(text)["seq"]
    body = text.encode()
    fuzzed.client.write_raw(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert fuzzed.request("threads", timeout=30) == {"threads": []}  # answered at once, maybe before the other

    def answers() -> list[dict]:
        return [m for m in fuzzed.messages if m.get("type") == "response" and m.get("request_seq") == seq]
    deadline = time.monotonic() + 30
    while not answers() and time.monotonic() < deadline:
        time.sleep(0.05)
    (answer,) = answers()
    assert not answer["success"] and not LEAK.search(answer["message"]), answer["message"]
