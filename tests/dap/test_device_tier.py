"""The device tier through the wire: valueAt (the value living at an address at a tick), and a launch with
batched checks and the checkpoint pool that still stops at the tick that wrote a NaN."""

from __future__ import annotations

import pytest

from tests.dap.wire import MODELS, DapError, Debugger, SchemaCheck


def test_value_at_names_the_parameter_at_an_address_and_refuses_a_bad_one(fresh: Debugger):
    where = fresh.request("locate", {"name": "p_head_weight"})["shards"][0]
    found = fresh.request("valueAt", {"address": hex(where["address"] + 8)})
    assert (found["value"], found["kind"], found["offset"], found["found"]) == ("p_head_weight", "program value", 8, True)
    assert fresh.request("valueAt", {"address": where["address"], "tick": 0})["value"] == "p_head_weight"
    with pytest.raises(DapError, match="'0xzz' is not an address"):
        fresh.request("valueAt", {"address": "0xzz"})
    with pytest.raises(DapError, match="outside the program"):
        fresh.request("valueAt", {"address": 4096, "tick": 10**6})


def test_batched_checks_and_a_pool_stop_at_the_tick_that_wrote_the_nan(schema: SchemaCheck):
    debugger = Debugger.spawn(schema)
    try:
        stop = debugger.start(MODELS / "late_flags.py", stopOnEntry=True,
                              checkpoint={"budgetMB": 1, "checkBatch": 4, "devicePool": True})
        assert stop["reason"] == "entry"
        debugger.request("setExceptionBreakpoints", {"filters": ["nan"]})
        stop = debugger.motion("continue")
        assert stop["reason"] == "exception" and debugger.position() == 6  # after tick 5, the square root
    finally:
        debugger.close()
