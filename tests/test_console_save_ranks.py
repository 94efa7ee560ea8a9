"""The console's `save FILE` with ranks (`rewind debug examples/pipeline_parallel.py --ranks 2`): FILE is the index of
the ranks' traces, each rank's saved beside it (docs/ranks.md, "A step, a checkpoint, a saved trace"). It says what it
wrote, the index's file and size and each rank's file, size and ticks (the command's JSON is saveTrace's answer), and a
file that exists is kept and named as the server names it, a rank's trace beside FILE as well as FILE itself: in the
refusal from a script and in the question at a terminal. One console, on a real server with real ranks: a -x script
first, then `save` where a function stands in for the user answering at the terminal (as in
tests/dap/test_save_safety.py)."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dap_server.client import DapClient
from dap_server.console import Console
from tests.conftest import EXAMPLES
from tests.test_console_ranks import answers

pytestmark = pytest.mark.timeout(120)
PIPELINE = EXAMPLES / "pipeline_parallel.py"
OLD = b"the user's own file, not a trace\n" * 8
FOLDER = "runs: it exists; send overwrite"  # the server's words in a folder's name: the named file is still all of it


@dataclass
class Scripted:
    console: Console
    folder: Path
    saved: Path  # the index the script saved
    refused: Path  # the index whose rank 1 trace was a file of the user's
    said: dict[str, list[str]]  # the script's answers (tests/test_console_ranks.answers)


def rank_file(index: Path, rank: int) -> Path:
    return index.with_name(f"{index.stem}.rank{rank}{index.suffix}")


def planted(index: Path, rank: int) -> Path:
    """A file of the user's where the save of `index` would put rank `rank`'s trace."""
    mine = rank_file(index, rank)
    mine.write_bytes(OLD)
    return mine


@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> Scripted:
    """The console as `rewind debug --ranks 2 -x FILE` runs it: rank 1 steps three times (the ranks end at different
    ticks), saves, then saves onto a name whose rank 1 trace is a file of the user's."""
    root = tmp_path_factory.mktemp("save_ranks")
    folder = root / FOLDER
    folder.mkdir()
    saved, refused = folder / "run.rwtrace", folder / "kept.rwtrace"
    planted(refused, 1)
    script = root / "save.rewind"
    script.write_text("\n".join(["rank 1", "next", "next", "next", f"save {saved}", f"save {refused}", "rank 0",
                                 "quit"]) + "\n", encoding="utf-8")
    out = io.StringIO()
    console = Console(DapClient.spawn(), out)
    try:
        console.start({"program": str(PIPELINE), "ranks": 2}, "torch:cpu", "build")
        console.run_script(str(script))  # what -x runs
        yield Scripted(console, folder, saved, refused, answers(out.getvalue()))
    finally:
        console.client.request("disconnect", {"terminateDebuggee": True}, timeout=20)
        console.client.close()


def stop_ticks(run: Scripted) -> dict[int, int]:
    """Each rank's tick at the script's last stop: `(rank 0 at tick 4, rank 1 at tick 3)`."""
    stop = run.said["(rewind rank 1) next"][-1]
    return {int(r): int(t) for r, t in re.findall(r"rank (\d) at tick (\d+)", stop)}


def test_save_with_ranks_says_the_index_and_each_ranks_file_bytes_and_ticks(scripted):
    ticks, index = stop_ticks(scripted), scripted.saved
    assert sorted(ticks) == [0, 1] and ticks[0] != ticks[1]  # each rank's own ticks are said, not one for all
    assert scripted.said[f"(rewind rank 1) save {index}"] == ["\n".join(
        [f"saved the index of 2 ranks' traces to {index} ({index.stat().st_size} bytes)",
         *(f"  rank {r}: {ticks[r]} ticks to {rank_file(index, r)} ({rank_file(index, r).stat().st_size} bytes)"
           for r in (0, 1))])]
    assert "(rewind rank 0) quit" in scripted.said  # the console went on to the end


def test_a_ranks_trace_that_exists_is_the_file_named_and_kept_from_a_script(scripted):
    refused = scripted.refused
    mine = rank_file(refused, 1)
    assert scripted.said[f"(rewind rank 1) save {refused}"] == [
        f"error: {mine} exists and is kept; `save {refused} --overwrite` replaces it"]
    assert scripted.console.failures == 1  # the refused save, which `rewind debug` exits 1 for
    assert mine.read_bytes() == OLD
    assert not refused.exists() and not rank_file(refused, 0).exists()  # nothing of the set was written


def test_at_a_terminal_the_question_names_the_ranks_trace_and_the_answer_decides(scripted):
    console, index = scripted.console, scripted.folder / "asked.rwtrace"
    mine = planted(index, 0)
    questions: list[str] = []
    console.ask = lambda question: questions.append(question) or False
    kept = console.cmd_save(str(index))
    assert questions == [f"{mine} exists: replace it? [y/N] "]
    assert (kept.text, kept.data) == (f"not saved: {mine} is kept", {"saved": False, "path": str(mine)})
    assert mine.read_bytes() == OLD and not index.exists()
    console.ask = lambda question: questions.append(question) or True
    answer = json.loads(json.dumps(console.cmd_save(str(index)).data))  # as --json prints it
    assert len(questions) == 2 and mine.read_bytes() != OLD
    assert answer["path"] == str(index) and answer["bytes"] == index.stat().st_size
    ticks = stop_ticks(scripted)
    assert [{k: r[k] for k in ("rank", "path", "bytes", "ticks")} for r in answer["ranks"]] == [
        {"rank": r, "path": str(rank_file(index, r)), "bytes": rank_file(index, r).stat().st_size, "ticks": ticks[r]}
        for r in (0, 1)]
    assert all(r["rawBytes"] > 0 for r in answer["ranks"])
