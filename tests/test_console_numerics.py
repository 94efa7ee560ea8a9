"""An agent's numerics loop in one console (`rewind debug --json`): the reference table, the first divergence,
ablation, a name's reference value, the timeline's events, a name's writes, a value at two ticks, a histogram and
`find`, each once in one session on the planted softmax overflow; then every mistake an agent can make with them,
answered in words while the console goes on; `$name`; and `help --json` made from the one command registry."""

from __future__ import annotations

import io
import json
import re

import pytest

from dap_server.console import Console
from dap_server.console_numerics import describe_histogram, describe_history, describe_reference_table, \
    describe_timeline
from tests.conftest import MODELS, line_of, program
from tests.dap.wire import rewind
from tests.test_expressions_hostile import EXCEPTION_NAMES

SOFTMAX = MODELS / "forensics" / "softmax_overflow.py"
NODES = program(str(SOFTMAX)).nodes  # the torch driver runs node i at tick i
TICK = {node.name: i for i, node in enumerate(NODES)}
DIV_LINE = line_of(SOFTMAX, "weights / weights.sum")
DIV_LINE_TICK = min(i for i, node in enumerate(NODES) if node.loc and node.loc.line == DIV_LINE)
EXP_DONE, DIV_DONE = TICK["exp"] + 1, TICK["div"] + 1  # positions right after exp and div ran
NUMERICS = {"compare", "first-divergence", "ablate", "reference", "timeline", "history", "diff", "hist", "find"}

HAPPY = f"""break softmax_overflow.py:{DIV_LINE} if $exp.isinf().any()
reference $matmul
compare
compare --from {TICK['exp']} --count 1
first-divergence
ablate exp
ablate --search
timeline
timeline --from {TICK['div']} --count 1
history weights
history $transpose
find $exp.isinf().any() --no-move
find $exp.sum() < 0 --max-ticks 2
find weights.isnan().any()
prov $transpose
reference weights
diff weights {EXP_DONE} {DIV_DONE}
hist weights --bins 4
print $exp.isinf().sum()
print $exp
help --json
help find"""
MISTAKES = {
    "reference nosuch": "'nosuch' is not a variable or value of the program",
    "reference": "usage: reference NAME",
    "history nosuch": "'nosuch' is not a variable or value of the program",
    "history": "usage: history NAME [--max N]",
    "diff weights 1 2": "at tick 1: name 'weights' is not defined at this tick in NaiveAttention.forward",
    "diff weights 0 999999": "tick 999999 is outside the run (0..",
    "diff weights x y": "usage: diff NAME TICK1 TICK2",
    "hist weights --bins 0": "field 'bins'",
    "hist weights --bins 5000": "field 'bins'",
    "hist weights --bins x": "--bins takes a whole number, 0 or more (got 'x')",
    "hist": "usage: hist NAME [--bins N]",
    "hist weights.shape": "'weights.shape' is not a tensor of real numbers",
    "find": "usage: find EXPR",
    "find weights.isnan(.any()": "syntax error in 'weights.isnan(.any()'",
    "find nosuch > 0": "'nosuch' is not a variable or value of the program",
    "find $nosuch.any()": "'$nosuch' is not a value of the program",
    "find weights.isnan().any() --from 999999": "tick 999999 is outside the run (0..",
    "timeline --from x": "--from takes a whole number, 0 or more (got 'x')",
    "timeline --bogus": "unknown option --bogus; timeline takes --from, --count",
    "compare --from 1 --count x": "--count takes a whole number",
    "compare stable --from 2": "--from and --count go with the reference table, not with branches",
    "first-divergence extra": "'extra' is not an option here",
    "ablate": "name the nodes, or --search",
    "ablate exp --search": "name the nodes, or --search",
    "ablate nosuchnode": "nosuchnode",
    "print $ exp": "'$' goes right before a value's name, as in $div",
    "help nosuch": "usage: help [COMMAND] [--json] (no command 'nosuch')",
}


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> dict[str, dict]:
    """Each command's JSON record from one console session (each command is in the script once)."""
    script = tmp_path_factory.mktemp("numerics") / "numerics.rewind"
    script.write_text(HAPPY + "\n" + "\n".join(MISTAKES) + "\nquit\n")
    run = rewind("debug", str(SOFTMAX), "--driver", "torch:cpu", "--json", "-x", str(script))
    assert run.returncode == 1, run.stdout + run.stderr  # the mistakes fail
    return {r["command"]: r for r in map(json.loads, run.stdout.splitlines())}


def result(session: dict[str, dict], command: str) -> dict:
    record = session[command]
    assert record["ok"], record
    return record["result"]


