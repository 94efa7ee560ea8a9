"""Reverse execution through the Session API: stepping back is exact, breakpoints agree both ways."""

import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware.errors import RewindError
from hardware.session import Direction, FunctionSpec, LineSpec
from tests.conftest import EXAMPLES, MODELS, fresh_module, open_session, program

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


def eager_model(path):
    """A fresh instance of the model file's module (its own `build()`), holding the weights and buffers of the
    Program the engine runs (loaded by name from `Program.initial`), and the Program's inputs."""
    module = fresh_module(path)
    model, _ = module.build()
    prog = program(str(path))
    state = {v.target: prog.initial[n] for n, v in prog.values.items() if v.kind in ("parameter", "buffer", "constant")}
    model.load_state_dict(state, strict=True)
    inputs = tuple(prog.initial[n] for n, v in prog.values.items() if v.kind == "input")
    return model.eval(), inputs


EAGER = {}


def eager_values(path) -> dict[str, list[torch.Tensor]]:
    """What plain eager torch computes for the Program's values: value name -> the eager tensors it must equal.

    The model runs once, eagerly, on the Program's inputs and weights. Names map three ways: the program's output;
    each submodule's output (a forward hook) is the value of the last node run inside that module; and the source
    variables of each forward (a line tracer snapshots them as each line begins) are the values the engine's
    `source_names` gives for the frame and line its nodes run at (lines a loop runs more than once are left out)."""
    if path in EAGER:
        return EAGER[path]
    prog = program(str(path))
    model, inputs = eager_model(path)
    module_paths = {id(m): name for name, m in model.named_modules()}
    outputs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: outputs.__setitem__(name, out.detach().clone()))
             for name, m in model.named_modules()]
    at_line: dict[tuple, list[dict]] = {}
    files = set(prog.files())

    def tracer(frame, event, arg):
        if frame.f_code.co_filename not in files:
            return None

        def line(frame, event, arg):
            if event == "line":
                key = (module_paths.get(id(frame.f_locals.get("self"))), frame.f_lineno)
                at_line.setdefault(key, []).append({k: v.detach().clone() for k, v in frame.f_locals.items()
                                                    if isinstance(v, torch.Tensor)})
            return line
        return line

    sys.settrace(tracer)
    try:
        with torch.no_grad():
            result = model(*inputs)
    finally:
        sys.settrace(None)
        for hook in hooks:
            hook.remove()
    eager: dict[str, list[torch.Tensor]] = {prog.outputs[0]: [result]}
    last_in: dict[str, str] = {}
    for node in prog.nodes:
        for module_path, _cls in node.module_stack:
            last_in[module_path] = node.outputs[-1]
    for module_path, out in outputs.items():
        eager.setdefault(last_in[module_path], []).append(out)
    session = open_session(path)
    for tick in range(session.end):
        frame = session.tl.node_at(tick).frames[-1]
        snapshots = at_line.get((frame.module_path, frame.loc.line), [])
        if len(snapshots) == 1:
            for variable, name in session.source_names(tick).items():
                if variable in snapshots[0]:
                    eager.setdefault(name, []).append(snapshots[0][variable])
    session.close()
    EAGER[path] = eager
    return eager


def assert_matches_eager(tl, eager) -> int:
    """Every live value eager torch also computed, and the latest value it computed that exists at the position
    (live or not), are bit for bit eager's. How many were compared (0 only before any such value is written).

    Bit for bit, not within a tolerance: the engine runs the aten ops eager runs, on the same CPU, on the same
    inputs, and torch's CPU kernels give the same bits for the same op on the same inputs in one process."""
    position = tl.position
    written = [n for n in eager if tl.version_at(n, position) is not None]
    latest = max(written, key=lambda n: tl.version_at(n, position), default=None)
    compared = 0
    for name in set(tl.live()) | ({latest} - {None}):
        for tensor in eager.get(name, ()):
            assert torch.equal(tl.value(name, position), tensor), (position, name)
            compared += 1
    return compared


def checkpoint_contents(session, tick: int) -> tuple[int, int]:
    """(values, bytes) a checkpoint at `tick` holds, from the Program alone: the values a node before `tick`
    computed that a node at or after it still reads (or the program returns), each storage counted once.
    `session` ran past `tick` without edits (node i ran at tick i); the sizes are its tensors'."""
    prog = session.program
    end = len(prog.nodes)
    names = [n for n, v in prog.values.items()
             if v.producer is not None and v.producer < tick <= min(v.last_use, end)]
    storages = {}
    for name in names:
        storage = session.tensor(name, tick).untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return len(names), sum(storages.values())


