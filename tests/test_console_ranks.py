"""The console over many ranks (`rewind debug model.py --ranks N`), as gdb's `thread N`: `rank N` selects a rank whose
values, stack and ticks every command reads and whose steps the motions take, each stop selects the rank it is about,
the prompt names the selected rank, and `ranks` shows where each rank waits and with whom (docs/ranks.md, "The
console"). One console run on the pipeline example with 2 ranks, one on a model of one process."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch.nn import functional as F

from examples.pipeline_parallel import weights
from tests.conftest import EXAMPLES, line_of
from tests.dap.wire import rewind

pytestmark = pytest.mark.timeout(120)
PIPELINE = EXAMPLES / "pipeline_parallel.py"
RECV, SEND, LINEAR = (line_of(PIPELINE, text) for text in ("# RECV", "# SEND", "F.linear(h, self.weight)"))
IRECV = f"irecv #1 (float32[3,8] from rank 0) at pipeline_parallel.py:{RECV}"
SENDING = f"isend #1 (float32[3,8] to rank 1) at pipeline_parallel.py:{SEND}"
SCRIPT = f"""ranks
rank 1
next
ranks
next
next
next
print h.sum()
locals
rank 0
print h.sum()
goto pipeline_parallel.py:{LINEAR}
rank 1
break pipeline_parallel.py:{SEND}
continue
rank 9
rank x
rank 12345678901234567890
ranks now
quit
"""


def answers(stdout: str) -> dict[str, list[str]]:
    """What each command of a -x script answered, by its prompt and command (`(rewind rank 1) next`), in order."""
    said: dict[str, list[str]] = {}
    for chunk in re.split(r"^(?=\(rewind[^)]*\) )", stdout, flags=re.MULTILINE)[1:]:
        command, _, answer = chunk.partition("\n")
        said.setdefault(command, []).append(answer.rstrip("\n"))
    return said


def sum_printed(answer: str) -> float:
    """The number `print h.sum()` shows: `h.sum() = float32[] cpu = -0.403308`."""
    return float(answer.rpartition(" = ")[2])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    script = tmp_path_factory.mktemp("console") / "ranks.rewind"
    script.write_text(SCRIPT)
    done = rewind("debug", str(PIPELINE), "--ranks", "2", "-x", str(script))
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done, answers(done.stdout)


def test_rank_selects_the_rank_its_prompt_stack_and_steps_name_and_a_stop_selects_its_own(pipeline):
    _, said = pipeline
    selected = said["(rewind rank 0) rank 1"][0]
    assert selected.startswith("[rank 1, tick 0] zeros (aten.zeros)") and f"pipeline_parallel.py:{RECV}" in selected
    stop = said["(rewind rank 1) next"][0]  # the step is the selected rank's: its stop is about rank 1
    assert stop.startswith(f"[rank 1, tick 1] rank 1: waits before {IRECV}"), stop
    assert said["(rewind rank 1) rank 0"][0].startswith("[rank 0, tick ")
    hit = said["(rewind rank 1) continue"][0]  # only rank 0 sends: a stop about it selects it
    assert hit.startswith("[rank 0, tick ") and "rank 0: breakpoint" in hit and "(rewind rank 0) rank 9" in said, hit


def test_ranks_shows_rank_1_waiting_at_its_irecv_from_rank_0(pipeline):
    _, said = pipeline
    header, *at_entry = said["(rewind rank 0) ranks"][0].splitlines()
    assert header.split() == ["rank", "tick", "ran", "at", "with"]
    assert rows(at_entry) == {0: ["*", "0", "0 of 3", f"runs on to {SENDING}", "rank 1's irecv #1"],
                              1: ["", "0", "0 of 3", f"runs on to {IRECV}", "rank 0's isend #1"]}
    waiting = rows(said["(rewind rank 1) ranks"][0].splitlines()[1:])  # after `rank 1` and a step of it
    assert waiting[1] == ["*", "1", "0 of 3", f"waits before {IRECV}", "rank 0's isend #1"], waiting
    assert waiting[0] == ["", "1", "0 of 3", f"runs on to {SENDING}", "rank 1's irecv #1"], waiting


def rows(lines: list[str]) -> dict[int, list[str]]:
    """`ranks`'s rows by rank: the selection's mark, then the tick, ran, at and with cells."""
    cells = [(line[:1].strip(), re.split(r"\s{2,}", line[1:].strip())) for line in lines]
    return {int(c[0]): [mark, *c[1:]] for mark, c in cells}


def test_print_and_locals_read_the_selected_ranks_values(pipeline):
    _, said = pipeline
    (w0, w1), batches = weights(2)
    stage_1 = torch.tanh(F.linear(torch.tanh(F.linear(batches[0], w0)), w1))  # rank 1's h: its stage on rank 0's
    on_rank_1, on_rank_0 = said["(rewind rank 1) print h.sum()"][0], said["(rewind rank 0) print h.sum()"][0]
    assert sum_printed(on_rank_1) == pytest.approx(stage_1.sum().item(), abs=1e-4), on_rank_1
    assert sum_printed(on_rank_0) != pytest.approx(sum_printed(on_rank_1), abs=1e-4), on_rank_0
    locals_1 = said["(rewind rank 1) locals"][0]
    assert f"mean={stage_1.mean().item():.6g}" in locals_1.split("h = ")[1], locals_1


def test_hostile_rank_commands_are_refused_in_words_and_the_console_goes_on(pipeline):
    done, said = pipeline
    assert said["(rewind rank 0) rank 9"] == ["error: no rank 9: this session has ranks 0..1"]
    assert said["(rewind rank 0) rank x"] == ["error: usage: rank N, N a rank of 0..1 (got 'x')"]
    assert said["(rewind rank 0) rank 12345678901234567890"] == [
        "error: usage: rank N, N a rank of 0..1 (got a number of 20 digits, more than any run has)"]
    assert said["(rewind rank 0) ranks now"][0].startswith("error: usage: ranks, with no arguments (got 'now'")
    goto = said[f"(rewind rank 0) goto pipeline_parallel.py:{LINEAR}"][0]  # the last stop was rank 1's
    assert goto.startswith("[rank 0, tick 1] rank 0 at tick 1 ("), goto  # rank 0's first linear, by its own ticks
    assert "(rewind rank 0) quit" in said and done.returncode == 1  # the refused commands count as failures


def test_rank_and_ranks_in_a_session_of_one_process_say_it_runs_one():
    done = rewind("debug", str(EXAMPLES / "mlp.py"), "--json", stdin="rank\nrank 1\nranks\nwhere\nquit\n")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert "rank" not in records[0]["result"] and records[0]["result"]["tick"] == 0  # a stop as before
    refused = {r["command"]: r.get("error", "") for r in records[1:4]}
    assert list(refused) == ["rank", "rank 1", "ranks"], records
    assert all(error.startswith("this session runs one process") for error in refused.values()), refused
    assert records[4]["ok"] and records[4]["result"]["selected"] == 0
