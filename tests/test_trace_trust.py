"""Opening a trace someone else made: crafted and damaged files are refused clearly, or open and answer
clearly; nothing read from a file is ever run (docs/trace-format.md, "What a reader accepts").

The traces here are real recordings of examples/mlp.py, taken apart frame by frame, changed, and put back
together with correct checksums and index, so each test reaches the check it is about."""

from __future__ import annotations

import builtins
import copy
import random
import re
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import lz4.block
import msgpack
import pytest

from checkpoint.trace import (CHECKPOINT, FOOTER, FOOTER_MAGIC, FRAME, HEADER, INDEX, INITIAL, KIND_NAMES, MAGIC,
                              META, PROGRAM, STEP, TRUNCATE, VERSION, VERSION_FRAME, WRITE, TraceError)
from hardware.errors import RewindError
from hardware.session import Direction, LaunchOptions, Session
from tests.conftest import EXAMPLES, open_session

# Words a user must never see: Python's exception classes (and those of the libraries a reader uses), tracebacks.
FORBIDDEN = sorted({n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
                   | {"LZ4BlockError", "StackError", "ExtraData", "UnpackValueError", "struct.error", "RewindError"})
_FORBIDDEN_RE = re.compile(r"\b(" + "|".join(re.escape(n) for n in FORBIDDEN) + r")\b|Traceback|internal error in")


def assert_clear(message: str) -> None:
    found = _FORBIDDEN_RE.search(message)
    assert found is None, f"the user sees {found.group(0)!r} in: {message}"


# -- taking a trace apart and putting it back together ---------------------------------------------------------
def frames_of(data: bytes) -> list[list]:
    """[kind, payload] of every frame before the index, payloads decoded."""
    out, offset = [], HEADER.size
    while offset + FRAME.size <= len(data):
        length, _crc, kind = FRAME.unpack_from(data, offset)
        if kind == INDEX or offset + FRAME.size + length > len(data):
            break
        out.append([kind, msgpack.unpackb(data[offset + FRAME.size:offset + FRAME.size + length], raw=False,
                                          strict_map_key=False)])
        offset += FRAME.size + length
    return out


def boundaries(data: bytes) -> list[tuple[int, str]]:
    """(offset, kind name) of every frame, the index's included, then the footer's offset."""
    out, offset = [], HEADER.size
    while offset + FRAME.size <= len(data) - FOOTER.size:
        length, _crc, kind = FRAME.unpack_from(data, offset)
        out.append((offset, KIND_NAMES[kind]))
        offset += FRAME.size + length
    return out + [(offset, "footer")]


def build(frames: list[list], index: Callable[[list], list] | None = None) -> bytes:
    """A whole trace: header, the frames with their checksums, an index (changed by `index`), the footer."""
    out = bytearray(HEADER.pack(MAGIC, VERSION, 0))
    entries = []
    for kind, payload in frames:
        body = msgpack.packb(payload, use_bin_type=True)
        key = []
        if kind in (INITIAL, VERSION_FRAME) and isinstance(payload, dict):
            key = [payload.get("name")] + ([payload.get("tick")] if kind == VERSION_FRAME else [])
        entries.append([kind, len(out)] + key)
        out += FRAME.pack(len(body), zlib.crc32(bytes([kind]) + body), kind) + body
    if index is not None:
        entries = index(entries)
    at = len(out)
    body = msgpack.packb(entries, use_bin_type=True)
    out += FRAME.pack(len(body), zlib.crc32(bytes([INDEX]) + body), INDEX) + body
    return bytes(out + FOOTER.pack(at, FOOTER_MAGIC))


def crafted(frames: list[list], kind: int, edit: Callable[[Any], Any], nth: int = 0) -> list[list]:
    """A deep copy of `frames` with the payload of the nth frame of `kind` replaced by edit(payload)."""
    out = copy.deepcopy(frames)
    found = [f for f in out if f[0] == kind][nth]
    found[1] = edit(found[1])
    return out


def node_of(program: dict, name: str) -> dict:
    return next(n for n in program["nodes"] if n["name"] == name)


# -- opening, and using what opened ----------------------------------------------------------------------------
def launch(path: Path, events: list | None = None, **options) -> Session:
    session = Session(events.append if events is not None else None)
    session.launch(LaunchOptions(trace=str(path), budget_mb=1, **options))
    return session


def inspect_here(session: Session) -> None:
    """Everything a user reads at a stop: frames, every live value, its statistics, provenance and place."""
    session.frames()
    session.timeline_entries(0, 50)
    session.checkpoints()
    for name in session.live_values():
        for read in (session.tensor, session.value_stats, session.provenance, session.locate):
            try:
                read(name)
            except RewindError as exc:
                assert_clear(str(exc))


def assert_refused_or_usable(path: Path, forensics: bool = False) -> Session | None:
    """The rule for a damaged or crafted trace: opening it is refused with a TraceError naming the file, or it
    opens and every motion and request either works or raises a RewindError in plain words."""
    try:
        session = launch(path)
    except TraceError as exc:
        assert str(path) in str(exc), f"the refusal does not name the file: {exc}"
        assert_clear(str(exc))
        return None
    motions = [session.start, session.run, lambda: session.step(Direction.REVERSE, "instruction"),
               lambda: session.goto(0), lambda: session.goto(session.tl.frontier // 2),
               lambda: session.step(Direction.FORWARD, "line"), lambda: session.run(Direction.REVERSE),
               lambda: session.goto(session.tl.frontier), lambda: session.goto(session.end)]
    if forensics:
        motions.append(lambda: session.forensics.first_divergence())
    for motion in motions:
        try:
            motion()
        except RewindError as exc:
            assert_clear(str(exc))
        inspect_here(session)
    session.close()
    return session


@pytest.fixture(scope="module")
def mlp_trace(tmp_path_factory) -> bytes:
    """A saved trace of examples/mlp.py (5 nodes): its bytes."""
    live = open_session(EXAMPLES / "mlp.py", budget_mb=1)
    live.run()
    path = tmp_path_factory.mktemp("mlp") / "mlp.rwtrace"
    live.save_trace(str(path))
    live.close()
    return path.read_bytes()


@pytest.fixture
def write(tmp_path) -> Callable[[bytes], Path]:
    def write(data: bytes, name: str = "crafted.rwtrace") -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return path
    return write


# -- 1. names in a trace never reach Python ---------------------------------------------------------------------
SENTINEL = "rewind_trace_sentinel_module"


@pytest.mark.parametrize("op", ["import_module.__call__.__call__", "load_library.__call__.__call__"])
def test_an_op_name_that_reaches_a_torch_ops_method_is_refused_and_nothing_runs(mlp_trace, write, tmp_path,
                                                                                 monkeypatch, op):
    marker = tmp_path / "imported"
    (tmp_path / f"{SENTINEL}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = SENTINEL if op.startswith("import_module") else str(tmp_path / f"{SENTINEL}.py")

    def poison(program: dict) -> dict:
        node = node_of(program, "relu")
        node["op"], node["args"], node["kwargs"] = op, {"$tuple": [target]}, {"$dict": {}}
        return program
    path = write(build(crafted(frames_of(mlp_trace), PROGRAM, poison)))
    with pytest.raises(RewindError) as refused:
        session = launch(path)
        session.forensics.first_divergence()  # the float64 reference pass runs every node's op
        session.run()
    assert isinstance(refused.value, TraceError)
    message = str(refused.value)
    assert str(path) in message
    assert f"node 1 'relu' names op '{op}', which is not a registered torch operator" in message
    assert "program frame at offset" in message
    assert not marker.exists() and SENTINEL not in sys.modules


@pytest.mark.parametrize("op", ["aten.linear", "aten.linear.default.out", "aten.__class__.default",
                                "higher_order.cond.default", "loaded_libraries.add.default", "aten.linear.__doc__",
                                "aten.linear.de fault", 7, None])
def test_an_op_name_that_is_not_an_operator_overload_is_refused_at_open(mlp_trace, write, op):
    def rename(program: dict) -> dict:
        node_of(program, "tanh")["op"] = op
        return program
    path = write(build(crafted(frames_of(mlp_trace), PROGRAM, rename)))
    with pytest.raises(TraceError) as refused:
        launch(path)
    assert str(path) in str(refused.value) and f"names op {op!r}" in str(refused.value)
    assert_clear(str(refused.value))


def test_a_well_formed_op_this_torch_does_not_register_opens_and_says_it_cannot_run(mlp_trace, write):
    """A custom op whose library is not loaded (or an op of a newer torch): the recorded values stand in."""
    def rename(program: dict) -> dict:
        node_of(program, "tanh")["op"] = "mylib.fancy_tanh.default"
        return program
    events: list = []
    session = launch(write(build(crafted(frames_of(mlp_trace), PROGRAM, rename))), events)
    said = [e.text for e in events if e.kind == "output"]
    assert any("mylib.fancy_tanh.default" in s and "cannot run again" in s for s in said)
    session.goto(session.end)
    assert session.tensor("tanh").shape == (3, 16)  # recorded
    with pytest.raises(RewindError, match="op mylib.fancy_tanh.default is not available in this torch build"):
        session.tl.program.nodes[3].target()


TABLE_CASES = {
    "dtype naming a torch attribute": ({"$dtype": "ops"}, "unknown dtype 'ops'"),
    "dtype naming a torch submodule": ({"$dtype": "onnx"}, "unknown dtype 'onnx'"),
    "device that is not a device": ({"$device": "cuda:0; import os"}, "unknown device"),
    "device of a made-up kind": ({"$device": "evil:1"}, "unknown device"),
    "layout naming a torch function": ({"$layout": "manual_seed"}, "unknown layout 'manual_seed'"),
    "layout naming a torch submodule": ({"$layout": "onnx"}, "unknown layout 'onnx'"),
    "memory format naming a module": ({"$memory_format": "_C"}, "unknown memory format '_C'"),
    "unknown tag": ({"$call": "os.system"}, "corrupt node argument"),
}


@pytest.mark.parametrize("case", list(TABLE_CASES))
def test_dtype_device_layout_and_memory_format_names_come_only_from_fixed_tables(mlp_trace, write, case):
    arg, says = TABLE_CASES[case]

    def plant(program: dict) -> dict:
        node_of(program, "linear")["kwargs"] = {"$dict": {"planted": arg}}
        return program
    path = write(build(crafted(frames_of(mlp_trace), PROGRAM, plant)))
    with pytest.raises(TraceError) as refused:
        launch(path)
    message = str(refused.value)
    assert str(path) in message and "program frame at offset" in message and says in message
    assert_clear(message)


def test_a_value_whose_dtype_is_not_a_dtype_name_is_refused(mlp_trace, write):
    def retype(program: dict) -> dict:
        next(v for v in program["values"] if v[0] == "relu")[2] = "_C"
        return program
    path = write(build(crafted(frames_of(mlp_trace), PROGRAM, retype)))
    with pytest.raises(TraceError, match=r"program frame at offset \d+: unknown dtype '_C'") as refused:
        launch(path)
    assert str(path) in str(refused.value)


def test_a_meta_frame_cannot_name_anything_that_is_run(mlp_trace, write):
    """The driver name a trace stores is shown, never opened; names must be text."""
    def rename(meta: dict) -> dict:
        meta["driver"] = "torch:cuda\x1b[2J"
        return meta
    session = launch(write(build(crafted(frames_of(mlp_trace), META, rename))))
    assert session.tl.driver.name == "trace of torch:cuda?[2J"
    with pytest.raises(TraceError, match=r"meta frame at offset 16: 'driver' is \['x'\], not a name"):
        launch(write(build(crafted(frames_of(mlp_trace), META, lambda m: {**m, "driver": ["x"]}))))


# -- 2. tensors: sizes are checked before anything is allocated -------------------------------------------------
@pytest.mark.parametrize("shape, says", [([2**30], "1073741824 bytes declared, more than"),
                                         ([2**17, 2**16], "has more than 2147483647 elements")])
def test_a_compression_bomb_is_refused_before_anything_is_allocated(mlp_trace, write, monkeypatch, shape, says):
    sizes: list[int] = []
    decompress = lz4.block.decompress

    def watched(data, uncompressed_size=-1, **kw):
        sizes.append(uncompressed_size)
        if uncompressed_size > 2**20:
            raise lz4.block.LZ4BlockError("the test refuses to allocate this")
        return decompress(data, uncompressed_size=uncompressed_size, **kw)
    monkeypatch.setattr(lz4.block, "decompress", watched)
    bomb = lz4.block.compress(bytes(4096), store_size=False)

    def inflate(initial: dict) -> dict:
        nbytes = shape[0] * shape[-1] if len(shape) == 2 else shape[0]
        initial["tensor"] = {"dtype": "uint8", "shape": shape, "nbytes": nbytes, "lz4": True, "data": bomb}
        return initial
    frames = frames_of(mlp_trace)
    nth = [f[1]["name"] for f in frames if f[0] == INITIAL].index("x")
    path = write(build(crafted(frames, INITIAL, inflate, nth)))
    session = launch(path)
    started = time.monotonic()
    with pytest.raises(TraceError) as refused:
        session.tensor("x")
    assert time.monotonic() - started < 5
    message = str(refused.value)
    assert str(path) in message and re.search(r"initial frame at offset \d+", message)
    assert says in message
    assert_clear(message)
    assert all(size <= 2**20 for size in sizes), sizes


TENSOR_CASES = {
    "dtype naming a torch attribute": ({"dtype": "ops"}, "unknown dtype 'ops'"),
    "negative size": ({"shape": [-3, 8]}, "not an integer in"),
    "size that is not a number": ({"shape": ["3", 8]}, "not an integer in"),
    "declared bytes that are not the shape's": ({"nbytes": 95}, "95 bytes declared for shape [3, 8] of float32"),
    "bytes that are not bytes": ({"data": "abc"}, "its data are not bytes"),
    "lz4 flag that is not a flag": ({"lz4": "yes"}, "'lz4' is 'yes'"),
    "another shape than the program's": ({"shape": [8, 3]}, "shape [8, 3] for 'x', which the program says has "
                                                           "shape [3, 8]"),
    "compressed bytes that do not decompress": ({"data": b"\xff" * 40}, "do not decompress"),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_a_tensor_record_is_checked_field_by_field_when_read(mlp_trace, write, case):
    change, says = TENSOR_CASES[case]

    def alter(initial: dict) -> dict:
        initial["tensor"].update(change)
        return initial
    frames = frames_of(mlp_trace)
    nth = [f[1]["name"] for f in frames if f[0] == INITIAL].index("x")
    path = write(build(crafted(frames, INITIAL, alter, nth)))
    session = launch(path)
    with pytest.raises(TraceError) as refused:
        session.tensor("x")
    message = str(refused.value)
    assert str(path) in message and re.search(r"initial frame at offset \d+", message) and says in message
    assert_clear(message)


# -- 3. every field of every frame kind ------------------------------------------------------------------------
def _value(name: str, field: int, to: Any) -> Callable[[dict], dict]:
    def edit(program: dict) -> dict:
        next(v for v in program["values"] if v[0] == name)[field] = to
        return program
    return edit


def _node(name: str, key: str, to: Any) -> Callable[[dict], dict]:
    def edit(program: dict) -> dict:
        node_of(program, name)[key] = to
        return program
    return edit


def _deep(levels: int) -> Any:
    arg: Any = 1
    for _ in range(levels):
        arg = [arg]
    return arg


def _set(index: int, to: Any) -> Callable[[list], list]:
    def edit(row: list) -> list:
        row = list(row)
        row[index] = to
        return row
    return edit


FIELD_CASES: dict[str, tuple[int, Callable[[Any], Any], str]] = {
    "meta: units not a list": (META, lambda m: {**m, "units": "host"}, "'units' is 'host'"),
    "meta: a unit name that is a number": (META, lambda m: {**m, "units": [1]}, "a unit name is 1"),
    "meta: a location at a negative address": (
        META, lambda m: {**m, "initial_locations": {k: {**v, "address": -1} for k, v in
                                                    m["initial_locations"].items()}}, "'address' is -1"),
    "meta: a location whose shape is text": (
        META, lambda m: {**m, "initial_locations": {k: {**v, "shape": "big"} for k, v in
                                                    m["initial_locations"].items()}}, "shape 'big'"),
    "meta: not a map": (META, lambda m: [m], "it is not a map"),
    "program: a node writing an undeclared value": (PROGRAM, _node("relu", "outputs", ["ghost"]), "'ghost'"),
    "program: a node reading an undeclared value": (
        PROGRAM, _node("relu", "args", {"$tuple": [{"$ref": "ghost"}]}), "reads 'ghost'"),
    "program: a node reading a value made later": (
        PROGRAM, _node("relu", "args", {"$tuple": [{"$ref": "tanh"}]}), "reads 'tanh'"),
    "program: a negative size": (PROGRAM, _value("relu", 3, [3, -16]), "not an integer in"),
    "program: a producer past the last node": (PROGRAM, _value("relu", 4, 99), "producer node 99"),
    "program: an unknown value kind": (PROGRAM, _value("relu", 1, "secret"), "unknown kind 'secret'"),
    "program: a source line that is text": (PROGRAM, _node("relu", "loc", ["f.py", "x", "g"]),
                                            "malformed source location"),
    "program: a frame with no location": (PROGRAM, _node("relu", "frames", [[None, None, None]]), "malformed frame"),
    "program: a module stack of numbers": (PROGRAM, _node("relu", "module_stack", [[1]]), "malformed module stack"),
    "program: arguments nested a thousand deep": (PROGRAM, _node("relu", "args", {"$tuple": [_deep(1000)]}),
                                                  "nests deeper than"),
    "program: output indices of another length": (PROGRAM, _node("relu", "output_indices", [0, 1]),
                                                  "malformed output indices"),
    "program: an output that is not computed": (PROGRAM, lambda p: {**p, "outputs": ["x"]}, "program output 'x'"),
    "program: no nodes list": (PROGRAM, lambda p: {**p, "nodes": 5}, "not lists"),
    "step: a tick from the future": (STEP, _set(0, 7), "its tick is 7"),
    "step: a unit the chip lacks": (STEP, _set(1, 5), "its unit is 5"),
    "step: a node past the last": (STEP, _set(2, 99), "its node is 99"),
    "step: a node named by text": (STEP, _set(2, "linear"), "its node is 'linear'"),
    "step: a node out of the program's order": (STEP, _set(2, 1), "it runs node 1 where node 0 comes next"),
    "step: neither node nor edit": (STEP, _set(2, None), "must run a node or apply an edit"),
    "step: an edit of an unknown value": (
        STEP, lambda s: [s[0], s[1], None, {"value": "ghost", "offset": 0, "data": b"x"}], "writes 'ghost'"),
    "step: an edit past the value's end": (
        STEP, lambda s: [s[0], s[1], None, {"value": "x", "offset": 96, "data": b"abcd"}], "its edit's offset is 96"),
    "step: too short": (STEP, lambda s: s[:2], "not [tick, unit, node, edit]"),
    "write: thirteen fields": (WRITE, lambda r: r[:13], "not a write-log row of 14 fields"),
    "write: at another tick than its step": (WRITE, _set(0, 3), "not at the tick of the step before it"),
    "write: of a value its node does not write": (WRITE, _set(3, "x"), "which its step does not write"),
    "write: an unknown kind": (WRITE, _set(4, 9), "its kind is 9"),
    "write: a negative address": (WRITE, _set(6, -5), "its address is -5"),
    "write: a digest past 63 bits": (WRITE, _set(8, 2**64 - 1), "its digest is"),
    "write: a negative NaN count": (WRITE, _set(9, -1), "its NaN count is -1"),
    "write: a minimum that is text": (WRITE, _set(11, "low"), "its minimum is 'low'"),
    "write: another node than its step's": (WRITE, _set(2, 3), "not the node its step ran"),
    "version: of a tick not reached": (VERSION_FRAME, lambda v: {**v, "tick": 4}, "at tick 4"),
    "version: of an unknown value": (VERSION_FRAME, lambda v: {**v, "name": "ghost"}, "'ghost'"),
    "version: a tick that is text": (VERSION_FRAME, lambda v: {**v, "tick": "0"}, "malformed key"),
    "initial: of a value that is computed": (INITIAL, lambda v: {**v, "name": "relu"}, "'relu' is not an input"),
    "checkpoint: past the recording": (CHECKPOINT, _set(0, 99), "its tick is 99"),
    "checkpoint: pinning an unknown value": (CHECKPOINT, lambda c: [c[0], [["ghost", 0]]], "it pins ['ghost', 0]"),
    "checkpoint: pins that are not a list": (CHECKPOINT, lambda c: [c[0], 1], "not [tick, pins]"),
    "checkpoint: pinning a version never written": (CHECKPOINT, lambda c: [c[0], [["relu", 0]]],
                                                    "it pins ['relu', 0], not a version recorded before tick"),
}


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_a_crafted_field_of_any_frame_kind_is_refused_naming_the_file_frame_and_offset(mlp_trace, write, case):
    kind, edit, says = FIELD_CASES[case]
    frames = crafted(frames_of(mlp_trace), kind, edit, nth=-1 if kind == CHECKPOINT else 0)
    path = write(build(frames))
    with pytest.raises(TraceError) as refused:
        launch(path)
    message = str(refused.value)
    where = "index" if kind in (INITIAL, VERSION_FRAME) and "key" in says else KIND_NAMES[kind]
    assert str(path) in message and re.search(rf"{where} frame at offset \d+", message), message
    assert says in message, message
    assert_clear(message)


@pytest.mark.parametrize("tick, says", [(99, "it voids from tick 99"), ("1", "it voids from tick '1'")])
def test_a_truncate_frame_past_the_recording_is_refused(mlp_trace, write, tick, says):
    frames = frames_of(mlp_trace)
    first_step = next(i for i, f in enumerate(frames) if f[0] == STEP)
    frames.insert(first_step, [TRUNCATE, tick])
    path = write(build(frames))
    with pytest.raises(TraceError, match=rf"truncate frame at offset \d+: {re.escape(says)}") as refused:
        launch(path)
    assert str(path) in str(refused.value)


INDEX_CASES = {
    "an entry past the index": (lambda e: e[:-1] + [[e[-1][0], 10**9]], "outside the frames"),
    "an unknown kind": (lambda e: [[42, e[0][1]]] + e[1:], "malformed entry"),
    "a key that is a number": (lambda e: [x if x[0] != INITIAL else x[:2] + [7] for x in e], "malformed key"),
    "entries out of order": (lambda e: [e[1], e[0]] + e[2:], "outside the frames"),
    "another kind than the frame's": (lambda e: [[STEP, e[0][1]]] + e[1:], "the index says a step frame"),
    "not a list": (lambda e: {"entries": e}, "it is not a list"),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_a_crafted_index_is_refused_naming_the_file_and_offset(mlp_trace, write, case):
    edit, says = INDEX_CASES[case]
    path = write(build(frames_of(mlp_trace), index=edit))
    with pytest.raises(TraceError) as refused:
        launch(path)
    message = str(refused.value)
    assert str(path) in message and "offset" in message and says in message, message
    assert_clear(message)


def test_a_step_tried_again_replaces_its_first_try(mlp_trace, write):
    """A node that failed at the frontier leaves a step frame with no writes; its retry writes the step again."""
    frames = frames_of(mlp_trace)
    first_step = next(i for i, f in enumerate(frames) if f[0] == STEP)
    frames.insert(first_step, copy.deepcopy(frames[first_step]))
    session = launch(write(build(frames)))
    assert session.tl.frontier == session.end == 5
    session.goto(session.end)
    assert session.tensor("linear_2").shape == (3, 4)


# -- 4. damage: truncation, flips, splices ---------------------------------------------------------------------
def test_a_trace_cut_at_every_frame_boundary_opens_at_its_last_whole_step_or_is_refused(mlp_trace, write):
    marks = boundaries(mlp_trace)
    first_step = next(o for o, k in marks if k == "step")
    step_ends = [next(o2 for o2, k2 in marks[j + 1:] if k2 not in ("write", "version"))  # after its write, version
                 for j, (o, k) in enumerate(marks) if k == "step"]
    ends = []
    for offset, kind in marks[:-1]:
        path = write(mlp_trace[:offset], f"cut-{offset}.rwtrace")
        events: list = []
        if offset < first_step:  # before the program, or before every input and parameter was stored
            with pytest.raises(TraceError, match="no program frame|cut short") as refused:
                launch(path, events)
            assert str(path) in str(refused.value)
            continue
        session = launch(path, events)
        whole = sum(end <= offset for end in step_ends)
        assert session.tl.frontier == whole and session.end == 5, (offset, kind)
        notes = [e.text for e in events if e.kind == "output"]
        if whole < session.end:
            said = f"the recording ends at tick {whole} of 5: it was cut short"
            assert any(said in n for n in notes) and any(said in n for n in session.launch_notes), notes
        else:
            assert any("has no index (the recording did not finish)" in n for n in session.launch_notes)
        ends.append(whole)
        assert_refused_or_usable(path)
    assert ends[0] == 0 and ends[-1] == 5 and sorted(ends) == ends and len(set(ends)) == 6


def test_a_trace_cut_inside_a_step_opens_before_that_step(mlp_trace, write):
    """Between a step's frame and its write, or between its write and the value it stored."""
    marks = boundaries(mlp_trace)
    third_step = [o for o, k in marks if k == "step"][2]
    after = [o for o, k in marks if o > third_step][:2]  # its write frame, its version frame
    for cut in (third_step + 5, after[0], after[0] + 3, after[1], after[1] + 3):
        session = launch(write(mlp_trace[:cut], f"in-step-{cut}.rwtrace"))
        assert session.tl.frontier == 2, cut
        assert "the recording ends at tick 2 of 5: it was cut short" in " ".join(session.launch_notes)
        session.goto(2)
        assert session.tensor("relu").shape == (3, 16)
        with pytest.raises(RewindError, match="needs the device that recorded it") as missing:
            session.goto(3)
        assert_clear(str(missing.value))


def test_a_trace_cut_before_its_inputs_were_stored_is_refused(mlp_trace, write):
    initials = [o for o, k in boundaries(mlp_trace) if k == "initial"]
    path = write(mlp_trace[:initials[3] + 20])
    with pytest.raises(TraceError, match=r"cut short \(an incomplete frame at offset \d+\) before the initial values "
                                         r"of .* were stored: there is nothing to debug") as refused:
        launch(path)
    assert str(path) in str(refused.value)


def _damage(data: bytes, rng: random.Random) -> bytes:
    damaged = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        what = rng.choice(["flip", "cut", "splice", "zero"])
        at = rng.randrange(len(damaged))
        if what == "flip":
            damaged[at] ^= 1 << rng.randrange(8)
        elif what == "cut":
            damaged = damaged[:at]
        elif what == "splice":
            damaged[at:at] = rng.randbytes(rng.randint(1, 32))
        else:
            damaged[at:at + 8] = bytes(8)
        if not damaged:
            break
    return bytes(damaged)


def test_random_cuts_flips_and_splices_are_refused_or_open_usable(mlp_trace, write):
    rng = random.Random(20240611)
    opened = refused = 0
    for i in range(60):
        path = write(mlp_trace[:rng.randrange(len(mlp_trace))] if i < 30 else _damage(mlp_trace, rng),
                     f"damaged-{i}.rwtrace")
        if assert_refused_or_usable(path, forensics=i % 10 == 0) is None:
            refused += 1
        else:
            opened += 1
    assert opened > 5 and refused > 5  # both sides of the rule were exercised


def test_a_damaged_footer_falls_back_to_reading_every_frame(mlp_trace, write):
    broken = bytearray(mlp_trace)
    broken[-3] ^= 0xFF  # the footer's magic
    session = launch(write(bytes(broken)))
    assert session.tl.frontier == session.end == 5
    assert any("has a damaged footer: read every frame up to its index" in n for n in session.launch_notes)


_ODD_VALUES = [-1, 0, 1, 3, 2**31, 2**63 - 1, -2**63, 1e308, float("nan"), "", "x", "relu", "linear_2",
               "aten.linear.default", "float64", None, True, [], {}, [0], [-1, 2], {"$ref": "x"}, {"$tuple": []},
               b"\x00" * 8]


def _paths(obj: Any, at: tuple = ()) -> list[tuple]:
    """Every place inside a decoded payload: list indices and map keys down to the leaves."""
    out = [at]
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            out += _paths(item, at + (i,))
    elif isinstance(obj, dict):
        for key, item in obj.items():
            out += _paths(item, at + (key,))
    return out


def _replace(obj: Any, at: tuple, value: Any) -> Any:
    if not at:
        return value
    obj[at[0]] = _replace(obj[at[0]], at[1:], value)
    return obj


def test_random_field_values_with_correct_checksums_are_refused_or_open_usable(mlp_trace, write):
    """Damage a checksum cannot catch: one field of one frame set to an odd value, the file put back together
    whole. Tensor bytes are left alone (any bytes are a valid float tensor)."""
    rng = random.Random(611)
    frames = frames_of(mlp_trace)
    opened = 0
    for i in range(150):
        changed = copy.deepcopy(frames)
        frame = rng.choice(changed)
        places = [p for p in _paths(frame[1]) if "data" not in p]
        at = rng.choice(places)
        frame[1] = _replace(frame[1], at, copy.deepcopy(rng.choice(_ODD_VALUES)))
        opened += assert_refused_or_usable(write(build(changed), f"field-{i}.rwtrace"), forensics=i % 15 == 0) \
            is not None
    assert opened > 10


@pytest.fixture(scope="module")
def edited_trace(tmp_path_factory) -> bytes:
    """A saved trace of examples/kv_cache.py (buffers the graph writes) with a user's edit of a buffer at tick 4."""
    live = open_session(EXAMPLES / "kv_cache.py", budget_mb=1)
    live.goto(4)
    live.set_element("b_k_cache", (0, 0, 0), 1.5)
    live.run()
    path = tmp_path_factory.mktemp("kv") / "kv.rwtrace"
    live.save_trace(str(path))
    live.close()
    return path.read_bytes()


def test_a_trace_with_an_edit_and_buffer_writes_opens_at_its_last_whole_step_wherever_it_is_cut(edited_trace,
                                                                                                  write):
    whole = launch(write(edited_trace, "whole.rwtrace"))
    edit_tick = next(i for i, s in enumerate(whole.tl.schedule) if s.edit is not None)
    assert whole.tl.frontier == whole.end == 16 and edit_tick == 4
    ends = []
    for offset, _kind in boundaries(edited_trace)[:-1]:
        path = write(edited_trace[:offset], f"kv-{offset}.rwtrace")
        try:
            session = launch(path)
        except TraceError:
            assert offset < next(o for o, k in boundaries(edited_trace) if k == "step")  # inputs missing
            continue
        ran = session.tl.frontier
        assert [s.edit is not None for s in session.tl.schedule[:ran]] == [t == edit_tick for t in range(ran)]
        ends.append(ran)
        assert_refused_or_usable(path)
    assert sorted(ends) == ends and ends[0] == 0 and ends[-1] == 16 and len(set(ends)) == 17