def total_intermediate_bytes(path) -> int:
    session = open_session(path, budget_mb=1024)
    session.goto(session.end)
    return session.tl.ring.used


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_step_back_restores_every_live_tensor_bit_for_bit(data):
    """Each value after a step back, and after the step forward again, is bit for bit what the engine's own
    first pass wrote, and what plain eager torch computes on the same inputs and weights (`eager_values`)."""
    expected = recorded(DEEP)
    eager = eager_values(DEEP)
    budget = total_intermediate_bytes(DEEP) // 4 / 2**20  # forces eviction and recomputation
    session = open_session(DEEP, budget_mb=budget, every=4)
    tl = session.tl
    session.goto(tl.end)
    assert len(eager) > len(session.program.nodes) // 2  # eager torch vouches for most values, by name
    assert assert_matches_eager(tl, eager) >= 1  # the output
    ticks = data.draw(st.lists(st.integers(1, tl.end), min_size=1, max_size=6))
    compared = 0
    for tick in ticks:
        session.goto(tick)
        for direction, position in ((Direction.REVERSE, tick - 1), (Direction.FORWARD, tick)):  # a round trip
            session.step(direction, "instruction")
            assert tl.position == position
            live = tl.live()
            assert set(live) == set(expected[position])
            for name in live:
                assert torch.equal(tl.value(name), expected[position][name]), (position, name)
            compared += assert_matches_eager(tl, eager)
            assert tl.ring.used <= tl.ring.budget
    assert compared >= len(ticks)  # at least one value each time the step forward lands
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
    stop = session.step(Direction.REVERSE, "instruction")
    assert stop.tick == session.end - 1 and session.current_node().name == "linear_2"


def test_kv_cache_step_back_restores_the_buffer_pre_image():
    session = open_session(EXAMPLES / "kv_cache.py", budget_mb=0.001)
    tl = session.tl
    model, inputs = eager_model(EXAMPLES / "kv_cache.py")
    before = tl.physical["b_k_cache"].clone()
    assert torch.equal(before, model.k_cache)  # the pre-image: the buffer as the module holds it
    with torch.no_grad():
        model(*inputs)  # eager torch writes the cache in place
    session.goto(tl.end)
    after = tl.physical["b_k_cache"].clone()
    assert not torch.equal(before, after)
    assert torch.equal(after, model.k_cache)  # bit for bit eager torch's post-image
    (rec,) = tl.log.history("b_k_cache")
    assert rec.kind == "buffer write"
    inside = session.locate("b_k_cache").shards[0].address + 4
    session.goto(rec.tick + 1)  # the buffer has been written
    assert torch.equal(tl.physical["b_k_cache"], after)
    assert tl.log.last_writer(value="b_k_cache", before=tl.position).tick == rec.tick
    assert (session.who_wrote(inside).tick, session.who_wrote(inside).kind) == (rec.tick, "buffer write")
    session.step(Direction.REVERSE, "instruction")  # back past the write
    assert tl.position == rec.tick
    assert torch.equal(tl.physical["b_k_cache"], before)
    assert tl.log.last_writer(value="b_k_cache", before=tl.position) is None  # no write of it before this tick
    assert session.who_wrote(inside) is None
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
    assert all(c["tier"] == "host" for c in cps)
    assert (cps[0]["values"], cps[0]["bytes"]) == (0, 0)  # nothing is computed at tick 0
    for c in cps:
        values, nbytes = checkpoint_contents(session, c["tick"])
        assert (c["values"], c["bytes"]) == (values, nbytes), c
        assert c["tick"] == 0 or nbytes > 0
    stop = session.restore(16)
    assert stop.tick == 16
    with pytest.raises(RewindError, match="no checkpoint at tick 17"):
        session.restore(17)


def test_edit_is_a_step_undone_by_stepping_back():
    session = open_session(EXAMPLES / "mlp.py")
    tl = session.tl
    session.goto(2)  # after fc1 and relu
    before = session.tensor("relu").numpy().tobytes()
    tick = session.set_element("relu", (0, 1), 123.0)
    assert tick == 2 and tl.position == 3
    edited = session.tensor("relu").clone()
    assert edited[0, 1].item() == 123.0
    stop = session.step(Direction.REVERSE, "instruction")  # back over the edit: one step
    assert (stop.reason, stop.tick, tl.position) == ("step", 2, 2)
    assert session.tensor("relu").numpy().tobytes() == before  # the pre-edit bytes, every one
    stop = session.step(Direction.FORWARD, "instruction")  # and forward again: the edit is done again
    assert (stop.tick, tl.position) == (3, 3)
    assert torch.equal(session.tensor("relu"), edited)
    session.goto(tl.end)
    edited_out = session.tensor("linear_2").clone()
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



def test_an_edit_in_the_past_of_a_value_the_ring_evicted_writes_into_the_value_made_again():
    """Timeline.edit at a tick whose value the ring let go: the edit's base is recomputed from the nearest
    checkpoint (it was missing before), and the edited value is that base with the edited bytes."""
    kept = open_session(EXAMPLES / "gpt.py")  # the default budget keeps every value
    kept.goto(kept.tl.end // 2)
    base = kept.tl.value("embedding").clone()
    session = open_session(EXAMPLES / "gpt.py", budget_mb=0.0005)
    tl = session.tl
    session.goto(tl.end)
    session.goto(tl.end // 2)
    assert ("embedding", tl.version_at("embedding", tl.position)) not in tl.ring  # let go (or, run ahead, never kept)
    tl.edit("embedding", 0, bytes(base.element_size()))  # nothing read it since the ring let it go
    after = tl.value("embedding").reshape(-1)
    assert after[0].item() == 0 and torch.equal(after[1:], base.reshape(-1)[1:])
