"""Numbers the console reads, and `goto FILE:LINE` on the selected rank, in one console run (`rewind debug
examples/pipeline_parallel.py --ranks 2 --json`): `rank 1` then `goto FILE:LINE N` goes to the N-th time the line
runs on rank 1, though the last stop was about rank 0; and every number a command reads (a frame, a count, a step,
a tick, a line, a rank, an option's value, an edit's index) goes through one checked parser, so a number of 5000
digits (past Python's int() limit of 4300) or a digit of another script is refused in words, and the console goes
on."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES, line_of
from tests.dap.wire import rewind

pytestmark = pytest.mark.timeout(120)
PIPELINE = EXAMPLES / "pipeline_parallel.py"
RECV = line_of(PIPELINE, "# RECV")
HUGE = "7" * 5000
TOO_BIG = "(got a number of 5000 digits, more than any run has)"
REFUSED = {  # command -> the start of its error
    f"frame {HUGE}": "usage: frame N, a frame number that `where` shows",
    f"up {HUGE}": "usage: up [N], N a number of frames of 1 or more",
    f"down {HUGE}": "usage: down [N], N a number of frames of 1 or more",
    f"goto step {HUGE}": "usage: goto step N, N a training step from 0",
    f"goto pipeline_parallel.py:{RECV} {HUGE}": "usage: goto FILE:LINE [N], N from 1",
    f"goto pipeline_parallel.py:{HUGE}": f"'pipeline_parallel.py:{HUGE[:39]}' is not FILE:LINE, LINE a line number",
    f"break pipeline_parallel.py:{HUGE}": f"'pipeline_parallel.py:{HUGE[:39]}' is not FILE:LINE, LINE a line number",
    f"restore {HUGE}": "usage: restore TICK (see: checkpoints)",
    f"rank {HUGE}": "usage: rank N, N a rank of 0..1",
    f"diff h {HUGE} 0": "usage: diff NAME TICK1 TICK2 (NAME: a variable, $value or an expression; ticks: whole "
                        "numbers)",
    f"timeline --from {HUGE}": "--from takes a whole number, 0 or more",
    f"patch edit h[0,{HUGE}] 1": "patch edit VALUE[I,J,...] NUMBER takes whole numbers in [I,J,...]",
    f"patch edit h[0] 1 --from-step {HUGE}": "--from-step takes one step number (0 is the first step), once",
}
OTHER_SCRIPTS = {  # digits int() would take, or choke on, that are no number a user types here
    "frame \u00b2": "usage: frame N, a frame number that `where` shows (got '\u00b2')",
    "goto step \u0663": "usage: goto step N, N a training step from 0 (got '\u0663')",
    f"goto pipeline_parallel.py:{RECV} 0": "usage: goto FILE:LINE [N], N from 1 (got '0')",
    "up 0": "usage: up [N], N a number of frames of 1 or more (got '0')",
}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    script = tmp_path_factory.mktemp("numbers") / "numbers.rewind"
    commands = ["rank 1", f"goto pipeline_parallel.py:{RECV} 2", *REFUSED, *OTHER_SCRIPTS, "where", "quit"]
    script.write_text("\n".join(commands) + "\n", encoding="utf-8")
    done = rewind("debug", str(PIPELINE), "--ranks", "2", "--json", "-x", str(script))
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 1  # the refused commands count as failures
    return [json.loads(line) for line in done.stdout.splitlines()]


def _by_command(records: list[dict]) -> dict[str, dict]:
    return {r["command"]: r for r in records[1:]}  # record 0 is the launch's stop


def test_goto_file_line_goes_to_the_line_on_the_selected_rank_though_the_last_stop_was_another_ranks(records):
    said = _by_command(records)
    assert records[0]["result"]["rank"] == 0  # the entry's stop is about rank 0
    assert said["rank 1"]["result"]["rank"] == 1
    stop = said[f"goto pipeline_parallel.py:{RECV} 2"]
    assert stop["ok"], stop
    assert (stop["result"]["rank"], stop["result"]["frame"]["line"]) == (1, RECV), stop  # its second irecv
    assert stop["result"]["description"].startswith("rank 1 at tick 5 "), stop  # its first one was at tick 0


def test_a_number_of_5000_digits_is_refused_in_words_by_every_command_and_the_console_goes_on(records):
    said = _by_command(records)
    for command, words in REFUSED.items():
        assert said[command]["error"] == f"{words} {TOO_BIG}", (command[:60], said[command]["error"][:300])
    for command, error in OTHER_SCRIPTS.items():
        assert said[command]["error"] == error, said[command]
    where = said["where"]  # after every refusal, the session is where the goto left it
    assert where["ok"] and where["result"]["frames"][0]["line"] == RECV, where
    assert list(said)[-1] == "where" and len(records) == 2 + len(REFUSED) + len(OTHER_SCRIPTS) + 2
