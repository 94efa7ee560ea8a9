"""The language server through the wire: pygls's LanguageClient drives `python -m provenance.lsp`."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient
from pygls.uris import from_fs_path

from tests.conftest import EXAMPLES, MODELS, ROOT, line_of, open_session

pytestmark = pytest.mark.asyncio(loop_scope="module")
NONFINITE = MODELS / "nonfinite.py"
NOISY = EXAMPLES / "noisy.py"
MLP = EXAMPLES / "mlp.py"
GPT = EXAMPLES / "gpt.py"
CANCELLATION = MODELS / "forensics" / "cancellation.py"
WAIT_S = 120  # exporting and running a small model takes seconds; this only bounds a hang


class Client(LanguageClient):
    """A LanguageClient that keeps every diagnostics notification, queued per file."""

    def __init__(self) -> None:
        super().__init__("rewind-lsp-test", "1")
        self.published: dict[str, asyncio.Queue] = {}
        self.messages: asyncio.Queue = asyncio.Queue()
        self.log: list[str] = []

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            self._queue(params.uri).put_nowait(params.diagnostics)

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def on_message(params: types.ShowMessageParams) -> None:
            self.messages.put_nowait(params.message)

        @self.feature(types.WINDOW_LOG_MESSAGE)
        def on_log(params: types.LogMessageParams) -> None:
            self.log.append(params.message)

    def _queue(self, uri: str) -> asyncio.Queue:
        return self.published.setdefault(uri, asyncio.Queue())

    async def diagnostics(self, path) -> list[types.Diagnostic]:
        """The next diagnostics published for `path` (a bound on the wait turns a hang into a failure)."""
        try:
            return await asyncio.wait_for(self._queue(from_fs_path(str(path))).get(), WAIT_S)
        except TimeoutError:
            raise AssertionError(f"no diagnostics were published for {path} in {WAIT_S} s") from None

    async def initialize(self, options: dict | None) -> None:
        await self.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), process_id=os.getpid(), root_uri=from_fs_path(str(ROOT)),
            initialization_options=options))
        self.initialized(types.InitializedParams())

    async def hover(self, path, line: int) -> str | None:
        result = await self.text_document_hover_async(types.HoverParams(
            types.TextDocumentIdentifier(from_fs_path(str(path))), types.Position(line - 1, 8)))
        return result.contents.value if result else None

    async def command(self, name: str, *args):
        return await self.workspace_execute_command_async(types.ExecuteCommandParams(name, list(args)))

    async def close(self) -> None:
        await self.shutdown_async(None)
        self.exit(None)
        await self.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stdio_client():
    client = Client()
    await client.start_io(sys.executable, "-m", "provenance.lsp", cwd=str(ROOT))
    await client.initialize({"program": str(NONFINITE), "entry": "normalise", "driver": "torch:cpu"})
    yield client
    await client.close()


async def test_first_nan_is_an_error_at_the_dividing_line_naming_operands_and_pattern(stdio_client):
    (diag,) = await stdio_client.diagnostics(NONFINITE)
    assert diag.range.start.line + 1 == line_of(NONFINITE, "scaled = centred / spread")
    assert diag.severity == types.DiagnosticSeverity.Error and diag.code == "nan" and diag.source == "rewind"
    assert diag.message.startswith("first NaN: aten.div.Tensor 'div' wrote 'div' (float32[3, 4]) at tick 4 with "
                                   "4 NaN, first at [1, 0] (centred (sub) = 0, spread (amax) = 0); division or "
                                   "rsqrt by zero (missing epsilon): 'amax' has 1 zero element(s)")
    (caller,) = diag.related_information
    assert caller.location.range.start.line + 1 == line_of(NONFINITE, "y = self.norm(x)")
    assert caller.message == "called from Scaler.forward [<root>]"


async def test_hover_shows_what_the_line_wrote_with_stats_location_and_writer(stdio_client):
    line = line_of(NONFINITE, "scaled = centred / spread")
    text = await stdio_client.hover(NONFINITE, line)
    assert f"line {line} at tick" in text
    assert "`scaled = div` · float32[3, 4]" in text and "**4 NAN**" in text
    assert "written by `aten.div.Tensor` node `div` at tick 4 on unit host in `norm`" in text
    assert "at cpu host 0x" in text and "(48 bytes, node output)" in text


async def test_hover_on_a_line_without_nodes_is_empty(stdio_client):
    assert await stdio_client.hover(NONFINITE, line_of(NONFINITE, "def forward(self, x):")) is None


async def test_goto_moves_the_tick_hovers_describe(stdio_client):
    line = line_of(NONFINITE, "scaled = centred / spread")
    assert await stdio_client.command("rewind.goto", 2) == {"tick": 2}
    assert "This line has written nothing by tick 2." in await stdio_client.hover(NONFINITE, line)
    await stdio_client.command("rewind.goto", 5)
    assert "at tick 5 of" in await stdio_client.hover(NONFINITE, line)


async def test_goto_refuses_a_tick_outside_the_program(stdio_client):
    with pytest.raises(JsonRpcException, match=r"tick 999 is outside the program"):
        await stdio_client.command("rewind.goto", 999)
    with pytest.raises(JsonRpcException, match=r"a tick \(an integer\), got \['end'\]"):
        await stdio_client.command("rewind.goto", "end")


async def test_analyse_refuses_bad_options_naming_the_problem(stdio_client):
    with pytest.raises(JsonRpcException, match=r"budget: extra inputs are not permitted.*known: program, trace, entry"):
        await stdio_client.command("rewind.analyse", {"program": str(NOISY), "budget": 3})
    with pytest.raises(JsonRpcException, match=r"program file 'no/such/model.py' does not exist"):
        await stdio_client.command("rewind.analyse", {"program": "no/such/model.py"})
    with pytest.raises(JsonRpcException, match=r"need one of 'program' \(a model file to run\) and 'trace'"):
        await stdio_client.command("rewind.analyse", {"program": str(NOISY), "trace": "run.rwtrace"})


async def test_a_program_that_exits_while_loading_is_refused_and_the_server_goes_on(stdio_client):
    hostile = MODELS / "hostile.py"
    for entry, said in [("build_exit", r"the program called sys\.exit\(3\) while Rewind loaded"),
                        ("build_interrupt", "the program raised a keyboard interrupt while Rewind loaded")]:
        with pytest.raises(JsonRpcException, match=said):
            await stdio_client.command("rewind.analyse", {"program": str(hostile), "entry": entry})
    result = await stdio_client.command("rewind.analyse", {"program": str(hostile), "entry": "build"})
    assert result["ticks"] > 0


async def test_analysing_another_program_reports_its_nondeterminism_and_clears_the_old_problems(stdio_client):
    result = await stdio_client.command("rewind.analyse", {"program": str(NOISY), "driver": "torch:cpu"})
    assert result["problems"] == 1
    (diag,) = await stdio_client.diagnostics(NOISY)
    assert diag.code == "nondeterminism" and diag.severity == types.DiagnosticSeverity.Warning
    assert diag.range.start.line + 1 == line_of(NOISY, "torch.randn_like(h)")
    assert "replaying aten.randn_like 'randn_like' (tick 1) wrote a different 'randn_like'" in diag.message
    assert list(await stdio_client.diagnostics(NONFINITE)) == []


async def test_the_first_divergence_from_the_given_reference_is_an_error_at_its_line(stdio_client):
    await stdio_client.command("rewind.analyse", {"program": str(CANCELLATION), "reference": "torch:cpu:float64"})
    (diag,) = await stdio_client.diagnostics(CANCELLATION)
    assert diag.code == "divergence" and diag.severity == types.DiagnosticSeverity.Error
    assert diag.range.start.line + 1 == line_of(CANCELLATION, "bend = 1 - torch.cos(angle)")
    assert "first divergence from the reference (torch:cpu:float64): aten.rsub.Scalar 'rsub'" in diag.message
    assert "catastrophic cancellation" in diag.message


async def test_a_hang_on_the_sim_chip_is_an_error_at_the_line_of_the_hung_node(stdio_client):
    faults = [{"kind": "miscount_barrier", "node": "softmax_1"}]
    await stdio_client.command("rewind.analyse", {"program": str(GPT), "driver": "sim", "faults": faults})
    (diag,) = await stdio_client.diagnostics(GPT)
    assert diag.code == "hang" and diag.range.start.line + 1 == line_of(GPT, "weights = torch.softmax(scores")
    assert diag.message.startswith("hang in node 'softmax_1'") and "barrier 0" in diag.message
    assert [r.message for r in diag.related_information] == ["called from Block.forward [blocks.1]",
                                                             "called from GPT.forward [<root>]"]


async def test_a_trace_is_analysed_without_running_the_program(stdio_client, tmp_path_factory):
    trace = tmp_path_factory.mktemp("lsp") / "normalise.rwtrace"
    session = open_session(NONFINITE, entry="normalise")
    session.goto(session.end)
    session.save_trace(str(trace))
    result = await stdio_client.command("rewind.analyse", {"trace": str(trace)})
    assert result == {"run": str(trace.resolve()), "ticks": session.end, "problems": 1}
    (diag,) = await stdio_client.diagnostics(NONFINITE)
    assert diag.code == "nan" and "wrote 'div' (float32[3, 4]) at tick 4 with 4 NaN" in diag.message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _connect(client: Client, port: int, server: asyncio.subprocess.Process) -> None:
    while True:
        try:
            return await client.start_tcp("127.0.0.1", port)
        except ConnectionRefusedError:
            if server.returncode is not None:
                raise RuntimeError(f"the language server exited with {server.returncode}") from None
            await asyncio.sleep(0.2)


async def test_server_over_tcp_publishes_and_answers_hovers():
    port = _free_port()
    server = await asyncio.create_subprocess_exec(sys.executable, "-m", "provenance.lsp", "--tcp", "--port",
                                                  str(port), cwd=str(ROOT))
    client = Client()
    try:
        await _connect(client, port, server)
        await client.initialize({"program": str(MLP), "driver": "torch:cpu"})
        assert list(await client.diagnostics(MLP)) == []
        text = await client.hover(MLP, line_of(MLP, "h = torch.relu(self.fc1(x))"))
        assert "`h = relu` · float32[3, 16]" in text and "min 0 ·" in text
        await client.close()
    finally:
        server.kill()
        await server.wait()


async def test_bad_initialization_options_are_shown_to_the_user():
    client = Client()
    await client.start_io(sys.executable, "-m", "provenance.lsp", cwd=str(ROOT))
    try:
        await client.initialize({"program": str(MLP), "entry": 3})
        message = await asyncio.wait_for(client.messages.get(), WAIT_S)
        assert message.startswith("rewind: bad analysis options (entry: input should be a valid string)")
    finally:
        await client.close()
