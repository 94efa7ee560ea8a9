"""Reverse execution through the Session API: stepping back is exact, breakpoints agree both ways."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware.session import Direction, FunctionSpec, LineSpec
from tests.conftest import EXAMPLES, MODELS, open_session

DEEP = MODELS / "deep_gpt.py"
GPT_SOURCE = (EXAMPLES / "gpt.py").read_text().splitlines()


def line_of(text: str) -> int:
    return next(i + 1 for i, line in enumerate(GPT_SOURCE) if text in line)


def record_forward(path):
    """Every live tensor at every position, from a run that never evicts."""
    session = open_session(path, budget_mb=1024)
    tl = session.tl
    seen = {}
    for position in range(tl.end + 1):
        tl.seek(position)
        seen[position] = {name: tl.value(name).clone() for name in tl.live()}
    return seen


RECORDED = {}


def recorded(path):
    if path not in RECORDED:
        RECORDED[path] = record_forward(path)
    return RECORDED[path]


def total_intermediate_bytes(path) -> int:
    session = open_session(path, budget_mb=1024)
    session.goto(session.end)
    return session.tl.ring.used


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_step_back_restores_every_live_tensor_bit_for_bit(data):
    expected = recorded(DEEP)
    budget = total_intermediate_bytes(DEEP) // 4 / 2**20  # forces eviction and recomputation
    session = open_session(DEEP, budget_mb=budget, every=4)
    tl = session.tl
    session.goto(tl.end)
    ticks = data.draw(st.lists(st.integers(1, tl.end), min_size=1, max_size=6))
    for tick in ticks:
        session.goto(tick)
        session.step(Direction.REVERSE, "statement")
        assert tl.position == tick - 1
        live = tl.live()
        assert set(live) == set(expected[tick - 1])
        for name in live:
            assert torch.equal(tl.value(name), expected[tick - 1][name]), (tick - 1, name)
        assert tl.ring.used <= tl.ring.budget
    assert tl.ring.peak <= tl.ring.budget
    assert tl.ring.evictions > 0
    assert not tl.nondeterminism


def test_budget_is_never_exceeded_while_running_and_seeking():
    budget_mb = total_intermediate_bytes(DEEP) / 10 / 2**20
    session = open_session(DEEP, budget_mb=budget_mb, every=2)
    tl = session.tl
    for tick in [tl.end, 3, tl.end // 2, 1, tl.end - 1, 0, tl.end]:
        session.goto(tick)
        for name in tl.live():
            tl.value(name)
        assert tl.ring.used <= tl.ring.budget
    assert tl.ring.peak <= tl.ring.budget
    assert tl.ring.evictions > 0


def test_forward_run_matches_eager_bit_for_bit():
    import sys
    sys.path.insert(0, str(EXAMPLES))
    import gpt

    model, inputs = gpt.build()
    session = open_session(EXAMPLES / "gpt.py", budget_mb=0.05)
    stop = session.run()
    assert stop.reason == "end" and session.position == session.end
    with torch.no_grad():
        assert torch.equal(session.tensor(session.program.outputs[0]), model.eval()(*inputs))


def test_reverse_continue_lands_on_last_hit_in_layer_loop():
    session = open_session(DEEP)
    file = str(EXAMPLES / "gpt.py")
    line = line_of("x = x + self.attn(self.ln1(x))")
    (bp,) = session.set_line_breakpoints(file, [LineSpec(line)])
    assert bp.verified
    hits = []
    stop = session.start()
    while stop.reason != "end":
        hits.append((stop.tick, session.current_node().module_path))
        stop = session.run()
    assert [m for _, m in hits] == [f"blocks.{i}.ln1" for i in range(4)]
    stop = session.run(Direction.REVERSE)
    assert (stop.reason, stop.tick) == ("breakpoint", hits[-1][0])
    stop = session.run(Direction.REVERSE)
    assert stop.tick == hits[-2][0]
    assert stop.breakpoint_ids == [bp.id]


def test_conditional_breakpoint_on_a_value_both_directions():
    session = open_session(DEEP)
    tl = session.tl
    file = str(EXAMPLES / "gpt.py")
    line = line_of("scores = scores.masked_fill")
    session.goto(tl.end)
    # Which block's scores exceed a threshold? Compute the truth by hand, then ask the breakpoint.
    positions = [t for t in range(1, tl.end) if tl.node_at(t).loc.line == line != tl.node_at(t - 1).loc.line]
    assert len(positions) == 4
    values = []
    for tick in positions:
        names = session.names_at(tick)
        values.append(float(names["scores"].abs().max()))
    threshold = sorted(values)[len(values) // 2]
    (bp,) = session.set_line_breakpoints(file, [LineSpec(line, condition=f"scores.abs().max() > {threshold}")])
    expected = [t for t, v in zip(positions, values) if v > threshold]
    stop = session.run(Direction.REVERSE)
    assert stop.tick == expected[-1]
    session.goto(0)
    stop = session.run()
    assert stop.tick == expected[0]


def test_hit_count_counts_from_the_start_in_both_directions():
    session = open_session(DEEP)
    (bp,) = session.set_function_breakpoints([FunctionSpec("aten.softmax", hit_condition="3")])
    stop = session.start()
    assert stop.reason == "function breakpoint"
    third = stop.tick
    assert session.current_node().module_path == "blocks.2.attn"
    assert session.run().reason == "end"
    assert session.run(Direction.REVERSE).tick == third
    session.set_function_breakpoints([FunctionSpec("aten.softmax", hit_condition=">=2")])
    session.goto(session.end)
    assert session.run(Direction.REVERSE).tick > third  # the fourth softmax
    assert session.current_node().module_path == "blocks.3.attn"


def test_function_breakpoint_on_module_path_stops_on_entry():
    session = open_session(DEEP)
    session.set_function_breakpoints([FunctionSpec("blocks.1.attn")])
    stop = session.start()
    node = session.current_node()
    assert node.module_path.startswith("blocks.1.attn")
    assert not session.tl.node_at(stop.tick - 1).module_path.startswith("blocks.1.attn")
    assert session.run().reason == "end"


def test_step_out_backwards_lands_where_the_frame_was_entered():
    session = open_session(DEEP)
    file = str(EXAMPLES / "gpt.py")
    session.set_line_breakpoints(file, [LineSpec(line_of("weights = torch.softmax"))])
    stop = session.start()
    attn = session.current_node().frames[-1].module_path
    assert attn == "blocks.0.attn"
    session.set_line_breakpoints(file, [])
    stop = session.step(Direction.REVERSE, "line", "out")
    tl = session.tl
    entered = tl.node_at(stop.tick)
    before = tl.node_at(stop.tick - 1)
    assert entered.frames[-1].module_path == attn and entered.loc.line == line_of("self.qkv(x).split")
    assert all(f.module_path != attn for f in before.frames)
    # and forward: step out of attention returns to Block.forward
    session.goto(stop.tick + 3)
    stop = session.step(Direction.FORWARD, "line", "out")
    assert session.current_node().frames[-1].module_path == "blocks.0"


def test_next_and_step_back_by_line():
    session = open_session(EXAMPLES / "gpt.py")
    file = str(EXAMPLES / "gpt.py")
    q_line = line_of("q = q.view(")
    session.set_line_breakpoints(file, [LineSpec(q_line)])
    session.start()
    session.set_line_breakpoints(file, [])
    stop = session.step(Direction.FORWARD, "line", "over")
    assert session.current_node().loc.line == q_line + 1
    stop = session.step(Direction.FORWARD, "line", "over")
    assert session.current_node().loc.line == q_line + 2
    stop = session.step(Direction.REVERSE, "line", "over")
    assert session.current_node().loc.line == q_line + 1
    assert session.tl.node_at(stop.tick - 1).loc.line == q_line  # landed where the line began
    stop = session.step(Direction.FORWARD, "line", "in")
    assert session.current_node().loc.line == q_line + 2


def test_end_of_program_keeps_the_session_and_allows_going_back():
    session = open_session(EXAMPLES / "mlp.py")
    stop = session.start()
    assert stop.reason == "end" and stop.tick == session.end
    assert session.run().reason == "end"
    stop = session.step(Direction.REVERSE, "statement")
    assert stop.tick == session.end - 1 and session.current_node().name == "linear_2"


def test_kv_cache_step_back_restores_the_buffer_pre_image():
    session = open_session(EXAMPLES / "kv_cache.py", budget_mb=0.001)
    tl = session.tl
    before = tl.physical["b_k_cache"].clone()
    write_tick = next(r.tick for r in tl.log.history("b_k_cache")) if len(tl.log) else None
    assert write_tick is None
    session.goto(tl.end)
    after = tl.physical["b_k_cache"].clone()
    assert not torch.equal(before, after)
    (rec,) = tl.log.history("b_k_cache")
    assert rec.kind == "buffer write"
    session.goto(rec.tick + 1)
    assert torch.equal(tl.physical["b_k_cache"], after)
    session.step(Direction.REVERSE, "statement")
    assert torch.equal(tl.physical["b_k_cache"], before)
    session.goto(tl.end)
    assert torch.equal(tl.physical["b_k_cache"], after)


def test_nondeterministic_op_is_reported_on_replay():
    events = []
    session = open_session(EXAMPLES / "noisy.py", budget_mb=0, events=events)
    session.run()
    session.goto(2)
    session.tensor("randn_like")
    findings = session.tl.nondeterminism
    assert findings and findings[0].node == "randn_like"
    assert any(e.kind == "output" and "non-determinism" in e.text for e in events)


def test_deterministic_model_replays_without_findings():
    session = open_session(DEEP, budget_mb=0)
    session.run()
    session.goto(5)
    for name in session.live_values():
        session.tensor(name)
    assert session.tl.nondeterminism == []


def test_checkpoints_are_listed_and_restorable():
    session = open_session(EXAMPLES / "gpt.py", every=8)
    session.run()
    cps = session.checkpoints()
    assert [c["tick"] for c in cps][:3] == [0, 8, 16]
    assert all(c["tier"] == "host" and c["bytes"] >= 0 for c in cps)
    stop = session.restore(16)
    assert stop.tick == 16
    import pytest
    from hardware.errors import RewindError
    with pytest.raises(RewindError, match="no checkpoint at tick 17"):
        session.restore(17)


def test_edit_is_a_step_undone_by_stepping_back():
    session = open_session(EXAMPLES / "mlp.py")
    tl = session.tl
    session.goto(2)  # after fc1 and relu
    original_out = None
    before = session.tensor("relu").clone()
    tick = session.set_element("relu", (0, 1), 123.0)
    assert tick == 2 and tl.position == 3
    assert session.tensor("relu")[0, 1].item() == 123.0
    session.goto(tl.end)
    edited_out = session.tensor("linear_2").clone()
    session.goto(2)
    assert torch.equal(session.tensor("relu"), before)
    fresh = open_session(EXAMPLES / "mlp.py")
    fresh.goto(fresh.end)
    original_out = fresh.tensor("linear_2")
    assert not torch.equal(edited_out, original_out)
    rec = tl.log.last_writer(value="relu")
    assert rec.kind == "user edit"


def test_set_element_on_a_bfloat16_value_is_an_edit_like_any_other():
    session = open_session(MODELS / "bf16_double.py")
    session.goto(1)
    session.set_element("mul", (1,), 7.5)
    assert session.tensor("mul").tolist() == [2.0, 7.5, 2.0]
    session.goto(session.end)
    assert session.tensor(session.program.outputs[0]).item() == 11.5
