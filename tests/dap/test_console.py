"""`rewind debug`, the console client: the README's demo script, and --json for agents."""

import json
import re

from tests.dap.wire import GPT, ROOT, line_of, rewind

DEMO = ROOT / "examples" / "demo.rewind"
MASK = line_of("mask = torch.ones")  # where attention builds its causal mask
SCORES = line_of("scores = q @ k")


def test_demo_script_hits_a_breakpoint_steps_back_reverse_continues_finds_the_writer_and_experiments():
    # the demo stops "where attention builds its causal mask": its breakpoint must be that line of gpt.py
    (demo_line,) = re.findall(r"^break gpt\.py:(\d+)$", DEMO.read_text(), re.MULTILINE)
    assert int(demo_line) == MASK
    run = rewind("debug", str(GPT), "-x", str(DEMO))
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert f"(rewind) break gpt.py:{MASK}\nbreakpoint 1 at gpt.py:{MASK}\n" in out
    assert f"[tick 15] breakpoint 1 at gpt.py:{MASK}: ones (aten.ones) [blocks.0.attn]" in out
    back = out.split("(rewind) back\n")[1]
    assert back.startswith("[tick 12] step: transpose_3") and f"gpt.py:{SCORES}  scores = q @ k" in back
    after_rc = out.split("(rewind) rc\n")[1]
    assert after_rc.startswith("[tick 15] breakpoint 1")  # the last hit before tick 43, in blocks.0
    assert "scores (div): float32[1, 4, 16, 16] in host of cpu at 0x" in out
    assert f"scores (div) was written by aten.div.Tensor ('div') at gpt.py:{SCORES} at tick 14" in out
    assert "tick 0: 0 values, 0 bytes (host)" in out
    patched = out.split("(rewind) patch precision softmax float64\n")[1]
    assert patched.startswith("added patch 'softmax-float64' to branch 'experiment' (installed)\n")
    assert f"softmax-float64: softmax (tick 19, gpt.py:{line_of('torch.softmax(scores')}) run at float64" in patched
    measured = out.split("(rewind) measure --outputs\n")[1].splitlines()
    assert measured[0] == "branch experiment, patched from tick 19 (errors in units of tolerance)"
    assert measured[1].split() == ["output", "vs", "reference", "original", "vs", "reference", "vs", "original"]
    assert measured[2].startswith("  linear_8  within (")
    assert "the recorded pass is back (original installed)\n* original" in out.split("(rewind) undo\n")[1]


def test_json_mode_prints_one_object_per_command_and_reports_errors():
    script = f"break gpt.py:{MASK}\ncontinue\nprint scores.shape\nprint __import__('os')\nlocate nothing\nbogus\nquit\n"
    run = rewind("debug", str(GPT), "--json", stdin=script)
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["command"] for r in records] == [f"launch {GPT}", f"break gpt.py:{MASK}", "continue",
                                               "print scores.shape", "print __import__('os')", "locate nothing",
                                               "bogus"]
    assert records[2]["result"]["tick"] == 15 and records[2]["result"]["breakpoints"] == [1]
    assert records[3]["result"]["result"] == "torch.Size([1, 4, 16, 16])"
    assert [r["ok"] for r in records[4:]] == [False, False, False]
    assert "not allowed" in records[4]["error"] and "unknown command 'bogus'" in records[6]["error"]
    assert run.returncode == 1  # a command failed


def test_console_refuses_a_program_and_a_trace_together_and_a_missing_program():
    assert rewind("debug", str(GPT), "--trace", "x.rwtrace").returncode == 2
    assert rewind("debug").returncode == 2
    run = rewind("debug", "no_such_model.py", stdin="quit\n")
    assert run.returncode == 1 and "program file not found" in run.stderr


def test_console_saves_a_trace_and_debugs_it_without_the_device(tmp_path):
    path = tmp_path / "session.rwtrace"
    saved = rewind("debug", str(GPT), "--json", stdin=f"break gpt.py:{MASK}\ncontinue\ncontinue\nsave {path}\nquit\n")
    records = [json.loads(line) for line in saved.stdout.splitlines()]
    assert saved.returncode == 0 and records[-1]["result"]["path"] == str(path)
    opened = rewind("debug", "--trace", str(path), "--json",
                    stdin=f"break gpt.py:{MASK}\ncontinue\ncontinue\nprint scores.shape\nrc\nprov div\nquit\n")
    records = [json.loads(line) for line in opened.stdout.splitlines()]
    assert opened.returncode == 0, opened.stderr
    assert records[0]["command"] == f"launch {path}"
    first, second = records[2]["result"]["tick"], records[3]["result"]["tick"]
    assert first == 15 and second > first  # blocks.0's hit, then blocks.1's
    assert records[4]["result"]["result"] == "torch.Size([1, 4, 16, 16])"
    assert records[5]["result"]["tick"] == 15  # reverse-continue, from the trace alone
    assert records[6]["result"]["lastWriter"]["node"] == "div"
