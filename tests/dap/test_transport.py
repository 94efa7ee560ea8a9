"""Transport and lifecycle through the wire: stdio and TCP, bad input of every kind, one session after another."""

import json

import pytest

from tests.dap.wire import GPT, MODELS, DapError, Debugger, SchemaCheck, TcpServer, line_of


@pytest.fixture(scope="module")
def tcp_server():
    server = TcpServer()
    yield server
    server.stop()


@pytest.fixture(params=["stdio", "tcp"])
def connection(request, schema, tcp_server):
    debugger = Debugger.spawn(schema) if request.param == "stdio" else Debugger.connect(schema, tcp_server.port)
    yield debugger
    debugger.close()


def test_breakpoint_is_hit_over_stdio_and_tcp(connection):
    line = line_of("weights = torch.softmax")
    stop = connection.start(GPT, breakpoints=[line])
    assert stop["reason"] == "breakpoint" and stop["hitBreakpointIds"]
    frame = connection.top()
    assert frame["line"] == line and frame["source"]["path"] == str(GPT)


def test_malformed_message_gets_error_and_server_survives(connection):
    connection.initialize()
    client = connection.client
    mark = client.mark()
    client.write_raw(b"Content-Length: 9\r\n\r\n{not json")
    client.write_raw(b"X-Header: 1\r\n\r\n")
    client.write_raw(b"Content-Length: 40\r\n\r\n" + json.dumps({"seq": 900, "type": "request"}).ljust(40).encode())
    client.write_raw(b"Content-Length: 17000000\r\n\r\n" + b" " * 17_000_000)
    refusals = [client.wait_for("output", after=mark)["output"] for _ in range(3)]
    assert any("invalid JSON" in r for r in refusals)
    assert any("without Content-Length" in r for r in refusals)
    assert any("exceeds the 16 MiB limit" in r for r in refusals)
    answered = [m for m in connection.messages if m.get("type") == "response" and m.get("request_seq") == 900]
    assert answered and not answered[0]["success"] and "command" in answered[0]["message"]
    with pytest.raises(DapError, match="unknown request 'frobnicate'"):
        connection.request("frobnicate", {})
    with pytest.raises(DapError, match="field 'threadId'"):
        connection.request("stackTrace", {"threadId": "one"})
    assert connection.request("threads") == {"threads": []}  # still serving, nothing launched yet


def test_bad_launch_program_gives_error(schema):
    debugger = Debugger.spawn(schema)
    try:
        debugger.initialize()
        with pytest.raises(DapError, match="program file not found: .*no_such_model.py"):
            debugger.request("launch", {"program": "no_such_model.py"})
        with pytest.raises(DapError, match="unknown field 'progam'"):
            debugger.request("launch", {"progam": str(GPT)})
        with pytest.raises(DapError, match="field 'stopOnEntry': input should be a valid boolean"):
            debugger.request("launch", {"program": str(GPT), "stopOnEntry": "yes"})
        with pytest.raises(DapError, match="field 'checkpoint.budgetMB'"):
            debugger.request("launch", {"program": str(GPT), "checkpoint": {"budgetMB": -1}})
        with pytest.raises(DapError, match="unknown field 'checkpoint.evry'"):
            debugger.request("launch", {"program": str(GPT), "checkpoint": {"evry": 4}})
        with pytest.raises(DapError, match="unknown driver 'tpu'"):
            debugger.request("launch", {"program": str(GPT), "driver": "tpu"})
        with pytest.raises(DapError, match="no program is loaded"):
            debugger.request("stackTrace", {"threadId": 1})
        # Nothing was lost: the same connection launches a good program, VS Code's own attributes and all.
        mark = debugger.client.mark()
        debugger.request("launch", {"program": str(GPT), "type": "rewind", "request": "launch", "name": "gpt",
                                    "__sessionId": "x", "stopOnEntry": True,
                                    "checkpoint": {"budgetMB": 64, "every": 4}})
        debugger.client.wait_for("initialized", after=mark)
        assert debugger.motion("configurationDone", {})["reason"] == "entry"
    finally:
        debugger.close()


def test_tcp_serves_one_session_after_another(schema, tcp_server):
    for _ in range(2):
        debugger = Debugger.connect(schema, tcp_server.port)
        capabilities = debugger.initialize()
        assert capabilities["supportsStepBack"] and capabilities["supportsReadMemoryRequest"]
        debugger.close()
    assert tcp_server.process.poll() is None


def test_what_the_model_prints_never_reaches_the_protocol_stream(schema):
    debugger = Debugger.spawn(schema)
    try:
        stop = debugger.start(MODELS / "chatty.py")
        assert stop["reason"] == "end"
    finally:
        debugger.close()
    assert debugger.client.process.returncode == 0


def test_initialize_advertises_what_works(schema):
    debugger = Debugger.spawn(schema)
    try:
        caps = debugger.initialize()
    finally:
        debugger.close()
    for name in ["supportsConfigurationDoneRequest", "supportsStepBack", "supportsGotoTargetsRequest",
                 "supportsConditionalBreakpoints", "supportsHitConditionalBreakpoints", "supportsLogPoints",
                 "supportsFunctionBreakpoints", "supportsDataBreakpoints", "supportsReadMemoryRequest",
                 "supportsWriteMemoryRequest", "supportsSetVariable", "supportsEvaluateForHovers",
                 "supportsSteppingGranularity", "supportsExceptionInfoRequest", "supportsCancelRequest",
                 "supportsTerminateRequest", "supportsBreakpointLocationsRequest", "supportsLoadedSourcesRequest"]:
        assert caps.get(name) is True, name
    filters = {f["filter"]: f.get("default", False) for f in caps["exceptionBreakpointFilters"]}
    assert filters == {"nan": True, "inf": False, "nonfinite-output": False, "divergence": False, "race": False,
                       "access": False, "hang": False, "loss-spike": False}


def test_the_schema_check_is_not_vacuous():
    check = SchemaCheck()
    check({"seq": 1, "type": "event", "event": "stopped", "body": {"threadId": 1}})  # no reason
    check({"seq": 2, "type": "response", "request_seq": 1, "command": "threads", "success": True,
           "body": {"threads": [{"id": 1}]}})  # a thread needs a name
    check({"seq": 3, "type": "response", "request_seq": 1, "command": "x", "success": False, "message": "m"})
    assert len(check.failures) == 3 and check.failures[0].startswith("StoppedEvent")
    assert check.failures[2].startswith("ErrorResponse")  # an error response needs a body
