"""The triton driver in process: planted kernels localized to their lines by forensics, their fixed twins clean,
the race and bounds checks firing only on their planted kernels, fixes validated over the coverage suite, a
wrapper refused, and stepping back through a launch bit-exact against a fresh run."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from hardware.drivers.triton import KernelLaunch, TritonDriver, open_kernel
from hardware.drivers.triton.commands import forensics, validate
from hardware.drivers.triton.forensics import tolerance
from hardware.drivers.triton.launch import interpreter_refuses
from hardware.session import LaunchOptions, LineSpec, Session
from hardware.ticks import Direction

# Triton is the kernels extra; the driver imports it (after choosing its interpreter), never this module.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the kernels extra (triton)")

KERNELS = Path(__file__).resolve().parent / "models" / "kernels"


def line_of(file: str, text: str) -> int:
    return next(i for i, line in enumerate((KERNELS / file).read_text().splitlines(), 1) if text in line)


PLANTED = [  # file, the pattern forensics names first, the line it names
    ("softmax_padded.py", "padding counted", "other=0.0"),
    ("matmul_tail.py", "tail dropped", "a = tl.load"),
    ("layernorm_stride.py", "stride off by one", "row * (stride - 1)"),
    ("sum_race.py", "race", "total = tl.load"),
    ("scale_oob.py", "out of bounds", "x = tl.load"),
    ("softmax_wrapper.py", "wrapper-assisted", "done = torch.softmax"),
]
FIXED = ["softmax_fixed.py", "matmul_fixed.py", "layernorm_fixed.py", "sum_atomic.py", "scale_fixed.py"]


@pytest.mark.parametrize("file,kind,text", PLANTED)
def test_a_planted_kernel_is_localized_to_its_line(file, kind, text):
    report = forensics(str(KERNELS / file))
    assert not report.clean
    assert report.patterns[0].kind == kind
    assert report.line == line_of(file, text)


@pytest.mark.parametrize("file", FIXED)
def test_a_fixed_twin_matches_its_reference_and_no_check_fires(file):
    report = forensics(str(KERNELS / file))
    assert report.checked and report.clean, report.to_dict()


def test_the_race_check_names_both_programs_and_stays_quiet_with_atomics():
    _, racing = open_kernel(KERNELS / "sum_race.py")
    races = [f for f in racing.record.log.findings if f.kind == "race"]
    assert races and races[0].other[0] != races[0].unit
    assert "program (0, 0, 0)" in races[0].message and "program (1, 0, 0)" in races[0].message
    _, atomic = open_kernel(KERNELS / "sum_atomic.py")
    assert [f for f in atomic.record.log.findings if f.kind == "race"] == []


def test_the_bounds_check_fires_on_the_unmasked_load_only():
    _, planted = open_kernel(KERNELS / "scale_oob.py")
    found = [f for f in planted.record.log.findings if f.kind == "out of bounds"]
    assert [(f.unit, f.line) for f in found] == [(4, line_of("scale_oob.py", "x = tl.load"))]
    assert "28 lane(s)" in found[0].message
    _, fixed = open_kernel(KERNELS / "scale_fixed.py")
    assert fixed.record.log.findings == []


def test_the_wrong_stores_are_the_programs_after_the_first_row():
    report = forensics(str(KERNELS / "layernorm_stride.py"))
    assert report.first["program"] == "program (1, 0, 0)" and report.first["elements"][0] == 24
    assert report.wrong["out_ptr"]["count"] == 5 * 24


@pytest.mark.parametrize("fixed,planted", [("softmax_fixed.py", "softmax_padded.py"),
                                           ("matmul_fixed.py", "matmul_tail.py")])
def test_a_fix_is_validated_over_the_coverage_suite_where_the_original_fails(fixed, planted):
    report = validate(str(KERNELS / fixed), str(KERNELS / planted))
    assert report["verdict"] == "validated", report
    assert report["casesRun"] > 10 and report["originalFails"] > 0
    assert any(case["sizes"] for case in report["cases"]) and any(case["scale"] != 1 for case in report["cases"])


def test_a_planted_kernel_offered_as_a_fix_is_rejected():
    report = validate(str(KERNELS / "softmax_padded.py"), str(KERNELS / "softmax_padded.py"))
    assert report["verdict"] == "rejected"


def test_a_wrapper_that_computes_the_answer_outside_the_kernel_is_refused():
    report = validate(str(KERNELS / "softmax_wrapper.py"), str(KERNELS / "softmax_padded.py"))
    assert report["verdict"] == "refused" and "_softmax" in report["reason"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_interpreter_computes_in_a_dtype_exactly_when_its_dtype_case_is_run(dtype):
    """A dtype case not run must be one the interpreter would get wrong: the scale kernel, cast, against x * 2.5."""
    launch = KernelLaunch.from_file(KERNELS / "scale_fixed.py")
    assert launch.cast_inputs(dtype) == 2
    driver = TritonDriver(launch)
    driver.first_run()
    want = launch.arguments[0].value.double() * 2.5
    rtol, atol = tolerance(dtype)
    close = torch.allclose(driver.tensor_at_end("out_ptr").double(), want, rtol=rtol, atol=atol)
    assert (interpreter_refuses(dtype) is None) == close


def _tensors(driver) -> list[bytes]:
    return [t.tensor.view(-1).numpy().tobytes() for t in driver.memory.tensors]


def test_stepping_back_through_a_launch_is_bit_exact_against_a_fresh_run():
    file = str(KERNELS / "layernorm_fixed.py")
    session = Session()
    session.launch(LaunchOptions(program=file, entry="kernel", stop_on_entry=True))
    session.motion.start()
    forward = []
    for _ in range(120):  # across program boundaries: a program runs about 50 operations
        session.motion.step(Direction.FORWARD, "instruction")
        state = session.instructions.cursor.chip()
        forward.append((state.step, _tensors(session.timeline.driver)))
    for step, seen in reversed(forward[:-1]):
        session.motion.step(Direction.REVERSE, "instruction")
        state = session.instructions.cursor.chip()
        assert state.step == step and _tensors(session.timeline.driver) == seen
    session.close()
    program, fresh = open_kernel(file)  # `out` starts as torch.empty left it: compare what the launch wrote
    node = program.nodes[0]
    args = tuple(program.initial[r.name] for r in node.args)
    out = next(i for i, t in enumerate(fresh.memory.tensors) if t.param == "out_ptr")
    for step, seen in forward[::17]:
        fresh.chip_at(node, args, {}, step)
        stored = np.zeros(fresh.memory.tensors[out].tensor.numel(), bool)
        for acc in fresh.record.log.accesses:
            if acc.kind == "store" and acc.step < step:
                stored[acc.elements] = True
        now = _tensors(fresh)
        assert now[:out] == seen[:out]
        want = np.frombuffer(seen[out], np.float32)[stored]
        assert np.frombuffer(now[out], np.float32)[stored].tobytes() == want.tobytes()
    assert stored.sum() >= 2 * 24  # the steps compared reach into the third program: two rows stored


def test_a_kernel_line_breakpoint_stops_each_program_there_with_a_condition_on_its_values():
    file = str(KERNELS / "softmax_fixed.py")
    session = Session()
    session.launch(LaunchOptions(program=file, entry="kernel", stop_on_entry=True))
    session.motion.start()
    line = line_of("softmax_fixed.py", "num = tl.exp")
    [bp] = session.set_line_breakpoints(file, [LineSpec(line)])
    assert bp.verified and bp.line == line
    units = []
    for _ in range(4):
        stop = session.motion.run(Direction.FORWARD)
        assert stop.reason == "breakpoint"
        units.append(stop.unit)
        frame = session.frames(unit=stop.unit)[0]
        assert frame.line == line and frame.file == file
    assert units == [1, 2, 3, 4]
    assert session.motion.run(Direction.REVERSE).unit == 3  # reverse-continue, across programs
    [bp] = session.set_line_breakpoints(file, [LineSpec(line, condition="row == 2")])
    session.motion.restart()
    stop = session.motion.run(Direction.FORWARD)
    assert stop.reason == "breakpoint" and stop.unit == 3
    [missing] = session.set_line_breakpoints(file, [LineSpec(line_of("softmax_fixed.py", "def kernel(") + 3)])
    assert not missing.verified and "no operation of the kernel" in missing.message
    session.close()


def test_a_kernel_runs_interpreted_when_triton_was_imported_compiled_first():
    import subprocess
    import sys
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None); import triton.language\n"
            "from hardware.drivers.triton.commands import forensics\n"
            f"print(forensics({str(KERNELS / 'softmax_padded.py')!r}).headline())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "line 14 (padding counted)" in done.stdout


def test_a_data_breakpoint_on_an_element_stops_after_the_store_that_writes_it_in_both_directions():
    file = str(KERNELS / "layernorm_fixed.py")
    session = Session()
    session.launch(LaunchOptions(program=file, entry="kernel", stop_on_entry=True))
    session.motion.start()
    from hardware.session import DataSpec
    [bp, whole] = session.set_data_breakpoints([DataSpec("out_ptr[25]"), DataSpec("out_ptr", hit_condition="3")])
    assert bp.verified and whole.verified
    stop = session.motion.run(Direction.FORWARD)
    assert stop.reason == "data breakpoint" and stop.breakpoint_ids == [bp.id]
    assert stop.unit == 2 and "program (1, 0, 0) writes out_ptr[25]" in stop.description
    written = stop.instruction
    schedule = session.instructions.cursor.schedule(0)
    store = session.timeline.driver.disassemble(0, 2)[int(schedule.pcs[written - 1])]
    assert store.text.startswith("store") and store.line == line_of("layernorm_fixed.py", "tl.store(out_ptr")
    stop = session.motion.run(Direction.FORWARD)
    assert stop.breakpoint_ids == [whole.id] and stop.unit == 3  # the third store into out_ptr: program (2, 0, 0)
    back = session.motion.run(Direction.REVERSE)
    assert back.breakpoint_ids == [bp.id] and back.instruction == written
    [gone] = session.set_data_breakpoints([DataSpec("nothing_here")])
    assert not gone.verified
    session.close()


def test_a_read_of_an_element_no_program_writes_is_named_at_its_line():
    _, planted = open_kernel(KERNELS / "carry_unwritten.py")
    found = [f for f in planted.record.log.findings if f.kind == "unwritten read"]
    assert [f.unit for f in found] == [1, 2, 3]
    assert {f.line for f in found} == {line_of("carry_unwritten.py", "carry = tl.load")}
    assert found[0].elements == (40,) and "no program of the launch writes" in found[0].message
    for fixed in FIXED:  # in-place accumulators and outputs read after their own stores stay quiet
        _, clean = open_kernel(KERNELS / fixed)
        assert [f for f in clean.record.log.findings if f.kind == "unwritten read"] == []


def test_a_single_thread_step_interleaves_a_program_and_the_race_found_follows_the_new_order():
    session = Session()
    session.launch(LaunchOptions(program=str(KERNELS / "sum_race.py"), entry="kernel", stop_on_entry=True))
    session.motion.start()
    for _ in range(3):
        session.motion.step(Direction.FORWARD, "instruction")
    for _ in range(6):  # program (2, 0, 0) alone, while program (0, 0, 0) is half-way
        stop = session.motion.step(Direction.FORWARD, "instruction", unit=3, single_thread=True)
    assert stop.unit == 3 and session.instructions.cursor.schedule(0).units[:9].tolist() == [1, 1, 1] + [3] * 6
    states = {u.unit: u for u in session.unit_states()}
    assert states[1].pc == 3 and states[3].pc == 6 and states[2].pc == 0
    session.set_exception_filters(["race"])
    stop = session.motion.run(Direction.FORWARD)
    assert stop.reason == "exception" and stop.description.startswith("race on 'total_ptr[0]'")
    assert "program (2, 0, 0) `store` at line 16" in stop.description  # its store came first now
    session.close()


@pytest.mark.parametrize("text,words", [
    ("def build():\n    return 1\n", "defines no 'kernel'"),
    ("def kernel():\n    raise ValueError('no sizes here')\n", "no sizes here (at bad_kernel.py:2)"),
    ("def kernel():\n    return (print, (1,), ())\n", "must return a @triton.jit function first"),
    ("import triton\nimport triton.language as tl\n@triton.jit\ndef k(x_ptr):\n    tl.store(x_ptr + 1 // 0, 1.0)\n"
     "import torch\ndef kernel():\n    return k, (1,), (torch.zeros(2),)\n", "program (0, 0, 0) of k failed"),
    ("import torch, triton\n@triton.jit\ndef k(x_ptr):\n    pass\ndef kernel():\n    return k, (0,), (torch.zeros(2),)\n",
     "grid of k must be 1 to 3 positive whole numbers"),
    ("import torch, triton\nimport triton.language as tl\n@triton.jit\ndef k(x_ptr):\n"
     "    tl.store(x_ptr + tl.arange(0, 4), tl.sum(tl.load(x_ptr + tl.arange(0, 4)), axis=3))\n"
     "def kernel():\n    return k, (1,), (torch.zeros(4),)\n", "axis 3 out of bounds for shape ['constexpr[4]'] (at bad_kernel.py:5)"),
])
def test_a_kernel_file_that_cannot_run_is_said_in_words(tmp_path, text, words):
    from hardware.errors import RewindError
    path = tmp_path / "bad_kernel.py"
    path.write_text(text)
    with pytest.raises(RewindError) as caught:
        open_kernel(path)
    assert words in str(caught.value)
    assert "Traceback" not in str(caught.value) and "Error(" not in str(caught.value)


def test_launching_a_kernel_file_imports_nothing_of_torch_dynamo():
    """Watching the ops kernel() runs takes a dispatch mode that compiles nothing: its first op must not import
    torch._dynamo (3 s, most of a kernel file's launch)."""
    import subprocess
    import sys
    code = ("import sys\nfrom hardware.session import LaunchOptions, Session\n"
            f"Session(None).launch(LaunchOptions({str(KERNELS / 'scale_oob.py')!r}, entry='kernel', driver='auto'))\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
