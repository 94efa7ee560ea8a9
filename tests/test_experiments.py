"""Experiments through the Session API: named patches on branches of the timeline, measured against the
reference and the original, compared side by side, and undone bit for bit."""

import pytest
import torch

from checkpoint.branch import FunctionPatch
from hardware.errors import RewindError
from hardware.session import Direction
from provenance.experiments import ORIGINAL, NamedPatch
from provenance.fixes import named_patch
from tests.conftest import open_session
from tests.forensics_cases import FORENSICS

SOFTMAX = FORENSICS / "softmax_overflow.py"
STABLE_EXP = "import torch\n\ndef stable_exp(x):\n    return torch.exp(x - x.amax(-1, keepdim=True))\n"


def at_end(session) -> dict[str, torch.Tensor]:
    """Every value the pass wrote, as it is at the end: host copies."""
    tl = session.tl
    return {name: tl.driver.to_host(tl.value(name, tl.end)).clone() for name, info in session.program.values.items()
            if info.producer is not None}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8).reshape(-1),
                                                                      b.contiguous().view(torch.uint8).reshape(-1))


@pytest.fixture
def softmax():
    session = open_session(SOFTMAX)
    session.run()
    return session


def test_a_function_patch_is_measured_against_the_reference_and_the_original(softmax):
    ex = softmax.experiments
    ex.add("stable", named_patch(softmax.program, "stable-exp", "exp", function=STABLE_EXP))
    m = ex.measure("stable")
    (out,) = m["outputs"]
    assert out["reference"]["within"] and not out["originalReference"]["within"]
    assert not out["original"]["within"] and out["original"]["nonfinite"] == 0
    assert m["tick"] == softmax.tl.node_tick[softmax.program.find_nodes("exp")[0]]
    rows = {r["node"]: r for r in m["nodes"]}
    assert list(rows) == ["exp", "sum_1", "div", "matmul_1"]  # every node from the patch point on
    assert rows["exp"]["patch"] == "stable-exp" and rows["sum_1"]["patch"] is None
    assert rows["matmul_1"]["within"] and rows["matmul_1"]["originalError"] == "inf"
    assert all(r["seconds"] > 0 and r["originalSeconds"] > 0 for r in rows.values())
    assert m["patches"][0]["kind"] == "function" and m["patches"][0]["nodes"][0]["node"] == "exp"


def test_undo_restores_the_original_pass_bit_for_bit_and_it_stays_navigable():
    session = open_session(SOFTMAX, budget_mb=0.0003, every=2)  # evicts: the original comes back by recomputation
    session.run()
    tl = session.tl
    session.goto(5)
    before, digests = at_end(session), [r.digest for r in tl.log]
    ex = session.experiments
    ex.add("stable", named_patch(session.program, "stable-exp", "exp", function=STABLE_EXP))
    ex.add("wide", named_patch(session.program, "wide", "div", precision="float64"))
    ex.compare(["stable", "wide"])
    ex.measure("wide")
    assert ex.active == "wide" and tl.patches
    ex.restore()
    assert ex.active == ORIGINAL and tl.patches == {} and tl.position == 5
    assert [r.digest for r in tl.log] == digests and tl.ring.evictions > 0
    after = at_end(session)
    assert all(same_bits(before[n], after[n]) for n in before)
    assert tl.nondeterminism == []
    assert session.step(Direction.REVERSE, "instruction").tick == 4 and session.run().reason == "end"
    assert set(ex.branches) == {"stable", "wide"}  # branches outlive the undo, to measure again


def test_attributes_of_an_op_are_patched_by_their_schema_names():
    session = open_session(FORENSICS / "clean_half.py")
    session.run()
    program = session.program
    patch = named_patch(program, "eps", "aten.layer_norm", attributes={"eps": 0.5})
    assert patch.patches[0].describe() == "with eps=0.5"
    session.experiments.add("loose-norm", patch)
    m = session.experiments.measure("loose-norm")
    assert not m["outputs"][0]["original"]["within"] and m["nodes"][0]["patch"] == "eps"
    with pytest.raises(RewindError, match="has no attribute 'epsilon' .*eps"):
        named_patch(program, "bad", "aten.layer_norm", attributes={"epsilon": 0.5})
    with pytest.raises(RewindError, match="has no attribute 'input'"):
        named_patch(program, "bad", "aten.layer_norm", attributes={"input": 0.5})


def test_a_value_edit_patch_changes_one_element_from_its_node_on(softmax):
    ex = softmax.experiments
    ex.add("poke", named_patch(softmax.program, "zero", None, edit={"value": "div", "index": [0, 1, 2], "set": 0.0}))
    m = ex.measure("poke")
    assert [r["node"] for r in m["nodes"]] == ["div", "matmul_1"]
    assert softmax.tl.value("div", softmax.tl.end)[0, 1, 2] == 0.0
    with pytest.raises(RewindError, match="input of the pass.*setVariable"):
        named_patch(softmax.program, "x", None, edit={"value": "x", "index": [0, 0, 0], "set": 1.0})
    with pytest.raises(RewindError, match=r"shape \[1, 8, 8\]: give an index inside it"):
        named_patch(softmax.program, "x", None, edit={"value": "div", "index": [0, 9, 0], "set": 1.0})


