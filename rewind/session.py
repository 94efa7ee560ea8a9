"""A debug session in Python: the DebugSession that `rewind.debug(...)` and `rewind.open(...)` answer.

It drives the engine's Session (hardware/session/session.py) in this process, through the same Adapter and the
same request handlers the DAP server runs (dap_server/), and says what it finds in the console's words
(dap_server/console*.py): no second implementation of anything. Motions and breakpoints go to the Session
directly, as the DAP handlers do; every answer is a display (rewind/displays.py). What goes wrong is a
RewindError with the message the console prints.
"""

from __future__ import annotations

import re
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from html import escape
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch
from pydantic import BaseModel, ValidationError

from checkpoint.safe_files import TargetExists
from dap_server import custom
from dap_server import evaluate as evaluating
from dap_server import numerics
from dap_server.adapter import Adapter
from dap_server.console import describe_placement, describe_provenance
from dap_server.console_numerics import describe_diff, describe_found, describe_history, describe_timeline
from dap_server.failures import describe_failure
from dap_server.requests import describe_validation_error
from hardware.errors import RewindError, echo
from hardware.program import Program
from hardware.session import Direction, FunctionSpec, LaunchOptions, LineSpec, Session, Stop
from hardware.ticks import Tick
from provenance.forensics import Forensics
from rewind.analyses import AnalysisCommands
from rewind import arguments as checks
from rewind.displays import Answer, StopAnswer, ValueAnswer, source_line

T = TypeVar("T")
STEP_KINDS = ("over", "in", "out")
GRANULARITIES = {"line": "statement", "statement": "statement", "instruction": "instruction", "node": "node"}
_FILE_LINE = re.compile(r"^(.+):(\d+)$")


@dataclass
class _Breakpoint:
    number: int  # this session's own numbering, never given twice
    file: str | None  # a line breakpoint's file; None: a function breakpoint
    spec: LineSpec | FunctionSpec

    def describe(self) -> str:
        where = f"{Path(self.file).name}:{self.spec.line}" if self.file else self.spec.name
        mode = f" ({self.spec.mode})" if self.spec.mode else ""
        condition = f" if {self.spec.condition}" if self.spec.condition else ""
        return f"breakpoint {self.number} at {where}{mode}{condition}"


