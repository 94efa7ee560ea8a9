"""A long run through the wire: progress, the event loop answering while the worker runs, pause and cancel."""

import time

from tests.dap.wire import MODELS, Debugger

LONG = MODELS / "long_run.py"


def test_pause_during_a_long_run(schema):
    debugger = Debugger.spawn(schema)
    try:
        stop = debugger.start(LONG, stopOnEntry=True, checkpoint={"budgetMB": 64})
        assert stop["reason"] == "entry"
        client = debugger.client
        mark = client.mark()
        debugger.request("continue", {"threadId": 1})
        started = client.wait_for("progressStart", after=mark, timeout=60)
        assert started["cancellable"]
        asked = time.monotonic()
        assert debugger.request("threads")["threads"][0]["name"] == "host"  # answered while the worker runs
        assert time.monotonic() - asked < 1.0
        debugger.request("pause", {"threadId": 1})
        stop = client.wait_for("stopped", after=mark, timeout=60)
        paused_at = debugger.position()
        assert stop["reason"] == "pause" and 0 < paused_at < debugger.request("timeline", {"count": 0})["end"]
        names = [name for name, _ in client.events_since(mark)]
        assert names.index("progressEnd") < names.index("stopped")

        # Cancelling the progress of a running motion pauses it too.
        mark = client.mark()
        debugger.request("continue", {"threadId": 1})
        progress = client.wait_for("progressStart", after=mark, timeout=60)
        debugger.request("cancel", {"progressId": progress["progressId"]})
        assert client.wait_for("stopped", after=mark, timeout=60)["reason"] == "pause"
        assert debugger.position() > paused_at

        # A request queued behind a running motion can be cancelled before it runs.
        mark = client.mark()
        debugger.request("continue", {"threadId": 1})
        client.wait_for("progressStart", after=mark, timeout=60)
        queued = client.send("stackTrace", {"threadId": 1})
        debugger.request("cancel", {"requestId": queued.seq})
        debugger.request("pause", {"threadId": 1})
        answer = queued.wait(60)
        assert not answer.success and str(answer.body) == "cancelled"
        assert client.wait_for("stopped", after=mark, timeout=60)["reason"] == "pause"
    finally:
        debugger.close()