def test_patches_are_named_listed_and_removable(softmax):
    ex = softmax.experiments
    ex.add("b", named_patch(softmax.program, "exp32", "exp", precision="float32"))
    ex.add("b", named_patch(softmax.program, "sum32", "sum_1", precision="float32"))
    listing = ex.listing()
    assert listing["active"] == "b" and [p["name"] for p in listing["branches"][0]["patches"]] == ["exp32", "sum32"]
    assert softmax.tl.patches.keys() == set(softmax.program.find_nodes("exp") + softmax.program.find_nodes("sum_1"))
    ex.remove("b", "exp32")
    assert [p["name"] for p in ex.listing()["branches"][0]["patches"]] == ["sum32"]
    assert list(softmax.tl.patches) == softmax.program.find_nodes("sum_1")
    ex.remove("b", "sum32")
    assert ex.listing() == {"active": ORIGINAL, "branches": []} and softmax.tl.patches == {}


def test_compare_puts_branches_side_by_side(softmax):
    ex = softmax.experiments
    ex.add("stable", named_patch(softmax.program, "stable-exp", "exp", function=STABLE_EXP))
    ex.add("exp-only", named_patch(softmax.program, "exp32", "exp", precision="float32"))
    ex.restore()
    c = ex.compare(["stable", "exp-only"])
    (out,) = c["outputs"]
    assert out["branches"]["stable"]["reference"]["within"] and not out["branches"]["exp-only"]["reference"]["within"]
    assert c["active"] == ORIGINAL  # comparing leaves the installed branch as it was
    div = next(r for r in c["nodes"] if r["node"] == "div")
    assert set(div["branches"]) == {"stable", "exp-only"} and div["original"]["error"] == "inf"


def test_the_position_stays_where_the_user_is_and_the_branch_is_navigable(softmax):
    softmax.goto(6)
    ex = softmax.experiments
    ex.add("stable", named_patch(softmax.program, "stable-exp", "exp", function=STABLE_EXP))
    assert softmax.position == 6 and not softmax.tensor("exp").isinf().any()
    assert softmax.step(Direction.FORWARD, "instruction").tick == 7
    ex.restore()
    assert softmax.position == 7 and softmax.tensor("exp").isinf().any()


def test_a_patch_that_changes_a_shape_is_refused_and_the_session_keeps_going(softmax):
    ex = softmax.experiments
    node = softmax.program.find_nodes("exp")[0]
    flat = NamedPatch("flat", (FunctionPatch(node, lambda x: x.reshape(-1)),))
    with pytest.raises(RewindError, match=r"wrote 'exp' with shape \[64\]; the program's is \[1, 8, 8\]"):
        ex.add("bad", flat)  # at the end: the branch runs as it is installed
    assert ex.listing()["branches"] == [] and softmax.position == softmax.end
    softmax.goto(0)
    ex.add("bad", flat)  # before the patch point: it runs when measured
    with pytest.raises(RewindError, match="wrote 'exp' with shape"):
        ex.measure("bad")
    ex.restore()
    assert softmax.run().reason == "end" and softmax.tensor("exp").isinf().any()


def test_bad_experiment_requests_name_the_problem(softmax):
    ex, program = softmax.experiments, softmax.program
    patch = named_patch(program, "p", "exp", precision="float32")
    with pytest.raises(RewindError, match="cannot name a branch"):
        ex.add(ORIGINAL, patch)
    ex.add("b", patch)
    with pytest.raises(RewindError, match="already has a patch named 'p'"):
        ex.add("b", patch)
    with pytest.raises(RewindError, match="already patched by 'p'"):
        ex.add("b", named_patch(program, "q", "exp", precision="float64"))
    with pytest.raises(RewindError, match="no branch 'nope'"):
        ex.measure("nope")
    with pytest.raises(RewindError, match="no patch named 'q'"):
        ex.remove("b", "q")
    with pytest.raises(RewindError, match="'int8' is not a floating-point dtype"):
        named_patch(program, "p", "exp", precision="int8")
    with pytest.raises(RewindError, match="exactly one of precision, function, attributes or edit"):
        named_patch(program, "p", "exp", precision="float32", attributes={"eps": 1})
    with pytest.raises(RewindError, match="defines 2 functions .*name the one to use with entry"):
        named_patch(program, "p", "exp", function="def a(x):\n    return x\n\ndef b(x):\n    return x\n")
    with pytest.raises(RewindError, match="no node, op or module path 'nope'"):
        named_patch(program, "p", "nope", precision="float32")


def test_on_the_sim_chip_functions_and_edits_patch_while_attributes_are_refused():
    session = open_session(FORENSICS / "sqrt_domain.py", driver="sim")
    session.run()
    ex, program = session.experiments, session.program
    clamp = "import torch\n\ndef clamped(x):\n    return torch.sqrt(x.clamp_min(0))\n"
    ex.add("clamp", named_patch(program, "clamp", "sqrt", function=clamp))
    assert [r["node"] for r in ex.measure("clamp")["nodes"]] == ["sqrt", "div"]
    assert not session.tensor("sqrt").isnan().any()
    ex.add("poke", named_patch(program, "poke", None, edit={"value": "sub", "index": [0, 0], "set": 1.0}))
    assert session.tensor("sub")[0, 0] == 1.0
    with pytest.raises(RewindError, match="lowered it at load, so its attributes cannot change"):
        ex.add("keep", named_patch(program, "keep", "mean_1", attributes={"keepdim": True}))
    ex.restore()
    assert session.tensor("sqrt").isnan().any() and session.tl.nondeterminism == []
