"""The reports of `rewind compare` and `rewind validate --function` in words (the console shows them too: nothing
here imports torch)."""

from __future__ import annotations


def render(report: dict) -> str:
    lines = [f"Rewind compare: {report['candidate']} against {report['reference']}", ""]
    if report["verdict"] == "refused":
        return "\n".join(lines + [f"Refused: {report['reason']}"])
    for o in report["outputs"]:
        c = o["comparison"]
        state = "within tolerance" if o["within"] else f"{c['mismatches']} element(s) beyond tolerance"
        lines.append(f"Output '{o['value']}': {state} (max abs {_number(c['maxAbs'])}, error {_number(c['error'])} x "
                     "tolerance)")
    lines.append("")
    if report["verdict"] == "clean":
        return "\n".join(lines + [f"Verdict: clean: {report['reason']}"])
    lines.append(f"Headline: {report['headline']}")
    if report.get("departure"):
        lines += [f"  - {e}" for e in report["departure"]["evidence"]]
    if report.get("pattern"):
        p = report["pattern"]
        lines += [f"Pattern: {p['title']} [{p['pattern']}]", f"  fix: {p['fix']}"]
    return "\n".join(lines + ["", "Verdict: departs"])


def render_validation(report: dict) -> str:
    lines = [f"Rewind validate: {report['candidate']} against {report['reference']}", ""]
    for case in report["cases"]:
        mark = "pass" if case["passed"] else "FAIL"
        error = f" (error {_number(case['error'])} x tolerance)" if "error" in case and case["passed"] else ""
        lines.append(f"  {mark}  {case['case']}{error}" + ("" if case["passed"] else f": {case['reason']}"))
    return "\n".join(lines + ["", f"Verdict: {report['verdict']}: {report['reason']}"])


def render_repair(report: dict) -> str:
    lines = [f"Rewind repair: {report['candidate']} against {report['reference']}", ""]
    if report.get("headline"):
        lines.append(f"Headline: {report['headline']}")
    if report.get("pattern"):
        lines.append(f"Pattern: {report['pattern']['title']} [{report['pattern']['pattern']}]")
    lines.append("")
    for fix in report["fixes"]:
        lines.append(f"  {fix['verdict']}: {fix['fix']} ({fix['cases']} cases): {fix['reason']}")
    verdict = {"repaired": f"repaired by {report['repair']}", "clean": "the candidate is clean: nothing to repair",
               "not repaired": "no fix validated on the coverage suite"}.get(report["verdict"], report["verdict"])
    return "\n".join(lines + ["", f"Verdict: {verdict}"])


def _number(x: float | str) -> str:
    """A measure as JSON carries it: a number, or 'inf'/'nan' as text."""
    return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)
