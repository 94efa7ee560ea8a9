"""Pictures of the numbers, as PNG: a tensor's heatmap and histogram, and errors against the reference by tick.

The notebook displays (rewind/) and the forensics report (provenance/report_html.py) inline them as data: URIs.
Each is drawn on its own matplotlib Figure with the Agg canvas: no display, no pyplot state shared between
threads or sessions. NaN and Inf never hide: a heatmap marks every cell that holds one (a cell of a large tensor
stands for a block of elements, marked when any element of the block is non-finite) and counts them, and a
histogram, whose bins hold finite elements only, says how many it left out.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_CELLS = 200  # rows and columns of a heatmap; a larger tensor is shown in blocks
NONFINITE = {"NaN": "#ff1493", "+Inf": "#ff8c00", "-Inf": "#00bfff"}  # colours that viridis never takes
ERROR_FLOOR = 1e-3  # an error of 0 (x tolerance) is drawn here on the log scale


@dataclass(frozen=True)
class Mark:
    """A tick to point out on an error chart: the origin of an error, a node that amplified it, where the pass
    diverged or a NaN/Inf was born."""

    tick: int
    label: str
    kind: str  # origin, amplifier, divergence, birth


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def heatmap_png(tensor: torch.Tensor, title: str) -> bytes:
    """The tensor as a grid of colours: the last dimension across, the others flattened down the rows; NaN, +Inf
    and -Inf cells in their own colours, counted in the legend."""
    grid, rows, cols = _grid(tensor)
    means, flags, note = _blocks(grid, math.ceil(rows / MAX_CELLS), math.ceil(cols / MAX_CELLS))
    fig, ax = _figure(6.4, 4.2)
    finite = means[np.isfinite(means)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    extent = (-0.5, cols - 0.5, rows - 0.5, -0.5)  # axes in element indices, whatever the blocks
    image = ax.imshow(np.ma.masked_invalid(means), cmap="viridis", vmin=low, vmax=high if high > low else low + 1,
                      aspect="auto", interpolation="nearest", extent=extent)
    fig.colorbar(image, ax=ax, label="value (finite elements)")
    counts = _nonfinite_counts(tensor)
    ax.imshow(_overlay(flags), aspect="auto", interpolation="nearest", extent=extent)
    _legend(ax, counts)
    ax.set_title(title + note, fontsize=10)
    ax.set_xlabel(f"index along the last dimension (size {cols})")
    ax.set_ylabel("row" if tensor.dim() <= 2 else f"row (the first {tensor.dim() - 1} dimensions flattened)")
    return _png(fig)


def histogram_png(edges: list[float] | None, counts: list[int] | None, nonfinite: dict[str, int],
                  title: str) -> bytes:
    """Bars of a histogram of the finite elements (edges: bins + 1 bounds); the NaN/Inf count beside it."""
    fig, ax = _figure(6.4, 3.2)
    if edges is None or counts is None:
        ax.text(0.5, 0.5, "no finite element to put in bins", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    else:
        widths = np.diff(edges) if len(edges) > 1 and edges[-1] > edges[0] else [1.0]
        ax.bar(edges[:-1], counts, width=widths, align="edge", color="#3b528b", edgecolor="white", linewidth=0.5)
    left_out = ", ".join(f"{n} {kind}" for kind, n in nonfinite.items() if n)
    ax.set_title(title + (f"\nnot in the bins: {left_out}" if left_out else ""), fontsize=10)
    ax.set_xlabel("value")
    ax.set_ylabel("elements")
    return _png(fig)


def errors_png(series: dict[str, list[tuple[int, float]]], marks: list[Mark], title: str) -> bytes:
    """Errors in units of tolerance (above 1: beyond it) against tick, on a log scale, one line per series; an
    infinite error is drawn at the top edge as a triangle, an error of 0 at the bottom one. `marks` point out the
    origin, the amplifiers, the divergence and NaN/Inf births."""
    from matplotlib.ticker import MaxNLocator  # deferred: matplotlib is heavy, and only pictures need it

    fig, ax = _figure(8.0, 4.2)
    finite = [e for points in series.values() for _, e in points if math.isfinite(e) and e > 0]
    top = max([*finite, 1.0]) * 10
    bottom = min(min(finite, default=1.0), 1.0) / 10 if finite else ERROR_FLOOR
    for label, points in series.items():
        ticks = [t for t, _ in points]
        shown = [top if math.isinf(e) or math.isnan(e) else max(e, bottom) for _, e in points]
        (line,) = ax.plot(ticks, shown, marker=".", markersize=3, linewidth=1, label=label)
        beyond = [(t, top) for t, e in points if math.isinf(e) or math.isnan(e)]
        if beyond:
            ax.plot(*zip(*beyond), linestyle="", marker="^", color=line.get_color(), label=f"{label}: infinite")
    ax.axhline(1.0, color="#d62728", linestyle="--", linewidth=1, label="tolerance")
    _marks(ax, marks, dict(next(iter(series.values()), [])), bottom, top)
    ax.set_yscale("log")
    ax.set_ylim(bottom / 2, top * 2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("tick (one node per tick)")
    ax.set_ylabel("error (x tolerance)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


# -- drawing helpers ----------------------------------------------------------------------------------------------

def _figure(width: float, height: float) -> tuple["Figure", "Axes"]:
    from matplotlib.figure import Figure  # deferred: matplotlib is heavy, and only pictures need it

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig: "Figure") -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _grid(tensor: torch.Tensor) -> tuple[np.ndarray, int, int]:
    """The tensor as a 2-D float64 array: a number is 1x1, a vector one row, more dimensions flattened to rows."""
    t = tensor.detach().to("cpu", torch.float64)
    cols = t.shape[-1] if t.dim() else 1
    grid = t.reshape(-1, cols).numpy() if t.numel() else np.zeros((1, 1))
    return grid, grid.shape[0], grid.shape[1]


def _blocks(grid: np.ndarray, rs: int, cs: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Each rs x cs block as one cell: the mean of its finite elements, and which non-finite value it holds
    (0 none, 1 NaN, 2 +Inf, 3 -Inf; NaN first). A block with no finite element has no mean."""
    rows, cols = grid.shape
    r, c = math.ceil(rows / rs), math.ceil(cols / cs)
    padded = np.full((r * rs, c * cs), np.nan)
    padded[:rows, :cols] = grid
    inside = np.zeros_like(padded, dtype=bool)
    inside[:rows, :cols] = True

    def cells(a: np.ndarray) -> np.ndarray:
        return a.reshape(r, rs, c, cs).transpose(0, 2, 1, 3).reshape(r, c, rs * cs)

    values, real = cells(padded), cells(inside)
    finite = np.isfinite(values) & real
    count = finite.sum(-1)
    means = np.where(count > 0, np.where(finite, values, 0.0).sum(-1) / np.maximum(count, 1), np.nan)
    flags = np.zeros((r, c), dtype=np.int8)
    for code, hit in ((3, values == -np.inf), (2, values == np.inf), (1, np.isnan(values) & real)):
        flags[hit.any(-1)] = code
    note = f"\n(each cell: the mean of a {rs}x{cs} block; marked when any element is NaN/Inf)" if rs * cs > 1 else ""
    return means, flags, note