def test_compare_without_branches_is_the_reference_table_each_row_introduced_or_inherited(session):
    table = result(session, "compare")
    verdicts = {row["node"]: row["verdict"] for row in table["rows"]}
    assert verdicts["exp"] == "introduced" and verdicts["matmul_1"] == "inherited"
    assert all(verdicts[node.name] == "within" for node in NODES[:TICK["exp"]])
    assert all(row["verdict"] == ("within" if row["within"] else "introduced" if not row["introduced"]["within"]
                                  else "inherited") for row in table["rows"])
    assert not table["outputs"][0]["within"] and table["outputs"][0]["nonfinite"] > 0
    window = result(session, f"compare --from {TICK['exp']} --count 1")["rows"]
    assert [(row["tick"], row["node"]) for row in window] == [(TICK["exp"], "exp")]


def test_first_divergence_and_precision_ablation_are_console_commands(session):
    found = result(session, "first-divergence")["divergence"]
    assert (found["node"], found["tick"], found["pattern"]["pattern"]) == ("exp", TICK["exp"], "exp-overflow")
    assert found["growth"][-1]["node"] == "matmul_1"  # the error followed to the output
    alone = result(session, "ablate exp")["ablation"]
    assert [n["node"] for n in alone["nodes"]] == ["exp"] and alone["fixed"] is False
    search = result(session, "ablate --search")["search"]
    assert search["found"]["fixed"] and "exp" in [n["node"] for n in search["found"]["nodes"]]


def test_reference_gives_the_reference_value_and_this_pass_against_it_with_a_reason_for_each_null(session):
    before = result(session, "reference $matmul")  # at entry: this pass has not run matmul yet
    assert before["value"] == "matmul" and before["referenceValue"]["stats"]["nan"] == 0
    assert before["pass"] is None and before["comparison"] is None
    assert before["passReason"] == before["comparisonReason"] == (
        f"this pass has not written 'matmul' yet at tick 0: tick {TICK['matmul']} writes it")
    weights = result(session, "reference weights")  # after div ran: weights is div, NaN where exp overflowed
    assert weights["value"] == "div" and weights["tick"] == DIV_DONE
    assert weights["referenceValue"]["stats"]["nan"] == 0 and weights["referenceValue"]["dtype"] == "float64"
    assert weights["pass"]["stats"]["nan"] > 0 and weights["pass"]["dtype"] == "float16"
    assert weights["comparison"]["within"] is False and weights["comparison"]["cosine"] is None
    assert weights["comparison"]["cosineReason"]


def test_timeline_merges_breakpoint_stops_births_and_checkpoints_by_tick(session):
    timeline = result(session, "timeline")
    events = timeline["events"]
    assert [e["tick"] for e in events] == sorted(e["tick"] for e in events)
    births = [(e["tick"], e["node"], e["kind"]) for e in events if e["event"] == "birth"]
    assert births == [(TICK["exp"], "exp", "inf"), (TICK["div"], "div", "nan")]
    assert all(e["reachesOutput"] for e in events if e["event"] == "birth")
    stops = [(e["tick"], e["breakpoints"]) for e in events if e["event"] == "stop"]
    assert stops == [(DIV_LINE_TICK, [1])]  # the console's own number; its condition holds there
    assert events[0] == {"event": "checkpoint", "tick": 0, "bytes": 0, "tier": "host", "values": 0}
    window = result(session, f"timeline --from {TICK['div']} --count 1")
    assert [e["node"] for e in window["events"] if e["event"] == "birth"] == ["div"]
    assert {e["tick"] for e in window["events"]} == {TICK["div"]}
    assert (window["start"], window["stop"]) == (TICK["div"], TICK["div"] + 1)


def test_history_lists_every_write_a_variable_gets_across_the_run_with_stats(session):
    history = result(session, "history weights")
    assert history["values"] == ["exp", "div"]
    writes = history["writes"]
    assert [(w["tick"], w["value"]) for w in writes] == [(TICK["exp"], "exp"), (TICK["div"], "div")]
    assert writes[0]["stats"]["inf"] > 0 and writes[1]["stats"]["nan"] > 0
    assert all(re.fullmatch(r"[0-9a-f]{16}", w["digest"]) for w in writes)


def test_a_view_has_no_digest_of_its_own_and_says_so_instead_of_nan(session):
    (view,) = result(session, "history $transpose")["writes"]
    assert view["kind"] == "view" and view["digest"] is None and "writes no memory" in view["digestReason"]
    assert view["stats"]["nan"] == 0 and isinstance(view["stats"]["max"], float)  # computed from what it views
    last = result(session, "prov $transpose")["lastWriter"]
    assert last["digest"] is None and last["stats"] is None and last["statsReason"] and last["digestReason"]
    assert "nan" not in json.dumps(last)


