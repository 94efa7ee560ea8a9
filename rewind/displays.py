"""What the Python API answers, as a terminal and a notebook show it.

Every answer is the console's Result (dap_server/console_result.py): its `text` is what `rewind debug` prints
for the same command, its `data` what `--json` gives. `repr()` is the text, so a terminal shows what the console
does; in Jupyter `_repr_html_` shows more: a stop with the source around its line, a value with its stats, a
heatmap and a histogram, errors against the reference drawn by tick, the forensics report with its chart.
Pictures are drawn only when a notebook asks for them (provenance/charts.py).
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, Callable, Mapping

import torch

from dap_server.console_result import Result
from hardware.session import FrameInfo, Stop
from provenance import report_html
from provenance.charts import Mark, data_uri, errors_png, heatmap_png, histogram_png


class Answer(Result):
    """A command's answer: `text` for people, `data` for programs."""

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return report_html.styled(f"<pre>{escape(self.text)}</pre>")


class StopAnswer(Answer):
    """Where a motion stopped: the tick, why, and the source line about to run (or that just wrote)."""

    def __init__(self, stop: Stop, frame: FrameInfo | None, sources: Mapping[str, str]):
        name = frame.name if frame else "?"
        what = stop.description or stop.reason
        text = f"[tick {stop.tick}] {what}: {name}"
        code = source_line(frame, sources)
        if frame is not None and frame.file:
            text += f"\n  {_file_name(frame.file)}:{frame.line}  {code}"
        super().__init__(text.rstrip(), {
            "reason": stop.reason, "description": stop.description, "tick": stop.tick,
            "frame": {"name": name, "file": frame.file if frame else None, "line": frame.line if frame else None},
            "breakpoints": list(stop.breakpoint_ids)})
        self.stop, self.frame, self._sources = stop, frame, sources

    def _repr_html_(self) -> str:
        head = escape(self.text.splitlines()[0])
        source = ""
        if self.frame is not None and self.frame.file and self.frame.line:
            source = report_html.source_lines_html(self.frame.file, self.frame.line, self._sources)
        exception = _inputs(self.stop.exception.inputs) if self.stop.exception is not None else ""
        return report_html.styled(f"<p><b>{head}</b></p>{source}{exception}")


class ValueAnswer(Answer):
    """A value (or any expression) at a position: the console's `print` text; in a notebook its stats, a heatmap
    and a histogram. The tensor is a copy taken when asked: moving on does not change it."""

    def __init__(self, text: str, data: dict, tensor: torch.Tensor | None, histogram: dict | None):
        super().__init__(text, data)
        self.tensor, self.histogram = tensor, histogram

    def _repr_html_(self) -> str:
        if self.tensor is None or self.histogram is None:
            return super()._repr_html_()
        h = self.histogram
        stats = self.data.get("stats") or {}
        cells = [("dtype", h["dtype"]), ("shape", str(h["shape"])), ("min", _number(stats.get("min"))),
                 ("max", _number(stats.get("max"))), ("mean", _number(stats.get("mean"))), ("finite", h["finite"]),
                 ("NaN", h["nan"]), ("+Inf", h["posinf"]), ("-Inf", h["neginf"])]
        table = "<table><tr>" + "".join(f"<th>{k}</th>" for k, _ in cells) + "</tr><tr>" + "".join(
            f"<td>{escape(str(v))}</td>" for _, v in cells) + "</tr></table>"
        title = f"{self.data['expression']} at tick {h['tick']}"
        pictures = ""
        if self.tensor.numel() > 1:
            bins = h["bins"] or {}
            pictures = (_image(heatmap_png(self.tensor, title), f"heatmap of {title}")
                        + _image(histogram_png(bins.get("edges"), bins.get("counts"),
                                               {"NaN": h["nan"], "+Inf": h["posinf"], "-Inf": h["neginf"]}, title),
                                 f"histogram of {title}"))
        return report_html.styled(f"<p><b>{escape(self.text)}</b></p>{table}{pictures}")


class ChartAnswer(Answer):
    """An answer with errors against the reference by tick (a measurement, a comparison): in a notebook, the chart
    above the text."""

    def __init__(self, text: str, data: dict, series: dict[str, list[tuple[int, float]]], title: str,
                 marks: list[Mark] | None = None):
        super().__init__(text, data)
        self.series, self.title, self.marks = series, title, marks or []

    def _repr_html_(self) -> str:
        chart = _image(errors_png(self.series, self.marks, self.title), self.title) if any(self.series.values()) \
            else ""
        return report_html.styled(f"{chart}<pre>{escape(self.text)}</pre>")


class ForensicsAnswer(Answer):
    """The whole investigation (as `rewind forensics` reports it); `save_html` writes it as a page to send."""

    def __init__(self, text: str, data: dict, evidence: report_html.ForensicsEvidence):
        super().__init__(text, data)
        self.evidence = evidence

    @property
    def problem(self) -> bool:
        return self.evidence.investigation.problem

    def save_html(self, path: str, overwrite: bool = False) -> str:
        """Write the report as one self-contained HTML file; an existing file is replaced only with `overwrite`,
        never one of the model's sources."""
        used = report_html.model_files(self.evidence.investigation.program, self.evidence.sources)
        return str(report_html.write(path, self.evidence, overwrite, used))

    def _repr_html_(self) -> str:
        return report_html.styled(report_html.sections(self.evidence))


def errors_by_tick(rows: list[dict], error: Callable[[dict], Any]) -> list[tuple[int, float]]:
    """(tick, error) of each row `error` finds one in (None: none), the worst where a tick has several."""
    worst: dict[int, float] = {}
    for row in rows:
        found = error(row)
        if found is not None:
            worst[row["tick"]] = max(worst.get(row["tick"], -math.inf), float(found))
    return sorted(worst.items())


def _inputs(inputs: dict[str, dict]) -> str:
    """The stats of the inputs of the node that raised (what it was given when it wrote NaN/Inf)."""
    if not inputs:
        return ""
    keys = ("min", "max", "mean", "nan", "inf")
    rows = "".join(f"<tr><td>{escape(name)}</td>" + "".join(f"<td>{escape(_number(s.get(k)))}</td>" for k in keys)
                   + "</tr>" for name, s in inputs.items())
    head = "".join(f"<th>{k}</th>" for k in ("input", *keys))
    return f"<p>What the node was given:</p><table><tr>{head}</tr>{rows}</table>"


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="{data_uri(png)}">'


def source_line(frame: FrameInfo | None, sources: Mapping[str, str]) -> str:
    """The code at a frame's line (empty without one)."""
    if frame is None or not frame.file or not frame.line:
        return ""
    lines = report_html.source_lines(frame.file, sources)
    return lines[frame.line - 1].strip() if 0 < frame.line <= len(lines) else ""


def _file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _number(x: Any) -> str:
    return "-" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)