def _overlay(flags: np.ndarray) -> np.ndarray:
    """An RGBA image: transparent but where a cell holds NaN (1), +Inf (2) or -Inf (3)."""
    from matplotlib.colors import to_rgba  # deferred: matplotlib is heavy, and only pictures need it

    overlay = np.zeros(flags.shape + (4,))
    for code, colour in enumerate(NONFINITE.values(), start=1):
        overlay[flags == code] = to_rgba(colour)
    return overlay


def _nonfinite_counts(tensor: torch.Tensor) -> dict[str, int]:
    t = tensor.detach()
    if not t.is_floating_point():
        return dict.fromkeys(NONFINITE, 0)
    return {"NaN": int(torch.isnan(t).sum()), "+Inf": int((t == math.inf).sum()), "-Inf": int((t == -math.inf).sum())}


def _legend(ax: "Axes", counts: dict[str, int]) -> None:
    from matplotlib.patches import Patch  # deferred: matplotlib is heavy, and only pictures need it

    handles = [Patch(color=NONFINITE[kind], label=f"{kind}: {n}") for kind, n in counts.items() if n]
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper right", framealpha=0.9)


_MARK_STYLE = {"origin": ("*", "#d62728", 14), "amplifier": ("v", "#ff7f0e", 9)}
_LINE_STYLE = {"divergence": ("#9467bd", "--"), "birth": ("#ff1493", ":")}


def _marks(ax: "Axes", marks: list[Mark], errors: dict[int, float], bottom: float, top: float) -> None:
    """Origins and amplifiers as markers on the first series at their tick, each named beside it; divergences and
    births as lines. The legend names each kind once."""
    named: set[str] = set()
    for mark in marks:
        legend = mark.kind if mark.kind not in named else "_nolegend_"
        named.add(mark.kind)
        if mark.kind in _LINE_STYLE:
            colour, style = _LINE_STYLE[mark.kind]
            ax.axvline(mark.tick, color=colour, linestyle=style, linewidth=1.2, label=legend)
            ax.annotate(mark.label, (mark.tick, bottom), textcoords="offset points", xytext=(3, 3), fontsize=8,
                        color=colour, rotation=90)
            continue
        symbol, colour, size = _MARK_STYLE[mark.kind]
        error = errors.get(mark.tick, 1.0)
        y = top if not math.isfinite(error) else max(error, bottom)
        ax.plot([mark.tick], [y], linestyle="", marker=symbol, markersize=size, color=colour, label=legend)
        ax.annotate(mark.label, (mark.tick, y), textcoords="offset points", xytext=(6, 6), fontsize=8, color=colour)