def test_diff_shows_how_a_name_differs_between_two_ticks(session):
    diff = result(session, f"diff weights {EXP_DONE} {DIV_DONE}")
    left, right = diff["left"], diff["right"]
    assert (left["tick"], right["tick"]) == (EXP_DONE, DIV_DONE) and left["shape"] == right["shape"]
    assert left["stats"]["inf"] > 0 and right["stats"]["nan"] > 0
    assert diff["sameShape"] and 0 < diff["differing"] <= left["numel"] and diff["maxAbsDiff"] > 0
    assert len(diff["firstDifference"]["index"]) == len(left["shape"])


def test_hist_bins_the_finite_elements_and_counts_nan_and_inf_apart(session):
    hist = result(session, "hist weights --bins 4")
    assert hist["nan"] > 0 and hist["posinf"] == hist["neginf"] == 0
    assert hist["finite"] + hist["nan"] == hist["numel"] == sum(hist["bins"]["counts"]) + hist["nan"]
    edges = hist["bins"]["edges"]
    assert len(edges) == 5 and edges == sorted(edges)


def test_find_skips_ticks_where_a_name_is_not_defined_yet_and_goes_to_the_first_that_holds(session):
    seen = result(session, "find $exp.isinf().any() --no-move")
    assert seen["tick"] == EXP_DONE and seen["start"] == 1  # from the tick after the position (entry)
    assert seen["skipped"] == EXP_DONE - 1 and "'$exp' is not written yet" in seen["skipReason"]
    assert "stop" not in seen
    nowhere = result(session, "find $exp.sum() < 0 --max-ticks 2")
    assert nowhere["tick"] is None and nowhere["scanned"] == 2 and "maxTicks" in nowhere["tickReason"]
    moved = result(session, "find weights.isnan().any()")
    assert moved["tick"] == DIV_DONE and moved["stop"]["tick"] == DIV_DONE  # and the console went there


def test_dollar_name_is_the_program_value_in_print(session):
    assert result(session, "print $exp.isinf().sum()")["result"].endswith("= 4")
    assert result(session, "print $exp")["memoryReference"] == "rewind-value:exp"  # the value itself, with its bytes


def test_numerics_mistakes_are_errors_in_words_and_the_console_goes_on(session):
    for command, words in MISTAKES.items():
        record = session[command]
        assert not record["ok"] and words in record["error"], (command, record)
        assert not EXCEPTION_NAMES.search(record["error"]), record
    assert session["help find"]["ok"]  # commands after the mistakes ran too


def test_help_json_lists_every_registered_command_with_its_syntax_and_summary(session):
    registry = Console(None, io.StringIO()).registry
    assert {c.run.__name__ for c in registry} == {n for n in dir(Console) if n.startswith("cmd_")}  # all registered
    listed = result(session, "help --json")["commands"]
    assert [c["name"] for c in listed] == [c.names[0] for c in registry]
    assert NUMERICS <= {c["name"] for c in listed}
    assert all(c["syntax"].startswith(c["name"]) and c["summary"] for c in listed)
    assert "$name" in result(session, "help --json")["names"]
    (find,) = result(session, "help find")["commands"]
    assert find["syntax"] == "find EXPR [--from T] [--max-ticks N] [--no-move]"


def test_the_reference_table_timeline_history_and_histogram_read_as_tables(session):
    """The text the console prints in place of --json, from the same answers."""
    header, *rows = describe_reference_table(result(session, "compare")).splitlines()[1:-1]
    assert header.split() == ["tick", "node", "op", "error", "introduced", "verdict", "beyond", "NaN/Inf"]
    assert next(r.split() for r in rows if r.split()[1] == "exp")[5] == "introduced"
    timeline = describe_timeline(result(session, "timeline"))
    assert re.search(rf"tick {TICK['exp']} +birth +4 INF in exp, written by exp \(aten.exp.default\) at "
                     rf"softmax_overflow.py:{DIV_LINE - 1}: reaches an output", timeline)
    assert re.search(rf"tick {DIV_LINE_TICK} +stop +breakpoint 1$", timeline, re.MULTILINE)
    assert describe_history("weights", result(session, "history weights")).startswith(
        "weights: 2 write(s) over the run to exp, div\n  tick  value  node  kind")
    bars = describe_histogram("weights", result(session, "hist weights --bins 4")).splitlines()[2:]
    assert len(bars) == 4 and max(line.count("#") for line in bars) == 40  # the fullest bin: the longest bar
