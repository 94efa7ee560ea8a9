"""`rewind debug`: a terminal client that starts `python -m dap_server` and talks DAP to it.

It is a DAP client like any editor (dap_server/client.py), so what it shows is what VS Code
would. Commands read from a terminal (with history), from a script (`-x FILE`), or from a pipe;
`--json` prints one JSON object per command for agents. With ranks (`--ranks N`) every command asks the selected
rank, as gdb's commands ask its selected thread (docs/ranks.md, "The console").
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from dap_server.client import DapClient, DapError, quiet_debugpy_log
from dap_server.console_numerics import NumericsCommands
from dap_server.console_result import Command, CommandError, Result, table, whole_number
from dap_server.frames import FRAMES_PER_THREAD
from dap_server.traces import exists_message

HISTORY = Path.home() / ".rewind_history"
BREAKPOINT_MODES = ("forward", "backward", "both")  # a breakpoint's `mode`, as the server takes it
# saveTrace's refusal of an existing file, in the server's own sentence: `path`, the file it names (with ranks, the
# index or a rank's trace beside it)
_EXISTS = re.compile(re.escape(exists_message("saveTrace", "\0")).replace(re.escape("\0"), "(?P<path>.+)"))
PROMPT = "(rewind) "
ONE_PROCESS = "this session runs one process: `rank` and `ranks` are for many ranks (rewind debug model.py --ranks N)"
JOIN_WAIT_S = 300.0  # a launch whose ranks join from other hosts: the coordinator waits 240 s for them, then says who
NAMES = ("Names: a bare name is a variable of the selected frame, else a program value; $name is always the "
         "program value named name (a node's output, an input, a parameter), even where a function or a "
         "variable has that name: print $mean, find $rsqrt.isinf().any()")


@dataclass
class ConsoleBreakpoint:
    number: int  # the console's own numbering: stable while the server renumbers
    kind: str  # "line" or "function"
    where: str  # path, or a node / op / module path
    line: int | None = None
    condition: str | None = None
    mode: str | None = None  # forward, backward, both: a training step's nodes it stops in (None: the launch's)
    server_id: int | None = None
    verified: bool = False
    message: str | None = None

    def describe(self) -> str:
        where = f"{Path(self.where).name}:{self.line}" if self.kind == "line" else self.where
        state = "" if self.verified else f" (not verified: {self.message})"
        cond = f" if {self.condition}" if self.condition else ""
        mode = f" ({self.mode})" if self.mode else ""
        return f"breakpoint {self.number} at {where}{mode}{cond}{state}"

    def spec(self) -> dict:
        """The breakpoint as setBreakpoints or setFunctionBreakpoints takes it."""
        where = {"line": self.line} if self.kind == "line" else {"name": self.where}
        return {**where, **({"condition": self.condition} if self.condition else {}),
                **({"mode": self.mode} if self.mode else {})}


class Console(NumericsCommands):
    def __init__(self, client: DapClient, out: TextIO, json_mode: bool = False):
        self.client, self.out, self.json_mode = client, out, json_mode
        self.breakpoints: list[ConsoleBreakpoint] = []
        self._numbered = 0  # breakpoint numbers given so far: a number is never given again, not even after delete
        self._sources: dict[str, list[str]] = {}
        self.failures = 0
        self.frame = 0  # the stack frame (where's #N) print, locals, prov and locate read; #0 again after each stop
        self.ranks = 0  # the session's ranks (docs/ranks.md); 0: it runs one process
        self.thread = 1  # the selected thread (rank + 1, unit + 1) every command asks about: each stop's own
        self.ask: Callable[[str], bool] | None = None  # a yes/no question to the user, at a terminal only
        self.recording: str | None = None  # the recording an engine left when it ended, to reopen
        # the one registry: what runs each command and what help says of it
        self.registry: list[Command] = [*self.session_commands(), *self.numerics_commands(),
                                        *self.experiment_commands()]
        self.commands: dict[str, Callable[[str], Result | None]] = {
            name: command.run for command in self.registry for name in command.names}

    def session_commands(self) -> list[Command]:
        return [
            Command(("break", "b"), self.cmd_break, "break FILE:LINE|LINE|NODE|OP|MODULE|CLASS [forward|backward|both] "
                    "[if COND]", "set a breakpoint (LINE: in the file shown; backward: where a training step "
                    "differentiates it; without arguments: list them)"),
            Command(("condition",), self.cmd_condition, "condition N [EXPR]", "set or clear breakpoint N's condition"),
            Command(("delete",), self.cmd_delete, "delete N", "delete breakpoint N"),
            Command(("continue", "c"), self.cmd_continue, "continue", "run forward to the next stop"),
            Command(("next", "n"), self.cmd_next, "next [node|instruction]",
                    "a line of source forward, over calls (or one node, or one chip instruction)"),
            Command(("step", "s"), self.cmd_step, "step [node|instruction]", "a line of source forward, into calls"),
            Command(("finish", "out"), self.cmd_finish, "finish", "run until the function returns"),
            Command(("back",), self.cmd_back, "back [node|instruction]", "a line back, over calls (as gdb)"),
            Command(("rc",), self.cmd_rc, "rc", "reverse-continue: back to the previous stop"),
            Command(("goto",), self.cmd_goto, "goto FILE:LINE [N] | goto step N",
                    "go to the N-th time that line runs, or to the start of training step N (from 0)"),
            Command(("print", "p", "eval"), self.cmd_print, "print EXPR",
                    "a safe expression over tensors in the selected frame"),
            Command(("locals",), self.cmd_locals, "locals", "the selected frame's variables"),
            Command(("where", "bt"), self.cmd_where, "where", "the stack (* marks the selected frame)"),
            Command(("up",), self.cmd_up, "up [N]", "select a caller's frame (#0 again after each stop)"),
            Command(("down",), self.cmd_down, "down [N]", "select a frame towards the node about to run"),
            Command(("frame", "f"), self.cmd_frame, "frame [N]", "select frame #N of where"),
            Command(("rank",), self.cmd_rank, "rank [N]", "with --ranks: select rank N, whose values, stack and "
                    "ticks the commands read and whose steps the motions take (every rank moves; each stop "
                    "selects its rank, as gdb's thread N); without N: where the selected rank is"),
            Command(("ranks",), self.cmd_ranks, "ranks", "with --ranks: each rank's tick, the collective, send or "
                    "recv it waits at (or runs next), how many it has run, and who it runs with"),
            Command(("locate",), self.cmd_locate, "locate NAME", "where a value lives: chip, memory, address (in a "
                    "kernel: NAME or NAME[I], a flat index, with the programs that wrote and read it)"),
            Command(("prov",), self.cmd_prov, "prov NAME", "who wrote a value, and its lineage"),
            Command(("checkpoints",), self.cmd_checkpoints, "checkpoints", "list the checkpoints"),
            Command(("restore",), self.cmd_restore, "restore TICK", "go to the checkpoint at TICK"),
            Command(("save",), self.cmd_save, "save FILE [--overwrite]", "save the run as a trace (open it: rewind "
                    "debug --trace FILE); an existing FILE is replaced only with --overwrite or a yes"),
            Command(("reopen",), self.cmd_reopen, "reopen",
                    "after the engine ended while recording: the recording, with the same breakpoints"),
            Command(("help", "h"), self.cmd_help, "help [COMMAND] [--json]",
                    "every command (or one) with its syntax and what it does; --json: as data"),
            Command(("quit", "q", "exit"), self.cmd_quit, "quit", "end the session"),
        ]

    # -- session ---------------------------------------------------------------------------------
    def start(self, target: dict, driver: str, entry: str) -> None:
        """Initialize, launch (a program, or a trace) stopped on entry, report where it stopped."""
        self.client.request("initialize", {"adapterID": "rewind", "clientID": "rewind-console",
                                           "clientName": "rewind debug", "linesStartAt1": True,
                                           "columnsStartAt1": True, "pathFormat": "path"})
        mark = self.client.mark()
        target = {k: v for k, v in target.items() if v is not None}
        here = _working_directory()  # the user's paths (a program, --record, save FILE) mean what they mean here
        launch = {**({"cwd": here} if here else {}), **target, "driver": driver, "entry": entry, "stopOnEntry": True}
        if target.get("join"):
            mark = self._launch_saying_how_to_join(launch, mark)
        else:
            self.client.request("launch", launch)
        self.client.wait_for("initialized")
        self.client.request("configurationDone")
        self.ranks = self._count_ranks()
        self._emit(f"launch {target.get('program') or target.get('trace')}", self._stopped(mark), mark=mark)

    def _launch_saying_how_to_join(self, launch: dict, mark: int) -> int:
        """A launch whose ranks join from other hosts is answered once they all have: until then, show what the
        session says to run on each host (the port, the token) as it says it. Returns the mark after it."""
        pending, deadline = self.client.send("launch", launch), time.monotonic() + JOIN_WAIT_S
        while True:
            try:
                response = pending.wait(0.25)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
            now = self.client.mark()
            for name, body in self.client.events_since(mark)[:now - mark]:
                if name == "output" and body.get("category") == "important":
                    print(body.get("output", ""), end="", file=sys.stderr, flush=True)
            mark = now
        if not response.success:
            raise DapError("launch", str(response.body))
        return mark

    def _count_ranks(self) -> int:
        """The session's ranks: its threads are `rank 0` … `rank N-1` (docs/protocol.md, "Many ranks"); 0 when it
        runs one process (its threads are a chip's units)."""
        names = [t["name"] for t in self.client.request("threads")["threads"]]
        return len(names) if names and names == [f"rank {r}" for r in range(len(names))] else 0

    def execute(self, line: str) -> bool:
        """Run one command line; False when the console should quit."""
        line = line.strip()
        if not line or line.startswith("#"):
            return True
        name, _, rest = line.partition(" ")
        fn = self.commands.get(name)
        mark = self.client.mark()
        try:
            if fn is None:
                raise CommandError(f"unknown command '{name}' (try: help)")
            result = fn(rest.strip())
        except (CommandError, DapError, TimeoutError) as exc:
            self.failures += 1
            self._emit(line, None, error=exc.message if isinstance(exc, DapError) else str(exc), mark=mark)
            return True
        if result is None:
            return False
        self._emit(line, result, mark=mark)
        return True

    def _emit(self, line: str, result: Result | None, error: str | None = None, mark: int | None = None) -> None:
        output = [body["output"] for name, body in self.client.events_since(mark)
                  if name == "output"] if mark is not None else []
        if self.json_mode:
            record: dict[str, Any] = {"command": line, "ok": error is None}
            record.update({"error": error} if error else {"result": result.data})
            if output:
                record["output"] = output
            print(json.dumps(record, default=str), file=self.out, flush=True)
            return
        for text in output:
            self.out.write(text if text.endswith("\n") else text + "\n")
        print(f"error: {error}" if error else result.text, file=self.out, flush=True)

    # -- moving ------------------------------------------------------------------------------------
    def _motion(self, command: str, arguments: dict | None = None) -> Result:
        mark = self.client.mark()
        try:
            self.client.request(command, {"threadId": self.thread, **(arguments or {})})
        except DapError as exc:
            if "engine ended" not in exc.message:
                raise
            return self._engine_ended(self.client.wait_for("terminated", after=mark, timeout=10))
        return self._stopped(mark)

    def _stopped(self, mark: int) -> Result:
        """Wait for the stop that follows a motion (Ctrl-C pauses it) and say where it is."""
        try:
            event, stop = self.client.wait_for_any(("stopped", "terminated"), after=mark)
        except KeyboardInterrupt:
            self.client.request("pause", {"threadId": self.thread})
            event, stop = self.client.wait_for_any(("stopped", "terminated"), after=mark)
        if event == "terminated":
            return self._engine_ended(stop)
        self.frame = 0  # a stop shows its top frame, as a debugger does
        # and selects the thread it is about (a rank; a kernel's program: its kernel line), as gdb selects the thread
        # that stopped: the next commands read and step it
        self.thread = stop.get("threadId", 1)
        here, tick, frame = self._top()
        numbers = [bp.number for bp in self.breakpoints if bp.server_id in stop.get("hitBreakpointIds", [])]
        data = {"reason": stop["reason"], "description": stop.get("description", ""), **here, "breakpoints": numbers}
        text = f"{tick} {stop.get('description') or stop['reason']}: {frame}"
        if stop["reason"] == "exception":
            info = self.client.request("exceptionInfo", {"threadId": self.thread})
            data["exception"] = info
            text += f"\n  {info['details']['stackTrace']}".replace("\n", "\n  ")
        return Result(text, data)

    def _top(self) -> tuple[dict, str, str]:
        """The selected thread's tick and top frame: as data, as `[tick 3]` (with ranks `[rank 1, tick 3]`: each
        rank counts its own ticks), and as the frame's name over its source line."""
        position = self.client.request("timeline", {"count": 0, **self._of_rank()})["position"]
        frames = self._frames(levels=1)
        frame = frames[0] if frames else {"name": "?", "line": 0}
        path = frame.get("source", {}).get("path")
        data = {**({"rank": self.thread - 1} if self.ranks else {}), "tick": position,
                "frame": {"name": frame["name"], "file": path, "line": frame["line"]}}
        shown = frame["name"] + (f"\n  {Path(path).name}:{frame['line']}  {self._source_line(path, frame['line'])}"
                                 if path else "")
        return data, f"[rank {self.thread - 1}, tick {position}]" if self.ranks else f"[tick {position}]", shown

    def _frames(self, **arguments: int) -> list[dict]:
        """The selected thread's stack (with ranks, the selected rank's)."""
        return self.client.request("stackTrace", {"threadId": self.thread, **arguments})["stackFrames"]

    def _frame_id(self, level: int | None = None) -> int:
        """The DAP id of the selected thread's frame #level (default: the selected frame); docs/protocol.md."""
        return (self.thread - 1) * FRAMES_PER_THREAD + (self.frame if level is None else level) + 1

    def _of_rank(self) -> dict:
        """The optional `threadId` of Rewind's requests about ticks: with ranks the selected rank's (each rank
        counts its own ticks); one process's threads share its timeline, so none."""
        return {"threadId": self.thread} if self.ranks else {}

    def cmd_continue(self, args: str) -> Result:
        return self._motion("continue")

    def cmd_next(self, args: str) -> Result:
        return self._node_forward() if self._granularity(args) == "node" else self._step("next", args)

    def cmd_step(self, args: str) -> Result:
        return self._node_forward() if self._granularity(args) == "node" else self._step("stepIn", args)

    def cmd_finish(self, args: str) -> Result:
        return self._motion("stepOut")

    def cmd_back(self, args: str) -> Result:
        return self._node_back() if self._granularity(args) == "node" else self._step("stepBack", args)

    def cmd_rc(self, args: str) -> Result:
        return self._motion("reverseContinue")

    def _step(self, command: str, args: str) -> Result:
        granularity = self._granularity(args)
        return self._motion(command, {"granularity": granularity} if granularity else {})

    @staticmethod
    def _granularity(args: str) -> str | None:
        """A motion's unit: None (a line of source, the default), `node` or `instruction` (one node on the torch
        driver, one chip instruction on the sim chip)."""
        if args in ("", "line", "statement"):
            return None
        if args in ("node", "tick", "instruction"):
            return "instruction" if args == "instruction" else "node"
        raise CommandError(f"unknown step '{args}' (line, node, instruction)")

    def _node_forward(self) -> Result:
        """One node on, on any chip: the first of the line's step-in targets, or, on the line's last node, the
        next line (which begins at the next node)."""
        targets = self.client.request("stepInTargets", {"frameId": self._frame_id(0)})["targets"]
        if not targets:
            return self._motion("next")
        return self._motion("stepIn", {"targetId": targets[0]["id"]})

    def _node_back(self) -> Result:
        """One node back, on any chip: to where the node before began (on the sim chip, inside a node: to where
        this one began), by its tick (goto's target ids are tick + 1)."""
        position = self.client.request("timeline", {"count": 0, **self._of_rank()})["position"]
        try:
            # steps of the node run so far, on the sim chip
            inside = self.client.request("units", self._of_rank())["instruction"]
        except DapError:
            inside = 0
        tick = position if inside else position - 1
        if tick < 0:
            raise CommandError("at tick 0 already: no node before it")
        return self._motion("goto", {"targetId": tick + 1})

    def cmd_goto(self, args: str) -> Result:
        """goto FILE:LINE [N]: the N-th tick (1-based, default 1) where that line runs; goto step N: the start of
        training step N (from 0)."""
        parts = args.split()
        if parts[:1] == ["step"]:
            step = whole_number(" ".join(parts[1:]), "usage: goto step N, N a training step from 0")
            return self._motion("gotoStep", {"step": step})
        if not parts or ":" not in parts[0]:
            raise CommandError("usage: goto FILE:LINE [N] | goto step N")
        path, line = self._file_line(parts[0])
        n = whole_number(" ".join(parts[1:]), "usage: goto FILE:LINE [N], N from 1", least=1) if len(parts) > 1 else 1
        targets = self.client.request("gotoTargets", {"source": {"path": path}, "line": line,
                                                      **self._of_rank()})["targets"]  # the selected rank's ticks
        if not 1 <= n <= len(targets):
            raise CommandError(f"{parts[0]} runs {len(targets)} time(s); pick 1..{len(targets)}")
        return self._motion("goto", {"targetId": targets[n - 1]["id"]})

    def cmd_restore(self, args: str) -> Result:
        tick = whole_number(args, "usage: restore TICK (see: checkpoints)")
        mark = self.client.mark()
        self.client.request("restoreCheckpoint", {"tick": tick, **self._of_rank()})
        return self._stopped(mark)

    # -- breakpoints ---------------------------------------------------------------------------------
    def cmd_break(self, args: str) -> Result:
        """break FILE:LINE [MODE] [if COND] | break LINE [MODE] [if COND] (a line of the file the top frame shows) |
        break NODE-OR-OP-OR-MODULE [MODE] [if COND] | break (list). A module is its path as written from the user's
        variable (model.layers[1].mlp, layers.1.mlp) or its class (LlamaRMSNorm: each instance); the server resolves
        it against the Program. MODE: forward, backward or both, the nodes of a training step it stops in."""
        if not args:
            text = "\n".join(bp.describe() for bp in self.breakpoints) or "no breakpoints"
            return Result(text, {"breakpoints": [vars(bp) for bp in self.breakpoints]})
        where, _, condition = args.partition(" if ")
        where, mode = _mode_of(where.strip())
        number = self._numbered + 1  # taken below, once the breakpoint is made
        if where.isascii() and where.isdigit():
            where = f"{self._shown_file()}:{where}"
        if ":" in where and where.rsplit(":", 1)[1].isdigit():
            path, line = self._file_line(where)
            bp = ConsoleBreakpoint(number, "line", path, line, condition.strip() or None, mode)
        else:
            bp = ConsoleBreakpoint(number, "function", where, None, condition.strip() or None, mode)
        self._numbered = number
        self.breakpoints.append(bp)
        self._sync(bp)
        return Result(bp.describe(), vars(bp))

    def cmd_condition(self, args: str) -> Result:
        """condition N [EXPR]: set (or, without EXPR, clear) breakpoint N's condition."""
        number, _, expr = args.partition(" ")
        bp = self._find(number)
        bp.condition = expr.strip() or None
        self._sync(bp)
        return Result(bp.describe(), vars(bp))

    def cmd_delete(self, args: str) -> Result:
        bp = self._find(args)
        self.breakpoints.remove(bp)
        self._sync(bp)
        return Result(f"deleted breakpoint {bp.number}", {"deleted": bp.number})

    def _find(self, number: str) -> ConsoleBreakpoint:
        for bp in self.breakpoints:
            if str(bp.number) == number.strip():
                return bp
        raise CommandError(f"no breakpoint {number or '(give a number)'}")

    def _sync(self, changed: ConsoleBreakpoint) -> None:
        """Send the whole set of breakpoints of the kind (and file) that changed, as DAP wants."""
        if changed.kind == "line":
            same = [bp for bp in self.breakpoints if bp.kind == "line" and bp.where == changed.where]
            answer = self.client.request("setBreakpoints", {"source": {"path": changed.where},
                                                            "breakpoints": [bp.spec() for bp in same]})
        else:
            same = [bp for bp in self.breakpoints if bp.kind == "function"]
            answer = self.client.request("setFunctionBreakpoints", {"breakpoints": [bp.spec() for bp in same]})
        for bp, got in zip(same, answer["breakpoints"]):
            bp.server_id, bp.verified, bp.message = got.get("id"), got["verified"], got.get("message")
            if bp.kind == "line" and got.get("line"):
                bp.line = got["line"]

    def _shown_file(self) -> str:
        """The source file of the innermost frame that has one (where `break LINE` sets its breakpoint)."""
        frames = self._frames()
        path = next((f["source"]["path"] for f in frames if f.get("source", {}).get("path")), None)
        if path is None:
            raise CommandError("no source file is shown here: give the file too, break FILE:LINE")
        return path

    def _file_line(self, text: str) -> tuple[str, int]:
        file, _, line = text.rpartition(":")
        return self._path(file), whole_number(line, f"'{text[:60]}' is not FILE:LINE, LINE a line number")

    def _path(self, file: str) -> str:
        """A file as typed: a path from here, or the name of one of the program's sources."""
        if Path(file).is_file():
            return str(Path(file).resolve())
        sources = self.client.request("loadedSources")["sources"]
        for source in sources:
            if source["path"].endswith("/" + file) or Path(source["path"]).name == file:
                return source["path"]
        names = ", ".join(Path(s["path"]).name for s in sources)
        raise CommandError(f"no file '{file}' here or among the program's sources ({names})")

    # -- inspecting -----------------------------------------------------------------------------------
    def cmd_print(self, args: str) -> Result:
        if not args:
            raise CommandError("usage: print EXPR")
        body = self.client.request("evaluate", {"expression": args, "context": "repl", "frameId": self._frame_id()})
        return Result(f"{args} = {body['result']}", dict(body))

    def cmd_locals(self, args: str) -> Result:
        scopes = self.client.request("scopes", {"frameId": self._frame_id()})["scopes"]
        scope = next(s for s in scopes if s["name"] == "Locals")
        variables = self.client.request("variables", {"variablesReference": scope["variablesReference"]})["variables"]
        text = "\n".join(f"{v['name']} = {v['value']}" for v in variables) or "no source variables in this frame yet"
        return Result(text, {"locals": {v["name"]: v["value"] for v in variables}})

    def cmd_where(self, args: str) -> Result:
        frames = self._frames()
        lines = [("* " if i == self.frame else "  ") + self._frame_text(i, f) for i, f in enumerate(frames)]
        return Result("\n".join(lines), {"frames": frames, "selected": self.frame})

    def _frame_text(self, level: int, frame: dict) -> str:
        """`#1 Block.forward [blocks.0]  gpt.py:54  x = x + self.attn(self.ln1(x))`."""
        text = f"#{level} {frame['name']}"
        path = frame.get("source", {}).get("path")
        if path:
            text += f"  {Path(path).name}:{frame['line']}  {self._source_line(path, frame['line'])}".rstrip()
        return text

    def cmd_up(self, args: str) -> Result:
        """up [N]: N frames out, towards the caller (print, locals, prov and locate then read that frame)."""
        return self._select(self.frame + self._count("up", args))

    def cmd_down(self, args: str) -> Result:
        """down [N]: N frames in, towards the node about to run."""
        return self._select(self.frame - self._count("down", args))

    def cmd_frame(self, args: str) -> Result:
        """frame [N]: select frame #N of `where` (without N: say which frame is selected)."""
        if not args:
            return self._select(self.frame)
        return self._select(whole_number(args, "usage: frame N, a frame number that `where` shows"))

    @staticmethod
    def _count(command: str, args: str) -> int:
        return whole_number(args, f"usage: {command} [N], N a number of frames of 1 or more", least=1) if args else 1

    def _select(self, level: int) -> Result:
        frames = self._frames()
        if not 0 <= level < len(frames):
            if level < 0:
                raise CommandError("already at the innermost frame (#0): `up` goes to its callers")
            raise CommandError(f"no frame #{level}: the stack has {len(frames)} frame(s), #0 (innermost) to "
                               f"#{len(frames) - 1} (outermost)")
        self.frame = level
        frame = frames[level]
        path = frame.get("source", {}).get("path")
        data = {"frame": level, "name": frame["name"], "file": path, "line": frame["line"]}
        return Result(self._frame_text(level, frame), data)

    def cmd_rank(self, args: str) -> Result:
        """rank [N]: select rank N, as gdb's `thread N` selects a thread: the commands that read values, the stack or
        ticks then ask rank N, and next, step, back and finish step it (every rank moving, through consistent cuts);
        each stop selects the rank it is about. Without N: where the selected rank is."""
        if not self.ranks:
            raise CommandError(ONE_PROCESS)
        if args:
            rank = whole_number(args, f"usage: rank N, N a rank of 0..{self.ranks - 1}")
            if rank >= self.ranks:
                raise CommandError(f"no rank {rank}: this session has ranks 0..{self.ranks - 1}")
            self.thread, self.frame = rank + 1, 0
        here, tick, frame = self._top()
        return Result(f"{tick} {frame}", here)

    def cmd_ranks(self, args: str) -> Result:
        """ranks: every rank's position, from the `collectives` request (docs/protocol.md)."""
        if args:
            raise CommandError(f"usage: ranks, with no arguments (got '{args[:40]}'; `rank N` selects one)")
        if not self.ranks:
            raise CommandError(ONE_PROCESS)
        body = self.client.request("collectives", {})
        return Result(describe_ranks(body["ranks"], self.thread - 1), {**body, "selected": self.thread - 1})

    def cmd_locate(self, args: str) -> Result:
        if not args:
            raise CommandError("usage: locate NAME")
        placement = self.client.request("locate", {"name": args, "frameId": self._frame_id()})
        return Result(describe_placement(args, placement), dict(placement))

    def cmd_prov(self, args: str) -> Result:
        if not args:
            raise CommandError("usage: prov NAME")
        prov = self.client.request("provenance", {"name": args, "frameId": self._frame_id(), "maxHistory": 8})
        return Result(describe_provenance(args, prov), dict(prov))

    def cmd_checkpoints(self, args: str) -> Result:
        cps = self.client.request("checkpoints", self._of_rank())["checkpoints"]
        text = "\n".join(f"tick {c['tick']}: {c['values']} values, {c['bytes']} bytes ({c['tier']})" for c in cps)
        return Result(text or "no checkpoints", {"checkpoints": cps})

    def cmd_save(self, args: str) -> Result:
        """save FILE [--overwrite]: an existing FILE is replaced only with --overwrite, or when the user at
        the terminal answers yes; from a script, a pipe or in --json mode it is kept and the command fails.
        With ranks FILE is the index of the ranks' traces, each saved beside it (FILE.rank0.rwtrace, …): the file
        said to exist is the one the server names, the index or a rank's trace."""
        path = re.sub(r"(^|\s)--overwrite(?=\s|$)", " ", args).strip()
        overwrite = path != args.strip()
        if not path:
            raise CommandError("save needs a file: save FILE [--overwrite]")
        try:
            info = self.client.request("saveTrace", {"path": path, **({"overwrite": True} if overwrite else {})})
        except DapError as exc:
            found = _EXISTS.fullmatch(exc.message)
            if overwrite or found is None:
                raise
            existing = found["path"]
            if self.ask is None:
                raise CommandError(f"{existing} exists and is kept; `save {path} --overwrite` replaces it") from None
            if not self.ask(f"{existing} exists: replace it? [y/N] "):
                return Result(f"not saved: {existing} is kept", {"saved": False, "path": existing})
            info = self.client.request("saveTrace", {"path": path, "overwrite": True})
        saved = dict(info)
        return Result(describe_saved(saved), saved)

    def _engine_ended(self, terminated: dict) -> Result:
        """The session's engine ended under a motion (a crash, a fault): offer the recording it left, if any."""
        self.recording = (terminated.get("restart") or {}).get("trace")
        if self.recording and self.ask is not None and self.ask(
                f"The debug session's engine ended. Reopen the recording {self.recording} at its last complete "
                "step? [y/N] "):
            return self.cmd_reopen("")
        hint = f"; `reopen` opens the recording it left, {self.recording}" if self.recording else ""
        raise CommandError(f"the debug session's engine ended{hint}")

    def cmd_reopen(self, _rest: str) -> Result:
        """After the engine ended while recording: the recording, with the same breakpoints, from tick 0."""
        if not self.recording:
            raise CommandError("nothing to reopen: `reopen` follows an engine that ended while recording")
        mark = self.client.mark()
        self.client.request("restart", {})
        return self._stopped(mark)

    def _source_line(self, path: str, line: int) -> str:
        if path not in self._sources:
            try:
                content = self.client.request("source", {"source": {"path": path}, "sourceReference": 0})["content"]
            except DapError:
                content = ""
            self._sources[path] = content.splitlines()
        lines = self._sources[path]
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def cmd_help(self, args: str) -> Result:
        """help [COMMAND] [--json]: from the registry, so every command is there; --json prints the data as JSON."""
        words = args.split()
        as_json = "--json" in words
        asked = [w for w in words if w != "--json"]
        chosen = [c for c in self.registry if not asked or asked[0] in c.names]
        if len(asked) > 1 or not chosen:
            raise CommandError(f"usage: help [COMMAND] [--json] (no command '{' '.join(asked)[:40]}')")
        data = {"commands": [c.to_dict() for c in chosen], "names": NAMES}
        if as_json:
            return Result(json.dumps(data), data)
        lines = [line for c in chosen for line in (c.syntax, f"    {c.summary}")]
        return Result("\n".join(lines + ([] if asked else ["", NAMES])), data)

    def cmd_quit(self, args: str) -> None:
        return None

    # -- input ---------------------------------------------------------------------------------------------
    def prompt(self) -> str:
        """`(rewind) `; with ranks, the selected one's: `(rewind rank 1) `."""
        return f"(rewind rank {self.thread - 1}) " if self.ranks else PROMPT

    def run_script(self, path: str) -> None:
        for line in Path(path).read_text().splitlines():
            if line.strip() and not line.strip().startswith("#") and not self.json_mode:
                print(f"{self.prompt()}{line.strip()}", file=self.out, flush=True)
            if not self.execute(line):
                return

    def interactive(self, stdin: TextIO) -> None:
        tty = stdin.isatty()
        if tty:
            _enable_history()
            if not self.json_mode:
                self.ask = ask_yes_no
        while True:
            try:
                line = input(self.prompt()) if tty else stdin.readline()
                if (not tty and not line) or not self.execute(line):
                    return
            except EOFError:
                return
            except KeyboardInterrupt:  # Ctrl-C drops the line (a motion has already been paused), as in a shell
                print(file=self.out)


def describe_placement(name: str, placement: dict) -> str:
    """Where a value lives, a line per shard (`locate`); a kernel's tensor or element, then what programs did to it."""
    lines = [f"{name} ({placement['value']}): {s['dtype']}{s['shape']} in {s['space']} of {s['chip']} "
             f"at 0x{s['address']:x}, {s['nbytes']} bytes, strides {s['strides']}, unit {s['unit']}"
             for s in placement["shards"]]
    kernel = placement.get("kernel")
    if kernel is not None:
        lines += describe_kernel_element(kernel) if "element" in kernel else describe_kernel_writers(kernel)
    return "\n".join(lines)


def describe_kernel_element(found: dict) -> list[str]:
    """An element of a kernel's tensor (`locate out_ptr[37]`): its index, the last write and read, every write."""
    lines = [f"  element {found['index']} of {found['tensor']} {found['dtype']}{found['shape']}, "
             f"{_launch_steps(found)}",
             "  last write: " + (_access(found["lastWrite"]) if found["lastWrite"] else found["lastWriteReason"]),
             "  last read: " + (_access(found["lastRead"]) if found["lastRead"] else found["lastReadReason"])]
    if found["totalWrites"]:
        lines.append(f"  {found['totalWrites']} write(s)" + (f" ({found['truncated']})" if "truncated" in found else "")
                     + ":")
        lines += [f"    {_access(w)}" for w in found["writes"]]
    return lines


def describe_kernel_writers(found: dict) -> list[str]:
    """A kernel's tensor (`locate out_ptr`): which programs wrote which elements."""
    lines = [f"  {found['written']} of {found['elements']} element(s) written, {_launch_steps(found)}"]
    if not found["writers"]:
        return lines + [f"  {found['writersReason']}"]
    for w in found["writers"]:
        ranges = ", ".join(f"{a}..{b - 1}" if b - a > 1 else str(a) for a, b in w["ranges"])
        more = f", … {w['totalRanges']} ranges in all" if w["totalRanges"] > len(w["ranges"]) else ""
        atomic = ", atomic" if w["atomic"] else ""
        lines.append(f"  {w['thread']} wrote {w['elements']} element(s): {ranges}{more} (line "
                     f"{', '.join(str(n) for n in w['lines'])}{atomic})")
    if "truncated" in found:
        lines.append(f"  ({found['truncated']})")
    return lines


def _launch_steps(found: dict) -> str:
    return f"after {found['steps']} of the launch's {found['launchSteps']} steps"


def _access(a: dict) -> str:
    """`program (1, 0, 0) at line 19, step 93 (store): 0.462504`."""
    value = f"{a['value']:.6g}" if isinstance(a["value"], float) else str(a["value"])
    return f"{a['thread']} at line {a['line']}, step {a['step']} ({a['kind']}): {value}"


def describe_saved(saved: dict) -> str:
    """What `save` wrote (saveTrace's answer): a trace's ticks, file and size; with ranks, the index's file and
    size, then a line per rank's trace."""
    if "ranks" not in saved:
        return f"saved {saved['ticks']} ticks to {saved['path']} ({saved['bytes']} bytes)"
    rows = [f"  rank {r['rank']}: {r['ticks']} ticks to {r['path']} ({r['bytes']} bytes)" for r in saved["ranks"]]
    return "\n".join([f"saved the index of {len(rows)} ranks' traces to {saved['path']} ({saved['bytes']} bytes)",
                      *rows])


def describe_ranks(ranks: list[dict], selected: int) -> str:
    """Each rank's position (`ranks`), * marking the selected rank: its tick, how many collectives, sends and recvs
    it has run, the one it waits at (else the one it runs next), and who that one runs with."""
    ops = {r["rank"]: [c["op"] for c in r["collectives"]] for r in ranks}
    rows = []
    for r in ranks:
        at, collective = _waits_at(r)
        partners = _runs_with(collective, ops) if collective else ""
        rows.append(["*" if r["rank"] == selected else "", str(r["rank"]), str(r["tick"]),
                     f"{r['passed']} of {len(r['collectives'])}", at, partners])
    return "\n".join(table(["", "rank", "tick", "ran", "at", "with"], rows, indent=""))


def _waits_at(rank: dict) -> tuple[str, dict | None]:
    """What a rank waits at (before its next collective, send or recv; after its last, going back), else what it
    runs next; and that collective."""
    run, passed = rank["collectives"], rank["passed"]
    if rank["waits"] == "after":
        return f"waits after {run[passed - 1]['description']}", run[passed - 1]
    if passed == len(run):
        return "runs on: no collective, send or recv left", None
    waits = "waits before" if rank["waits"] == "before" else "runs on to"
    return f"{waits} {run[passed]['description']}", run[passed]


def _runs_with(collective: dict, ops: dict[int, list[str]]) -> str:
    """Who a collective, send or recv runs with: a send's or recv's partner by its own number there (`rank 0's
    isend #1`), a collective's peers in its group (`ranks 0, 2`); a rank with none to match it, said."""
    missing = [f"rank {p['rank']} has none to match it" for p in collective["partners"] if p["number"] is None]
    found = [p for p in collective["partners"] if p["number"] is not None]
    if collective["transfers"]:
        words = [f"rank {p['rank']}'s {ops[p['rank']][p['number'] - 1]} #{p['number']}" for p in found]
    else:
        words = [f"rank{'s' if len(found) > 1 else ''} {', '.join(str(p['rank']) for p in found)}"] if found else []
    return "; ".join(words + missing)


def describe_provenance(name: str, prov: dict) -> str:
    """Who wrote a value, and its lineage (`prov`)."""
    last = prov["lastWriter"]
    if last is None:
        text = f"{name} ({prov['value']}): a {prov['kind']}, not written before this tick"
    else:
        where = f" at {Path(last['source']['file']).name}:{last['source']['line']}" if last["source"] else ""
        who = f"{last['op']} ('{last['node']}')" if last["node"] else "a user edit"
        text = (f"{name} ({prov['value']}) was written by {who}{where} at tick {last['tick']} "
                f"on {last['unit']} into {last['location']['space']} 0x{last['location']['address']:x}")
    lineage = prov["lineage"]
    return text + (f"\n  lineage: {len(lineage['nodes'])} node(s) back to {len(lineage['roots'])} root(s): "
                   f"{', '.join(lineage['roots'][:6])}{', …' if len(lineage['roots']) > 6 else ''}")


def _mode_of(where: str) -> tuple[str, str | None]:
    """`model.py:24 backward` -> ("model.py:24", "backward"): a breakpoint's place and the mode after it."""
    place, _, last = where.rpartition(" ")
    return (place.strip(), last) if place and last in BREAKPOINT_MODES else (where, None)


def _working_directory() -> str | None:
    """Where the user runs the console (None when that folder was removed since)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def ask_yes_no(question: str) -> bool:
    """A question at the terminal; yes only when the answer is y or yes (end of input is no)."""
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _enable_history() -> None:
    try:
        import atexit
        import readline
    except ImportError:
        return
    try:
        readline.read_history_file(HISTORY)
    except OSError:
        pass
    readline.set_history_length(1000)
    atexit.register(lambda: _save_history(readline))


def _save_history(readline) -> None:
    try:
        readline.write_history_file(HISTORY)
    except OSError:
        pass


def run(target: dict, driver: str, entry: str, script: str | None, json_mode: bool) -> int:
    """`target` is {"program": FILE[, "record": TRACE]} or {"trace": TRACE}."""
    quiet_debugpy_log()
    client = DapClient.spawn()
    console = Console(client, sys.stdout, json_mode)
    try:
        console.start(target, driver, entry)
        if script:
            console.run_script(script)
        else:
            console.interactive(sys.stdin)
    except (DapError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        tail = "\n".join(client.stderr_tail)
        if tail:
            print(f"server log:\n{tail}", file=sys.stderr)
        return 1
    finally:
        try:
            client.request("disconnect", {"terminateDebuggee": True}, timeout=10)
        except (DapError, TimeoutError):
            pass
        client.close()
    return 1 if console.failures else 0