class DebugSession(AnalysisCommands):
    """One model's run, frozen and recorded: move through it both ways, look at its values, find what went wrong.

    Motions (run, step, back, finish, goto, goto_step) answer where they stopped; in Jupyter the stop shows the
    source around its line. Names are a variable of the innermost frame or a Program value (`$name` is always the
    value). `with rewind.debug(...) as s:` closes the engine at the end of the block; `close()` does it too.
    """

    def __init__(self, adapter: Adapter):
        self._adapter = adapter
        self._breakpoints: list[_Breakpoint] = []
        self._numbered = 0
        self._references: dict[str, Forensics] = {}  # forensics against other references
        self.last_stop: StopAnswer | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    @classmethod
    def launch(cls, options: LaunchOptions, program: Program | None = None) -> "DebugSession":
        """Launch `program` (None: the one `options` names, or its trace) and stop on entry; a launch that fails
        leaves nothing running."""
        debugger = cls(Adapter(_print_output))
        debugger._adapter.launched = True  # what the handlers require; close() and a failed launch set it back
        try:
            with quiet_deprecations():
                debugger._ask_session(lambda: debugger.session.launch(replace(options, stop_on_entry=True), program))
            debugger.last_stop = debugger._display(debugger.session.start())
        except BaseException:
            debugger.close()
            raise
        return debugger

    @property
    def session(self) -> Session:
        """The engine's Session itself, for what this API does not offer."""
        return self._adapter.session

    def close(self) -> None:
        """End the session: the engine's files are finished and its memory given back. Closing twice is fine."""
        if self._adapter.launched:
            self._adapter.launched = False
            self.session.close()
            self._adapter.worker.shutdown(wait=False)

    def __enter__(self) -> "DebugSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if not self._adapter.launched:
            return "<rewind debug session, closed>"
        options = self.session.options
        what = options.trace or options.program
        return f"<rewind debug session of {what}: tick {self.position} of {self.end}>\n{self.last_stop!r}"

    def _repr_html_(self) -> str:
        head = escape(repr(self).splitlines()[0])
        return f"<p><code>{head}</code></p>" + (self.last_stop._repr_html_() if self._adapter.launched and
                                                self.last_stop is not None else "")

    @property
    def position(self) -> int:
        """The tick about to run."""
        return int(self._ask_session(lambda: self.session.position))

    @property
    def end(self) -> int:
        """The last position: every tick has run."""
        return int(self._ask_session(lambda: self.session.end))

    # -- moving -------------------------------------------------------------------------------------
    def run(self, reverse: bool = False) -> StopAnswer:
        """Continue to the next stop (a breakpoint, a NaN/Inf the filters of `stop_on` catch, the end); with
        reverse=True back to the previous one (reverse-continue)."""
        direction = Direction.REVERSE if checks.flag("reverse", reverse) else Direction.FORWARD
        return self._move(lambda: self.session.run(direction))

    def step(self, kind: str = "over", granularity: str = "line") -> StopAnswer:
        """One line on: over calls (kind "over"), into them ("in") or out of the function ("out"). granularity
        "node" moves one node; "instruction" one chip instruction on a chip that has them (sim), else one node."""
        kind = checks.choice("kind", kind, STEP_KINDS)
        chosen = GRANULARITIES[checks.choice("granularity", granularity, tuple(GRANULARITIES))]
        if chosen == "node":
            return self._move(self._node_forward)
        return self._move(lambda: self.session.step(Direction.FORWARD, chosen, kind))

    def finish(self) -> StopAnswer:
        """Run until the function of the innermost frame returns."""
        return self.step("out")

    def back(self, granularity: str = "line") -> StopAnswer:
        """One line back, over calls (as gdb's reverse-next); granularity "node" or "instruction" as `step`'s."""
        chosen = GRANULARITIES[checks.choice("granularity", granularity, tuple(GRANULARITIES))]
        if chosen == "node":
            return self._move(self._node_back)
        return self._move(lambda: self.session.step(Direction.REVERSE, chosen, "over"))

    def goto(self, tick: int) -> StopAnswer:
        """To the instant before tick `tick` runs (0 is the start, `end` the end), either way."""
        target = checks.whole("tick", tick)
        end = self.end
        if not 0 <= target <= end:
            raise RewindError(f"tick {target} is outside the run: ticks are 0..{end}")
        return self._move(lambda: self.session.goto(Tick(target)))

    def goto_step(self, step: int) -> StopAnswer:
        """To the start of training step `step` (from 0), before its first node runs."""
        number = checks.whole("step", step)
        return self._move(lambda: self.session.goto_step(number))

    def _node_forward(self) -> Stop:
        """One node on, on any chip: the first node still to run on the line, or the next line."""
        targets = self.session.step_in_targets(0)
        if not targets:
            return self.session.step(Direction.FORWARD, "statement", "over")
        return self.session.step_into(targets[0])

    def _node_back(self) -> Stop:
        """To where the node before began (inside a node of the sim chip: where this one began)."""
        tick = self.session.position if self.session.instruction else self.session.position - 1
        if tick < 0:
            raise RewindError("at tick 0 already: no node before it")
        return self.session.goto(Tick(tick))

    def _move(self, motion: Callable[[], Stop]) -> StopAnswer:
        stop = self._ask_session(motion)
        self._adapter.variables.clear()  # references live for one stop
        self.last_stop = self._display(stop)
        return self.last_stop

    def _display(self, stop: Stop) -> StopAnswer:
        frames = self.session.frames()
        return StopAnswer(stop, frames[0] if frames else None, self.session.program.source_files)

    # -- breakpoints --------------------------------------------------------------------------------
    def breakpoint(self, where: str | int, line: int | None = None, *, condition: str | None = None,
                   hit: str | int | None = None, log: str | None = None, mode: str | None = None) -> Answer:
        """Stop at a source line or at a function.

        `breakpoint("gpt.py", 29)` or `breakpoint("gpt.py:29")`: a line (a path, or the name of one of the
        program's files); `breakpoint(29)`: a line of the file the stop shows. `breakpoint("blocks.1.attn")`,
        `("aten.softmax")`, `("softmax_1")`, `("LayerNorm")`: a module path, an op, a node, a module class.
        condition: an expression that must hold there; hit: which hits stop (3, ">=3", "%2"); log: print this
        message ({expressions} filled in) instead of stopping; mode: in a training step, stop in the line's
        "forward" nodes, its "backward" ones or "both". A breakpoint that cannot be set is an error saying why.
        """
        for name, value in (("condition", condition), ("log", log), ("mode", mode)):
            checks.text_or_none(name, value)
        hits = None if hit is None else str(checks.whole("hit", hit)) if not isinstance(hit, str) else hit
        file, spec = self._place(where, line, condition, hits, log, mode)
        self._numbered += 1
        entry = _Breakpoint(self._numbered, file, spec)
        self._breakpoints.append(entry)
        try:
            found = self._sync(entry)
        except RewindError:
            self._breakpoints.remove(entry)
            raise
        if not found.verified:
            self._breakpoints.remove(entry)
            self._sync(entry)
            raise RewindError(f"no breakpoint set at {echo(str(where))}: {found.message}")
        if file is not None and found.line != spec.line:  # bound to the next line that runs a node
            entry.spec = LineSpec(found.line, spec.condition, spec.hit_condition, spec.log_message, spec.mode)
        return Answer(entry.describe(), {"number": entry.number, "file": file, "line": found.line,
                                         "function": None if file else spec.name})

    def delete(self, number: int) -> Answer:
        """Delete breakpoint `number` (as `breakpoints` lists them)."""
        wanted = checks.whole("number", number)
        entry = next((b for b in self._breakpoints if b.number == wanted), None)
        if entry is None:
            raise RewindError(f"no breakpoint {wanted} (breakpoints lists them)")
        self._breakpoints.remove(entry)
        self._sync(entry)
        return Answer(f"deleted breakpoint {wanted}", {"deleted": wanted})

    @property
    def breakpoints(self) -> Answer:
        """The breakpoints set, by number."""
        return Answer("\n".join(b.describe() for b in self._breakpoints) or "no breakpoints",
                      {"breakpoints": [{"number": b.number, "file": b.file, "line": getattr(b.spec, "line", None),
                                        "function": getattr(b.spec, "name", None)} for b in self._breakpoints]})

    def stop_on(self, *filters: str, loss_spike: str | None = None) -> Answer:
        """The exceptions `run` stops at: "nan" (the default), "inf", "nonfinite-output", "divergence" (from the
        reference), "race" and "hang" (the sim chip), "loss-spike" (training; loss_spike="k=5" sets its factor).
        No filter: stop at breakpoints only."""
        for f in filters:
            checks.text_or_none("filter", f)
        conditions = {"loss-spike": checks.text_or_none("loss_spike", loss_spike)} if loss_spike else {}
        self._ask_session(lambda: self.session.set_exception_filters(filters, conditions))
        return Answer("stops on: " + (", ".join(filters) or "breakpoints only"), {"filters": list(filters)})

    def _place(self, where: str | int, line: int | None, condition: str | None, hits: str | None, log: str | None,
               mode: str | None) -> tuple[str | None, LineSpec | FunctionSpec]:
        if isinstance(where, int) and not isinstance(where, bool):
            if line is not None:
                raise RewindError("breakpoint(LINE) takes the line alone; breakpoint(FILE, LINE) names the file")
            return self._shown_file(), LineSpec(where, condition, hits, log, mode)
        if not isinstance(where, str) or not where.strip():
            raise RewindError(f"breakpoint takes a FILE and LINE, FILE:LINE, a LINE, or a node, op, module path or "
                              f"class name; got {checks.kind_of(where)}")
        found = _FILE_LINE.match(where.strip()) if line is None else None
        if line is not None or found:
            file, number = (where, checks.whole("line", line)) if line is not None else (found[1], int(found[2]))
            return self._path(file), LineSpec(number, condition, hits, log, mode)
        if log is not None:
            raise RewindError("a log message goes on a line breakpoint (breakpoint(FILE, LINE, log=...))")
        return None, FunctionSpec(where.strip(), condition, hits, mode)

    def _sync(self, changed: _Breakpoint):
        """Send the Session the whole set of the changed breakpoint's kind (and file); the changed one's answer."""
        same = [b for b in self._breakpoints if b.file == changed.file]
        if changed.file is None:
            answers = self._ask_session(lambda: self.session.set_function_breakpoints([b.spec for b in same]))
        else:
            answers = self._ask_session(lambda: self.session.set_line_breakpoints(changed.file, [b.spec for b in same]))
        return dict(zip((b.number for b in same), answers)).get(changed.number)

    def _shown_file(self) -> str:
        frame = next((f for f in self._ask_session(self.session.frames) if f.file), None)
        if frame is None:
            raise RewindError("no source file is shown here: give the file too, breakpoint(FILE, LINE)")
        return frame.file

    def _path(self, file: str) -> str:
        """A file as given: a path from here, or the name of one of the program's source files."""
        if Path(file).is_file():
            return str(Path(file).resolve())
        known = self.session.program.files()
        found = [f for f in known if f.endswith("/" + file) or Path(f).name == file]
        if not found:
            names = ", ".join(Path(f).name for f in known) or "none"
            raise RewindError(f"no file '{echo(file)}' here or among the program's sources ({names})")
        return found[0]

    # -- inspecting ---------------------------------------------------------------------------------
    def where(self) -> Answer:
        """The stack at the position: the node at its source line, then the module forwards that called it."""
        frames = self._ask_session(self.session.frames)
        lines = []
        for f in frames:
            text = f"#{f.id} {f.name}"
            if f.file:
                text += f"  {Path(f.file).name}:{f.line}  {source_line(f, self.session.program.source_files)}".rstrip()
            lines.append(text)
        return Answer("\n".join(lines), {"frames": [{"level": f.id, "name": f.name, "file": f.file, "line": f.line,
                                                     "module": f.module_path} for f in frames]})

    def value(self, expression: str) -> ValueAnswer:
        """A variable, a Program value or any safe expression over them, at the position (the console's `print`).
        A tensor is kept as it is now; in Jupyter it shows its stats, a heatmap and a histogram."""
        expression = checks.text("expression", expression).strip()
        self._adapter.variables.clear()
        body = self._ask(evaluating.evaluate, evaluating.EvaluateArguments, expression=expression, context="repl")
        result = self._ask_session(lambda: self.session.evaluate(expression))
        data = {"expression": expression, "tick": self.position, "result": body["result"]}
        if not isinstance(result, torch.Tensor) or result.is_complex():
            return ValueAnswer(f"{expression} = {body['result']}", data, None, None)
        tensor = result.detach().to("cpu").clone()
        histogram = self._ask(numerics.histogram, numerics.HistogramArguments, expression=expression)
        data["stats"] = numerics.summary(tensor)
        return ValueAnswer(f"{expression} = {body['result']}", data, tensor, histogram)

    def locate(self, name: str) -> Answer:
        """Where a value lives: chip, memory space, address, bytes, strides (one line per shard)."""
        body = self._ask(custom.locate, custom.ValueArguments, name=name)
        return Answer(describe_placement(name, body), body)

    def prov(self, name: str, max_history: int = 8) -> Answer:
        """Who wrote a value (the node, its line, the tick, the memory), and its lineage back to the inputs."""
        body = self._ask(custom.provenance, custom.ProvenanceArguments, name=name,
                         maxHistory=checks.whole("max_history", max_history))
        return Answer(describe_provenance(name, body), body)

    def history(self, name: str, max_writes: int = 1000) -> Answer:
        """Every write over the run to what a variable (anywhere) or `$value` names, with stats."""
        body = self._ask(numerics.write_history, numerics.WriteHistoryArguments, name=name,
                         maxWrites=checks.whole("max_writes", max_writes))
        return Answer(describe_history(name, body), body)

    def diff(self, expression: str, tick1: int, tick2: int) -> Answer:
        """A name or expression at two ticks: which elements differ, the first, the largest difference."""
        ticks = [checks.whole("tick1", tick1), checks.whole("tick2", tick2)]
        body = self._ask(numerics.value_diff, numerics.ValueDiffArguments, expression=expression, ticks=ticks)
        return Answer(describe_diff(expression, body), body)

    def find(self, expression: str, start: int | None = None, max_ticks: int = 100_000,
             move: bool = True) -> Answer:
        """The first tick (after the position, or from `start`) where `expression` holds; go there unless
        move=False."""
        body = self._ask(numerics.find_tick, numerics.FindTickArguments, expression=expression,
                         start=checks.whole_or_none("start", start), maxTicks=checks.whole("max_ticks", max_ticks))
        text = describe_found(expression, body)
        if body["tick"] is None or not checks.flag("move", move):
            return Answer(text, body)
        stop = self.goto(body["tick"])
        return Answer(f"{text}\n{stop.text}", {**body, "stop": stop.data})

    def timeline(self, start: int = 0, count: int | None = None) -> Answer:
        """What happens where, by tick: breakpoint stops, births of NaN/Inf, checkpoints."""
        body = self._ask(custom.timeline_events, custom.TimelineEventsArguments, start=checks.whole("start", start),
                         count=checks.whole_or_none("count", count))
        return Answer(describe_timeline(body), body)

    def checkpoints(self) -> Answer:
        """The checkpoints the ring holds: tick, values, bytes, tier."""
        found = self._ask_session(self.session.checkpoints)
        text = "\n".join(f"tick {c['tick']}: {c['values']} values, {c['bytes']} bytes ({c['tier']})" for c in found)
        return Answer(text or "no checkpoints", {"checkpoints": found})

    def save(self, path: str, overwrite: bool = False) -> Answer:
        """Save the run as a trace file (`rewind.open(path)` debugs it later, without the device). An existing
        file is replaced only with overwrite=True; it appears whole or not at all."""
        target = str(checks.path_text("path", path))
        try:
            replace = checks.flag("overwrite", overwrite)
            info = self._ask_session(lambda: self.session.save_trace(target, overwrite=replace))
        except TargetExists:
            raise RewindError(f"{target} exists and is kept; save(path, overwrite=True) replaces it") from None
        return Answer(f"saved {info['ticks']} ticks to {info['path']} ({info['bytes']} bytes)", info)

    # -- the engine -----------------------------------------------------------------------------------
    def _ask(self, handler: Callable[[Any, Any], T], model: type[BaseModel], **fields: Any) -> T:
        """A DAP request's handler, run here on its arguments; a mistake in them is said in this API's names."""
        try:
            arguments = model(**fields)
        except ValidationError as exc:
            raise RewindError(checks.python_names(describe_validation_error(handler.__name__, model, exc))) from None
        return self._ask_session(lambda: handler(self._adapter, arguments))

    def _ask_session(self, work: Callable[[], T]) -> T:
        """Run `work` on the engine; what fails is a RewindError in the words the console shows."""
        if not self._adapter.launched:
            raise RewindError("this debug session is closed: rewind.debug(...) or rewind.open(...) starts another")
        try:
            return work()
        except RewindError:
            raise
        except (Exception, SystemExit) as exc:  # the program's own code (a patch, a build) may raise anything
            raise RewindError(describe_failure("the request", exc)) from exc


def _print_output(event: str, body: dict | None) -> None:
    """The engine's output (log points, warnings about the run) printed where the user works; its other events are
    for an editor."""
    if event == "output" and body:
        sys.stdout.write(body["output"])


@contextmanager
def quiet_deprecations() -> Iterator[None]:
    """torch.export's notes on its own deprecations (FutureWarning) are not the user's business: hidden while a
    program is exported."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield
