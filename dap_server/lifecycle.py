"""initialize, launch, configurationDone, restart, terminate, disconnect, cancel.

`initialized` is sent once launch has loaded the Program, so breakpoints set during
configuration bind to real lines at once. At the end of the program the session stays
(stopped, reason `end`) so the user can go back; `terminated` comes only on terminate or
disconnect.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dap_server import paths
from dap_server.breakpoints import changed_line_breakpoints
from dap_server.requests import Arguments, StrictArguments, capabilities, capability, request
from hardware.errors import RewindError
from hardware.ranks.join import address_of
from hardware.ranks.launcher import MAX_RANKS
from hardware.ranks.session import RankedSession
from hardware.ranks.traces import index_ranks
from hardware.session import LaunchOptions

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class InitializeArguments(Arguments):
    adapterID: str
    clientID: str | None = None
    clientName: str | None = None
    linesStartAt1: bool = True
    columnsStartAt1: bool = True
    pathFormat: str = "path"
    supportsProgressReporting: bool = False
    supportsInvalidatedEvent: bool = False
    supportsMemoryEvent: bool = False


@request("initialize", on_loop=True)
def initialize(adapter: "RequestContext", args: InitializeArguments) -> dict:
    client = adapter.client
    client.progress = args.supportsProgressReporting
    client.invalidated = args.supportsInvalidatedEvent
    client.memory_event = args.supportsMemoryEvent
    client.lines_start_at_1 = args.linesStartAt1
    client.columns_start_at_1 = args.columnsStartAt1
    return capabilities()


class CheckpointOptions(StrictArguments):
    budgetMB: float = Field(1024.0, gt=0)
    every: int | None = Field(None, ge=1)
    hostMB: float = Field(0.0, ge=0)  # host tier (lz4) the ring spills into; 0: none
    diskMB: float = Field(0.0, ge=0)  # disk tier below it; 0: none
    spillDir: str | None = None  # where the disk tier's spill file goes (default: the temp directory)
    checkBatch: int | None = Field(None, ge=1)  # writes whose on-device checks are read back together
    devicePool: bool | None = None  # copy checkpoints into a preallocated device pool (default: on a GPU)
    # run the stretches of a motion where no stop can come keeping only the write log and what checkpoints need,
    # other values recomputed when asked (hardware/session/fast_forward.py); false: every value retained as it runs;
    # default false: see docs/fast-forward.md
    fastForward: bool = False


# Attributes every VS Code launch configuration may carry; they mean nothing to the adapter.
_CLIENT_ATTRIBUTES = {"type", "request", "name", "noDebug", "presentation", "preLaunchTask", "postDebugTask",
                      "internalConsoleOptions", "debugServer", "suppressMultipleSessionWarning", "serverReadyAction",
                      "python"}  # the last one: how the Rewind extension starts the adapter


class LaunchArguments(StrictArguments):
    cwd: str | None = None  # the folder relative paths resolve against (default: the session's; dap_server/paths.py)
    program: str | None = None  # the model file; or `trace` instead
    trace: str | None = None  # open a recorded trace, or the index of many ranks' traces: no device needed
    record: str | None = None  # record every step to this trace file while running
    overwrite: bool = False  # with record: replace an existing file there (when the recording is closed)
    entry: str = "build"  # train_step: a training step (forward, backward, the optimizer's update)
    steps: int = Field(1, ge=1)  # training steps, one after another on the tick axis
    breakpointMode: Literal["forward", "backward", "both"] = "forward"  # a training step's nodes breakpoints stop in
    driver: str = "auto"  # auto, torch:cpu, torch:cuda, torch:cuda:N (the driver names its own errors)
    stopOnEntry: bool = False
    checkpoint: CheckpointOptions = CheckpointOptions()
    reference: str | None = None  # forensics: torch:cpu:float64 (default), a trace, or saved values
    rtol: float | None = Field(None, ge=0)  # tolerances against the reference (default: by dtype)
    atol: float | None = Field(None, ge=0)
    ranks: int | None = Field(None, ge=1, le=MAX_RANKS)  # torch.distributed: one engine per rank (dap_server/ranks.py)
    rankTimeout: float = Field(60.0, gt=0, le=86400)  # with ranks: seconds a rank may take to answer, then reported
    replicas: list[str] | None = None  # with ranks: values that must stay identical on every rank (docs/ranks.md)
    rendezvous: str | None = None  # with ranks: host:port where the coordinator serves the ranks' rendezvous
    join: str | None = None  # with ranks: host:port where ranks started by torchrun on any host join (docs/ranks.md)
    seed: int = 0  # sim chip: seed of a random schedule
    schedule: Literal["round-robin", "random"] = "round-robin"  # sim chip: how units' steps interleave
    faults: list[dict[str, Any]] = []  # sim chip: planted faults (docs/sim.md); the driver checks them

    @model_validator(mode="after")
    def _program_or_trace(self) -> "LaunchArguments":
        if (self.program is None) == (self.trace is None):
            raise ValueError("launch needs exactly one of 'program' (a model file) and 'trace' (a recorded trace)")
        if self.replicas is not None and self.ranks is None and self.trace is None:
            raise ValueError("'replicas' compares values across ranks: give 'ranks' too")
        if self.rendezvous is not None and self.trace is not None:
            raise ValueError("a trace of ranks has no rendezvous: its ranks meet on loopback (drop 'rendezvous')")
        if self.rendezvous is not None and self.ranks is None:
            raise ValueError("'rendezvous' is where ranks meet: give 'ranks' too")
        if self.join is not None and (self.ranks is None or self.trace is not None):
            raise ValueError("'join' is where ranks started by torchrun join a running program: give 'ranks' and "
                             "'program' (a trace's ranks are started here)")
        if self.trace is not None and self.record is not None:
            raise ValueError("'record' records a running program; a trace opened with 'trace' is already recorded")
        if self.overwrite and self.record is None:
            raise ValueError("'overwrite' replaces an existing 'record' file: give 'record' too, or drop 'overwrite'")
        return self

    @field_validator("rendezvous", "join")
    @classmethod
    def _host_and_port(cls, address: str | None, info: ValidationInfo) -> str | None:
        if address is not None:
            try:
                address_of(address, info.field_name, "127.0.0.1:29500")
            except RewindError as exc:
                raise ValueError(str(exc)) from None
        return address

    @property
    def source(self) -> str:
        return self.program or self.trace or ""

    @model_validator(mode="before")
    @classmethod
    def _drop_client_attributes(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in _CLIENT_ATTRIBUTES and not k.startswith("__")}
        return data

    def options(self, cwd: str) -> LaunchOptions:
        """The Session's options, every path the client gave resolved against `cwd`."""
        def path(p: str | None) -> str | None:
            return paths.absolute(p, cwd)

        reference = self.reference if self.reference is None or self.reference.startswith("torch:") \
            else path(self.reference)  # a driver (torch:cpu:float64), or a file: a trace or saved values
        return LaunchOptions(program=path(self.program) or "", trace=path(self.trace), record=path(self.record),
                             overwrite=self.overwrite, entry=self.entry, steps=self.steps,
                             breakpoint_mode=self.breakpointMode,
                             driver=self.driver, budget_mb=self.checkpoint.budgetMB, every=self.checkpoint.every,
                             host_mb=self.checkpoint.hostMB, disk_mb=self.checkpoint.diskMB,
                             spill_dir=path(self.checkpoint.spillDir),
                             check_batch=self.checkpoint.checkBatch, device_pool=self.checkpoint.devicePool,
                             fast_forward=self.checkpoint.fastForward,
                             stop_on_entry=self.stopOnEntry, reference=reference, rtol=self.rtol,
                             atol=self.atol, seed=self.seed, schedule=self.schedule, faults=self.faults,
                             ranks=self.ranks, replicas=self.replicas, rendezvous=self.rendezvous,
                             join=self.join)


