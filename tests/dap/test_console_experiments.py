"""Experiments in `rewind debug`: the console's patch, patches, measure, compare, undo, branch, unpatch,
repair and suggest commands, through a real server (the DAP requests of docs/protocol.md)."""

import json

import pytest

from tests.dap.wire import MODELS, line_of, rewind
from tests.forensics_cases import FORENSICS

SOFTMAX = FORENSICS / "softmax_overflow.py"
EXP_LINE = line_of("torch.exp(scores)", SOFTMAX.read_text().splitlines())
STABLE = MODELS / "fixes" / "stable_softmax.py"

SCRIPT = f"""continue
patch function exp {STABLE} stable_exp as stable-exp in stable
patch precision exp float32 in wide
patch edit div[0, 1, 2] = 0 in edits
patches
measure stable
compare stable wide
undo
print div.isnan().sum()
branch stable
print div.isnan().any()
unpatch exp-float32 in wide
patch attributes exp eps=1e-3
patch precision exp
patch precision exp float32 as one as two
patch function exp /no/such/fix.py
patch attributes exp eps=oops
measure nope
quit
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> dict[str, str]:
    """What the console printed after each command of SCRIPT (each command is there once), by command."""
    script = tmp_path_factory.mktemp("console") / "experiments.rewind"
    script.write_text(SCRIPT)
    run = rewind("debug", str(SOFTMAX), "--driver", "torch:cpu", "-x", str(script))
    assert run.returncode == 1, run.stdout + run.stderr  # the commands that fail below make it 1
    sections = run.stdout.split("(rewind) ")[1:]
    return dict(section.split("\n", 1) for section in sections)


def rows(text: str, header: str) -> list[list[str]]:
    """The cells of the table whose header's first cell is `header` (cells are split at runs of 2+ spaces)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {header} "))
    table = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        table.append([cell for cell in line.strip().split("  ") if cell])
    return [[cell.strip() for cell in row] for row in table]


def test_console_patches_a_node_on_named_branches_and_lists_them(session):
    added = session[f"patch function exp {STABLE} stable_exp as stable-exp in stable"]
    assert added.startswith("added patch 'stable-exp' to branch 'stable' (installed)\n")
    assert f"stable-exp: exp (tick 4, softmax_overflow.py:{EXP_LINE}) replaced by stable_exp" in added
    assert session["patches"].splitlines() == [
        "  original (the recorded pass)",
        "  stable, patched from tick 4",
        f"    stable-exp: exp (tick 4, softmax_overflow.py:{EXP_LINE}) replaced by stable_exp from stable-exp",
        "  wide, patched from tick 4",
        f"    exp-float32: exp (tick 4, softmax_overflow.py:{EXP_LINE}) run at float32",
        "* edits, patched from tick 6",
        f"    div[0,1,2]: div (tick 6, softmax_overflow.py:{EXP_LINE + 1}) set div[0, 1, 2] = 0"]


def test_console_measures_a_branch_as_a_table_of_outputs_and_nodes(session):
    measured = session["measure stable"]
    assert measured.startswith("branch stable, patched from tick 4 (errors in units of tolerance)\n")
    ((output, branch, original, against_original),) = rows(measured, "output")
    assert output == "matmul_1" and branch.startswith("within (")
    assert original == "48 beyond (inf), 48 NaN/Inf" and against_original.startswith("48 beyond (inf)")
    nodes = rows(measured, "tick")
    assert [(r[0], r[1], r[4]) for r in nodes] == [("4", "exp*", "inf"), ("5", "sum_1", "inf"), ("6", "div", "inf"),
                                                   ("7", "matmul_1", "inf")]
    assert float(nodes[-1][3]) <= 1 and all(r[5].endswith(("us", "ms", " s")) for r in nodes)
    assert measured.splitlines()[-1].startswith("time from tick 4: ")


def test_console_compares_branches_side_by_side(session):
    compared = session["compare stable wide"]
    ((output, original, stable, wide),) = rows(compared, "output")
    assert (output, original, wide) == ("matmul_1", "48 beyond (inf), 48 NaN/Inf", "48 beyond (inf), 48 NaN/Inf")
    assert stable.startswith("within (")
    exp = rows(compared, "tick")[0]
    assert exp[:4] == ["4", "exp", "aten.exp.default", "inf"]
    assert exp[4].endswith("*") and exp[5].endswith("*")  # both branches patch exp
    assert compared.splitlines()[-1].startswith("time from the patch point: stable ")


def test_console_undo_brings_the_recorded_pass_back_and_branch_reinstalls_one(session):
    assert session["undo"].startswith("the recorded pass is back (original installed)\n* original")
    assert session["print div.isnan().sum()"].startswith("div.isnan().sum() = int64[] cpu = 4\n")
    assert session["branch stable"].startswith("installed branch 'stable'\n")
    assert session["print div.isnan().any()"].startswith("div.isnan().any() = bool[] cpu = False\n")
    assert "wide" not in session["unpatch exp-float32 in wide"]  # a branch left without patches is gone


def test_console_experiment_mistakes_print_errors_and_the_console_goes_on(session):
    errors = {command: text.splitlines()[0] for command, text in session.items() if text.startswith("error:")}
    assert errors == {
        "patch attributes exp eps=1e-3": f"error: node 4 'exp' (aten.exp.default) at {SOFTMAX}:{EXP_LINE} has no "
                                         "attribute 'eps' (its attributes: none)",
        "patch precision exp": "error: usage: patch precision NODE DTYPE (float64, float32, float16, bfloat16)",
        "patch precision exp float32 as one as two": "error: 'as' is given twice",
        "patch function exp /no/such/fix.py": "error: cannot read /no/such/fix.py: No such file or directory",
        "patch attributes exp eps=oops": "error: eps=oops: the value is not a Python literal (a number, 'text', "
                                         "True, [1, 2])",
        "measure nope": "error: no branch 'nope' (branches: original, stable, edits)",
    }


def test_console_repair_validates_a_fix_and_the_knowledge_base_then_suggests_it(tmp_path):
    knowledge = tmp_path / "fixes.json"
    script = (f"repair --fix {STABLE} --seeds 1 --scales 2 --shapes 0 --knowledge {knowledge}\n"
              f"suggest --knowledge {knowledge} --limit 1\nrepair --bogus\nrepair --max-attempts 0\nquit\n")
    run = rewind("debug", str(SOFTMAX), "--driver", "torch:cpu", "--json", stdin=script)
    records = [json.loads(line) for line in run.stdout.splitlines()]
    repaired, suggested, bogus, zero = records[1:]
    verdict = repaired["result"]
    assert verdict["verdict"] == "validated" and verdict["fix"]["name"] == "stable_softmax.py"
    checks = verdict["attempts"][0]["validation"]["checks"]
    assert [c["inputs"]["name"] for c in checks] == ["example", "seed 1", "range x2"]  # as --seeds, --scales say
    assert verdict["knowledge"]["recorded"]["pattern"] == "exp-overflow"
    (suggestion,) = suggested["result"]["suggestions"]
    assert suggestion["origin"] == "learned" and suggestion["name"] == "stable_softmax.py"
    assert not bogus["ok"] and bogus["error"].startswith("unrecognized arguments: --bogus (usage: repair [--fix")
    assert not zero["ok"] and "maxAttempts" in zero["error"]
    assert run.returncode == 1  # two commands failed
