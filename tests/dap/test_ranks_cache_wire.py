"""Ranks through the program cache, through the wire (docs/ranks.md, "Through DAP"): a file whose forward branches on
the rank caches one program a rank, and a relaunch (`restart` with launch arguments) loads each rank's own."""

from __future__ import annotations

import pytest

from hardware.frontends.cache_folder import CacheFolder
from tests.dap.wire import Debugger
from tests.test_ranks import RANK_BRANCH

pytestmark = pytest.mark.timeout(240)  # a deadlock fails the test instead of hanging the suite


def _totals(debugger: Debugger) -> list[str]:
    """`y.sum()` on each rank's top frame at the end: rank 0 added, rank 1 multiplied."""
    frames = [debugger.request("stackTrace", {"threadId": t})["stackFrames"][0]["id"] for t in (1, 2)]
    return [debugger.evaluate("y.sum()", frame_id=f)["result"] for f in frames]


def test_a_relaunch_of_ranks_loads_each_ranks_own_cached_program(schema, tmp_path):
    model = tmp_path / "rank_branch.py"
    model.write_text(RANK_BRANCH)
    launch = {"program": str(model), "driver": "torch:cpu", "stopOnEntry": True, "ranks": 2}
    debugger = Debugger.spawn(schema)
    try:
        files, totals = [], []
        assert debugger.start(model, stopOnEntry=True, ranks=2)["reason"] == "entry"
        for relaunched in (False, True):
            if relaunched:
                assert debugger.motion("restart", {"arguments": launch})["reason"] == "entry"
            assert debugger.motion("continue", {"threadId": 1})["reason"] == "end"
            totals.append(_totals(debugger))
            files.append(sorted((e.path.name, e.path.stat().st_ino) for e in CacheFolder.beside(model).entries(model)))
    finally:
        debugger.close()
    assert len(files[0]) == 2 and files[1] == files[0]  # one entry a rank, loaded again rather than written anew
    assert totals[0] == totals[1] and [float(t.rsplit("=", 1)[-1]) for t in totals[0]] == [8.0, 12.0]