@request("launch")
def launch(adapter: "RequestContext", args: LaunchArguments) -> dict | None:
    """Load the program, or open the trace; the answer's `notes` say what the user should know about what was
    opened (a trace whose recording was cut short: where it ends)."""
    if adapter.launched:
        raise RewindError("a program is already loaded in this session: restart it, or disconnect and launch")
    _load(adapter, args, "launch")
    adapter.launched = True
    changed_line_breakpoints(adapter)
    adapter.emit("initialized", None)
    notes = list(getattr(adapter.session, "launch_notes", None) or [])
    return {"notes": notes} if notes else None


class ConfigurationDoneArguments(Arguments):
    pass


@request("configurationDone")
@capability("supportsConfigurationDoneRequest")
def configuration_done(adapter: "RequestContext", args: ConfigurationDoneArguments) -> None:
    """Configuration is over: stop on entry, or run to the first stop."""
    adapter.resume(adapter.session.start, "Running")


class RestartArguments(Arguments):
    arguments: LaunchArguments | None = None


@request("restart")
@capability("supportsRestartRequest")
def restart(adapter: "RequestContext", args: RestartArguments) -> None:
    """Back to tick 0; with new launch arguments, load the program again first (the file may have changed)."""
    if args.arguments is not None and not adapter.launched:
        adapter.require_launched()  # a restart with arguments also recovers from a relaunch that failed
    if args.arguments is None:
        adapter.require_launched()
        adapter.resume(adapter.session.restart, "Restarting")
        return
    _load(adapter, args.arguments, "restart")
    adapter.resume(adapter.session.start, "Running")


def _load(adapter: "RequestContext", args: LaunchArguments, command: str) -> None:
    """Launch the Session in the launch's working directory (`cwd`, or the session's: a relaunch keeps it), with
    every path the client gave resolved against it. A trace that is the index of many ranks' traces opens as ranks."""
    cwd = paths.checked_cwd(args.cwd, command) if args.cwd is not None else paths.session_cwd(adapter)
    with adapter.events.progress(f"Loading {args.source}", cancellable=False), paths.Entering(adapter, cwd):
        options = args.options(cwd)
        adapter.use_ranks(args.ranks if args.ranks is not None else _index_ranks(adapter, options.trace, args.replicas),
                          args.rankTimeout)
        adapter.session.launch(options)


def _index_ranks(adapter: "RequestContext", trace: str | None, replicas: list[str] | None) -> int | None:
    """The world size of the index of many ranks' traces at `trace`; None for a single trace, which `replicas` (values
    compared across ranks) cannot go with. Ranks loaded now end first unless `trace` is an index already: they may be
    recording that very index (written when they end)."""
    if trace is None:
        return None
    world = index_ranks(trace)
    if world is None and isinstance(adapter.session, RankedSession):
        adapter.session.end_run()
        world = index_ranks(trace)
    if world is None and replicas is not None and os.path.isfile(trace):  # (a missing trace: opening it says so)
        raise RewindError("'replicas' compares values across ranks: this trace is one session's, not an index of "
                          "ranks' traces")
    return world


class TerminateArguments(Arguments):
    restart: bool = False


@request("terminate", interrupts=True)
@capability("supportsTerminateRequest")
def terminate(adapter: "RequestContext", args: TerminateArguments) -> None:
    _terminated(adapter)


class DisconnectArguments(Arguments):
    restart: bool = False
    terminateDebuggee: bool | None = None
    suspendDebuggee: bool | None = None


@request("disconnect", interrupts=True)
def disconnect(adapter: "RequestContext", args: DisconnectArguments) -> None:
    _terminated(adapter)
    adapter.closing = True


def _terminated(adapter: "RequestContext") -> None:
    if not adapter.terminated:
        adapter.terminated = True
        adapter.emit("terminated", None)


class CancelArguments(Arguments):
    requestId: int | None = None
    progressId: str | None = None


@request("cancel", on_loop=True)
@capability("supportsCancelRequest")
def cancel(adapter: "RequestContext", args: CancelArguments) -> None:
    """A queued request is answered `cancelled`; a running motion (or its progress) is paused."""
    adapter.cancel(args.requestId, args.progressId)
