"""Inspection through the wire: threads, frames, scopes, tensor variables, evaluate, memory, custom requests."""

import base64
import struct
from pathlib import Path

import pytest

from tests.conftest import open_session
from tests.dap.wire import GPT, STATS_RE, DapError, line_of, named
from tests.test_reverse_execution import checkpoint_contents

MASK = line_of("mask = torch.ones")


@pytest.fixture
def at_mask(fresh):
    """Stopped at the causal mask line of blocks.0: q, k, v and scores are the source variables."""
    fresh.set_breakpoints(GPT, [{"line": MASK}])
    fresh.motion("continue")
    return fresh


def test_threads_are_the_units_of_the_chip(fresh):
    assert fresh.request("threads") == {"threads": [{"id": 1, "name": "host"}]}


def test_stack_is_the_node_at_its_line_then_the_module_forwards(at_mask):
    trace = at_mask.request("stackTrace", {"threadId": 1})
    names = [f["name"] for f in trace["stackFrames"]]
    lines = [f["line"] for f in trace["stackFrames"]]
    assert names == ["ones (aten.ones) [blocks.0.attn]", "Block.forward [blocks.0]", "GPT.forward [<root>]"]
    assert lines == [MASK, line_of("x = x + self.attn"), line_of("x = block(x)")]
    assert all(f["source"]["path"] == str(GPT) for f in trace["stackFrames"])
    page = at_mask.request("stackTrace", {"threadId": 1, "startFrame": 1, "levels": 1})
    assert [f["name"] for f in page["stackFrames"]] == names[1:2] and page["totalFrames"] == 3


def test_scopes_show_the_node_locals_live_values_and_parameters(at_mask):
    scopes = at_mask.request("scopes", {"frameId": 1})["scopes"]
    assert [s["name"] for s in scopes] == ["Node ones (aten.ones)", "Arguments", "Locals", "Live values",
                                           "Parameters"]
    (output,) = at_mask.scope("Node")
    assert output["name"] == "ones" and output["type"].startswith("output")
    assert output["value"].startswith("<not written yet")
    assert [v["name"] for v in at_mask.scope("Arguments")] == ["x"]  # Attention.forward(self, x)
    assert [v["name"] for v in at_mask.scope("Locals")] == ["x", "q", "k", "v", "scores"]
    assert "div" in [v["name"] for v in at_mask.scope("Live values")]
    assert "p_blocks_0_attn_qkv_weight" in [v["name"] for v in at_mask.scope("Parameters")]
    outer = at_mask.request("scopes", {"frameId": 2})["scopes"]
    assert [s["name"] for s in outer][:2] == ["Arguments", "Locals"]
    assert [v["name"] for v in at_mask.scope("Locals", frame_id=3)] == ["tokens", "x"]


def test_tensor_variable_shows_stats_and_has_location_provenance_and_elements(at_mask):
    scores = named(at_mask.scope("Locals"), "scores")
    match = STATS_RE.match(scores["value"])
    assert match and match["dtype"] == "float32" and match["shape"] == "1, 4, 16, 16" and match["device"] == "cpu"
    assert scores["memoryReference"] and scores["evaluateName"] == "scores" and scores["indexedVariables"] == 1
    children = at_mask.variables(scores["variablesReference"], filter="named")
    assert [c["name"] for c in children] == ["location", "provenance", "stats"]
    assert named(children, "location")["value"].startswith("host 0x")
    assert named(children, "provenance")["value"].startswith("written by aten.div.Tensor 'div' at gpt.py:")
    location = {v["name"]: v["value"] for v in at_mask.variables(named(children, "location")["variablesReference"])}
    assert location["value"] == "div"


def test_elements_are_paged_through_indexed_variables(at_mask):
    scores = named(at_mask.scope("Locals"), "scores")
    (batch,) = at_mask.variables(scores["variablesReference"], filter="indexed")
    (head,) = at_mask.variables(batch["variablesReference"], filter="indexed", start=2, count=1)
    assert head["name"] == "[2]" and head["evaluateName"] == "scores[0, 2]" and head["indexedVariables"] == 16
    (row,) = at_mask.variables(head["variablesReference"], filter="indexed", start=5, count=1)
    page = at_mask.variables(row["variablesReference"], filter="indexed", start=3, count=4)
    assert [e["name"] for e in page] == ["[3]", "[4]", "[5]", "[6]"]
    for element in page:
        assert element["variablesReference"] == 0
        assert float(element["value"]) == pytest.approx(at_mask.number(f"{element['evaluateName']}"), rel=1e-5)
    assert at_mask.variables(row["variablesReference"], filter="indexed", start=20, count=4) == []
    everything = at_mask.variables(scores["variablesReference"])
    assert [v["name"] for v in everything] == ["location", "provenance", "stats", "[0]"]


def test_references_expire_on_resume(at_mask):
    ref = named(at_mask.scope("Locals"), "scores")["variablesReference"]
    at_mask.motion("next")
    with pytest.raises(DapError, match="unknown or expired"):
        at_mask.variables(ref)


def test_evaluate_in_hover_watch_and_repl(at_mask):
    hover = at_mask.evaluate("scores", context="hover")
    assert STATS_RE.match(hover["result"]) and hover["memoryReference"] and hover["variablesReference"]
    watch = at_mask.evaluate("(scores > 0).sum()", context="watch")
    assert watch["result"].startswith("int64[] cpu = ")
    repl = at_mask.evaluate("softmax(scores, -1)[0, 0, 0].sum()", context="repl")
    assert float(repl["result"].rsplit("=", 1)[1]) == pytest.approx(1.0)
    assert at_mask.evaluate("scores.shape")["result"] == "torch.Size([1, 4, 16, 16])"
    assert at_mask.evaluate("x", frame_id=3)["result"].startswith("float32[1, 16, 32]")  # x of GPT.forward
    with pytest.raises(DapError, match="not defined at this tick"):
        at_mask.evaluate("weights")


def test_evaluate_refuses_code_execution(at_mask, tmp_path):
    marker = tmp_path / "pwned"
    attacks = [f"__import__('os').system('touch {marker}')", "scores.__class__", "().__class__.__bases__[0]",
               "[c for c in ()]", "lambda: 1", "open('/etc/passwd')", "getattr(scores, 'numpy')()",
               "scores.numpy()", "eval('1')", "exec('1')", "globals()"]
    for attack in attacks:
        with pytest.raises(DapError):
            at_mask.evaluate(attack)
    assert not marker.exists()
    assert at_mask.number("scores.max()") > 0  # still serving, state intact


def test_read_memory_returns_the_tensor_bytes(at_mask):
    scores = named(at_mask.scope("Locals"), "scores")
    memory = at_mask.request("readMemory", {"memoryReference": scores["memoryReference"], "offset": 8, "count": 16})
    values = struct.unpack("<4f", base64.b64decode(memory["data"]))
    expected = [at_mask.number(f"scores[0, 0, 0, {i}]") for i in range(2, 6)]
    assert list(values) == pytest.approx(expected, rel=1e-5)
    placement = at_mask.request("locate", {"name": "scores"})
    assert int(memory["address"], 16) == placement["shards"][0]["address"] + 8
    tail = at_mask.request("readMemory", {"memoryReference": scores["memoryReference"], "offset": 4090, "count": 10})
    assert len(base64.b64decode(tail["data"])) == 6 and tail["unreadableBytes"] == 4
    with pytest.raises(DapError, match="does not name a value"):
        at_mask.request("readMemory", {"memoryReference": "0xdeadbeef", "count": 4})


def test_custom_requests_locate_provenance_timeline_checkpoints(at_mask):
    placement = at_mask.request("locate", {"name": "scores"})
    shard = placement["shards"][0]
    assert placement["value"] == "div" and shard["space"] == "host" and shard["nbytes"] == 4096
    assert shard["shape"] == [1, 4, 16, 16] and shard["dtype"] == "float32"
    prov = at_mask.request("provenance", {"name": "scores", "maxHistory": 4})
    writer = prov["lastWriter"]
    assert writer["node"] == "div" and writer["tick"] == 14 and writer["source"]["line"] == line_of("scores = q @ k")
    assert "p_blocks_0_attn_qkv_weight" in prov["lineage"]["roots"]
    timeline = at_mask.request("timeline", {"start": 13, "count": 3})
    assert timeline["position"] == 15 and [t["node"] for t in timeline["ticks"]] == ["matmul", "div", "ones"]
    checkpoints = at_mask.request("checkpoints")["checkpoints"]
    assert checkpoints[0] == {"tick": 0, "bytes": 0, "tier": "host", "values": 0}  # nothing computed yet
    assert len(checkpoints) > 1  # the run to tick 15 made some
    same = open_session(GPT)  # the same program in this process: what each checkpoint must hold, from liveness
    same.run()
    for c in checkpoints[1:]:
        assert (c["values"], c["bytes"]) == checkpoint_contents(same, c["tick"]), c
        assert c["bytes"] > 0
    with pytest.raises(DapError, match="unknown field 'tik'"):
        at_mask.request("restoreCheckpoint", {"tik": 8})
    with pytest.raises(DapError, match="no checkpoint at tick 7"):
        at_mask.request("restoreCheckpoint", {"tick": 7})
    later = checkpoints[-1]["tick"]
    assert at_mask.motion("restoreCheckpoint", {"tick": later})["reason"] == "goto"
    assert at_mask.position() == later


def test_sources_are_the_files_the_nodes_come_from(fresh):
    sources = fresh.request("loadedSources")["sources"]
    assert [s["path"] for s in sources] == [str(GPT)]
    content = fresh.request("source", {"source": {"path": str(GPT)}, "sourceReference": 0})["content"]
    assert content == Path(GPT).read_text()
    with pytest.raises(DapError, match="no source for"):
        fresh.request("source", {"source": {"path": "/nowhere.py"}, "sourceReference": 0})
