"""Many ranks from the console and the server's words about them: `rewind debug --ranks N --replicas NAME ...` gives
the values that must stay identical to the launch (docs/ranks.md, "Replicas"), and a launch whose ranks never join
over TCP, cancelled, ends its engine saying that the ranks did not join (docs/ranks.md, "Ranks that join over
TCP"), not that build() did not return."""

from __future__ import annotations

import socket

import pytest

from dap_server import cli
from tests.conftest import EXAMPLES, MODELS, line_of
from tests.dap.wire import Debugger, SchemaCheck, rewind

pytestmark = pytest.mark.timeout(120)
DRIFTING = MODELS / "ranks" / "drifting_replicas.py"
UPDATE = line_of(DRIFTING, "# UPDATE")
GRACE = "1"  # --stop-grace: seconds the engine gets to give control back before it is stopped


def test_the_consoles_replicas_stop_the_ranks_where_they_first_differ(tmp_path):
    script = tmp_path / "session.rewind"
    script.write_text("continue\nquit\n")
    done = rewind("debug", str(DRIFTING), "--ranks", "2", "--replicas", "grad", "updated", "-x", str(script))
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"replicas differ: 'updated' (sub) written by sub at drifting_replicas.py:{UPDATE} on rank 1 differs " \
           "from rank 0" in done.stdout, done.stdout


def test_replicas_without_ranks_are_refused_in_words(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["debug", str(DRIFTING), "--replicas", "updated"])
    assert exited.value.code == 2
    assert "--replicas compares values across ranks: give --ranks N too" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cancelling_a_launch_whose_ranks_never_join_says_they_did_not_join():
    address = f"127.0.0.1:{_free_port()}"
    schema = SchemaCheck()
    debugger = Debugger.spawn(schema, ["--stop-grace", GRACE])
    try:
        debugger.initialize()
        mark = debugger.client.mark()
        launch = debugger.client.send("launch", {"program": str(EXAMPLES / "tensor_parallel.py"), "ranks": 2,
                                                 "join": address})
        debugger.client.wait_for("output", lambda body: f"to join at {address}" in body["output"], after=mark)
        debugger.request("cancel", {"requestId": launch.seq}, timeout=30)
        response = launch.wait(30)
        assert not response.success
        said = str(response.body)
        assert f"the ranks did not all join at {address} within {GRACE} s after 'cancel'" in said and \
            "build()" not in said, said
        debugger.client.wait_for("terminated", after=mark)
        with pytest.raises(ConnectionRefusedError):  # the engine's end closed the join port
            socket.create_connection(("127.0.0.1", int(address.rpartition(":")[2])), timeout=5).close()
    finally:
        debugger.close()
    assert schema.failures == [], "messages that break the DAP schema"
