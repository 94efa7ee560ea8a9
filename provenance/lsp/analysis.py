"""The language server's Session: launched on the user's program, run to the end, its problems collected.

One worker thread owns the Session (as in the debug adapter), so the server's event loop keeps
answering while a program is exported and run.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from hardware.errors import RewindError, program_stopped_itself
from hardware.session import LaunchOptions, Session
from provenance.problems import Problem, collect
from provenance.line_writes import LineWrite, line_writes


class AnalysisOptions(BaseModel):
    """What to analyse: the launch attributes of a `rewind` debug configuration that select the run,
    a program to run or a trace of a recorded run."""

    model_config = ConfigDict(extra="forbid", strict=True)
    program: str | None = None
    trace: str | None = None
    entry: str = "build"
    driver: str = "auto"
    reference: str | None = None  # what the run is compared with (default: the program in float64 on the CPU)
    budgetMB: float = 512.0
    seed: int = 0  # sim chip: the seed of a random schedule
    schedule: str = "round-robin"  # sim chip: round-robin or random
    faults: list[dict] = []  # sim chip: injected faults

    @classmethod
    def parse(cls, raw: Any) -> "AnalysisOptions":
        if not isinstance(raw, dict):
            raise RewindError(f"analysis options must be an object with 'program', got {raw!r}")
        try:
            options = cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg'].lower()}"
                                 for e in exc.errors())
            raise RewindError(f"bad analysis options ({problems}); known: {', '.join(cls.model_fields)}") from None
        if (options.program is None) == (options.trace is None):
            raise RewindError("analysis options need one of 'program' (a model file to run) and 'trace' "
                              f"(a recorded run), got {raw!r}")
        return options

    def launch_options(self) -> LaunchOptions:
        path = Path(self.trace or self.program)
        if not path.is_file():
            raise RewindError(f"{'trace' if self.trace else 'program'} file '{path}' does not exist")
        run = {"trace": str(path.resolve())} if self.trace else {"program": str(path.resolve()), "entry": self.entry}
        return LaunchOptions(**run, driver=self.driver, budget_mb=self.budgetMB, reference=self.reference,
                             seed=self.seed, schedule=self.schedule, faults=self.faults)


@dataclass(frozen=True)
class Result:
    run: str  # the program or trace file
    ticks: int
    problems: list[Problem]
    files: list[str]  # the user source files of the program


class Analysis:
    def __init__(self) -> None:
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewind-lsp-session")
        self.session: Session | None = None
        self.result: Result | None = None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.worker, fn, *args)

    def analyse(self, options: AnalysisOptions) -> Result:
        """Launch the program (or open the trace), run it to the end and collect its problems
        (replaces any earlier run)."""
        launch = options.launch_options()
        session = Session()
        try:
            session.launch(launch)
        except (SystemExit, KeyboardInterrupt) as exc:  # the program's own act: the language server goes on
            raise RewindError(program_stopped_itself(exc, f"Rewind loaded {launch.program}")) from None
        session.goto(session.end)
        self.session = session
        self.result = Result(launch.trace or launch.program, session.end, collect(session), session.program.files())
        return self.result

    def goto(self, tick: int) -> int:
        """Move the position the hovers describe (the debugger's current tick)."""
        self._session().goto(tick)
        return tick

    def writes(self, file: str, line: int) -> tuple[int, int, list[LineWrite]]:
        """(position, end, what file:line wrote by the position)."""
        session = self._session()
        return session.position, session.end, line_writes(session, file, line)

    def _session(self) -> Session:
        if self.session is None:
            raise RewindError("no program analysed yet: give 'program' in initializationOptions "
                              "or run the rewind.analyse command")
        return self.session
