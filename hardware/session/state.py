"""What the Session's collaborators share: the loaded run, where it stopped, and the way to the user.

The Session owns one SessionState and hands it to each collaborator it composes (motion, breakpoints,
exception filters, inspection, the instruction level); none of them knows the Session itself.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from checkpoint.timeline import Timeline
from hardware.errors import NotStoppedError
from hardware.events import SessionEvent
from hardware.program import Frame, Node, Program
from hardware.ticks import Stop, Tick


AFTER_WRITE = ("nan", "inf", "divergence")  # exception filters whose stop is right after the write they found


@dataclass
class LaunchOptions:
    program: str = ""
    entry: str = "build"  # an entry returning an optimizer (train_step()) is a training step
    steps: int = 1  # training steps unrolled into the Program (hardware/frontends/torch_train.py)
    breakpoint_mode: str = "forward"  # the nodes of a line a breakpoint stops in: forward, backward, both
    driver: str = "auto"
    budget_mb: float = 1024.0  # the device tier of the checkpoint ring
    every: int | None = None
    stop_on_entry: bool = False
    host_mb: float = 0.0  # host tier (lz4) the ring spills into; 0: none
    disk_mb: float = 0.0  # disk tier below the host tier; 0: none
    spill_dir: str | None = None
    check_batch: int | None = None  # writes whose on-device checks are read back together; None: the driver's
    device_pool: bool | None = None  # copy checkpoints into a preallocated device pool; None: on a GPU
    # motions run stretches no stop can come in keeping only what checkpoints need (hardware/session/fast_forward.py);
    # off unless asked: a value's address at a tick, and a training step's values, need what it does not keep
    fast_forward: bool = False
    record: str | None = None  # record continuously to this trace file
    overwrite: bool = False  # record: replace an existing file at `record` (when the recording is closed)
    trace: str | None = None  # open this trace instead of running a program
    reference: str | None = None  # forensics: torch:cpu:float64 (the default), a trace, or saved values
    rtol: float | None = None  # tolerances against the reference; None: the dtype's default
    atol: float | None = None
    seed: int = 0  # sim chip: the seed of a random schedule
    schedule: str = "round-robin"  # sim chip: how units' steps interleave (round-robin, random)
    faults: list = field(default_factory=list)  # sim chip: injected faults (hardware/drivers/sim/faults.py)
    ranks: int | None = None  # torch.distributed ranks, an engine process each (hardware/ranks/); None: no group
    rendezvous: str | None = None  # with ranks: host:port the ranks meet at (default: $MASTER_ADDR:$MASTER_PORT)
    join: str | None = None  # with ranks: host:port where ranks started by torchrun join (hardware/ranks/join.py)
    replicas: list[str] | None = None  # with ranks: values that must stay identical on every rank (ranks/numerics.py)

    def driver_options(self) -> dict:
        """The options the driver itself takes (only those set away from their defaults)."""
        chosen = {"seed": self.seed, "schedule": self.schedule, "faults": self.faults}
        defaults = {"seed": 0, "schedule": "round-robin", "faults": []}
        return {k: v for k, v in chosen.items() if v != defaults[k]}

    def ring_settings(self) -> dict:
        """How the checkpoint ring is kept besides its budget: what a session of many ranks hands every rank's
        Session with the budget (hardware/ranks/coordinator.py), so each rank's ring is kept as one session's is."""
        return {"every": self.every, "host_mb": self.host_mb, "disk_mb": self.disk_mb, "spill_dir": self.spill_dir,
                "check_batch": self.check_batch, "device_pool": self.device_pool, "fast_forward": self.fast_forward}


def after_write(stop: Stop) -> bool:
    """Is `stop` right after a write it was made for (a data breakpoint, a NaN, an Inf, a divergence)?"""
    if stop.reason == "data breakpoint":
        return True
    return stop.reason == "exception" and stop.exception is not None and stop.exception.filter in AFTER_WRITE


def _updated_parameters(program: Program) -> dict[int, str]:
    """Optimizer node -> the parameter whose update it is part of: the one parameter its values go on to write. A
    node whose values reach several parameters' writes (a step's learning rate, a GradScaler's found_inf) or none
    is the whole update's, in no parameter's."""
    feeds: dict[int, set[str]] = {}
    readers: dict[str, list[int]] = {}
    optimizer = [n for n in program.nodes if n.phase == "optimizer"]
    for node in optimizer:
        for name in node.input_names():
            readers.setdefault(name, []).append(node.index)
    for node in reversed(optimizer):
        reached = {w for w in (program.buffer_mutations.get(o) for o in node.outputs)
                   if w is not None and program.values[w].kind == "parameter"}
        for out in node.outputs:
            for reader in readers.get(out, ()):
                reached |= feeds.get(reader, set())
        feeds[node.index] = reached
    return {i: next(iter(params)) for i, params in feeds.items() if len(params) == 1}


@dataclass
class FrameInfo:
    id: int  # 0 = innermost
    name: str
    file: str | None
    line: int | None
    module_path: str | None
    instruction_pointer: int | None = None  # code address of the unit's next instruction


class SessionState:
    """The loaded Program and its Timeline, the last Stop, the pause request, and `on_event`."""

    def __init__(self, on_event: Callable[[SessionEvent], None]):
        self.on_event = on_event
        self.timeline: Timeline | None = None
        self.program: Program | None = None
        self.options: LaunchOptions | None = None
        self.last_stop: Stop | None = None
        self.pause = threading.Event()  # set by Session.pause() from any thread; consumed by the next stop
        self._updates: tuple[Program | None, dict[int, str]] = (None, {})  # updated_parameter's, for one Program

    @property
    def tl(self) -> Timeline:
        if self.timeline is None:
            raise NotStoppedError("no program is loaded: launch first")
        return self.timeline

    def stopped_after_write(self) -> bool:
        """Is the Session where its last stop left it, right after a write it stopped for: a data breakpoint, or a
        NaN, an Inf or a divergence the exception filters found? A Stop at position q is after step q - 1, the
        writer: the top frame then shows that writer at its line, and stepping starts from it."""
        stop, tl = self.last_stop, self.timeline
        if stop is None or tl is None or stop.tick != tl.position or not 0 < stop.tick <= tl.end or stop.instruction:
            return False
        return after_write(stop)

    def step_of(self, tick: Tick) -> int | None:
        """The training step of the node at `tick` (the end: the last node's; a user's edit: the node's before
        it); None for an inference pass, which has no steps."""
        if self.program is None or not self.program.step_starts:
            return None
        tl = self.tl
        t = min(tick, tl.end - 1)
        node = tl.node_at(t)
        while node is None and t > 0:
            t -= 1
            node = tl.node_at(t)
        return node.step if node is not None else 0

    def training_context(self, node: Node) -> str:
        """Where a node is in its training step, in the user's words: "in the backward of log", "in the AdamW update
        of l1.weight"; "" for a forward node."""
        if node.phase == "backward":
            forward = self.program.forward_node(node)
            return f"in the backward of {forward.name}" if forward is not None else "in the backward"
        return f"in the {self.update_of(node)}" if node.phase == "optimizer" else ""

    def update_of(self, node: Node) -> str:
        """"AdamW update of l1.weight": the update an optimizer node is part of."""
        program = self.program
        if self._updates[0] is not program:
            self._updates = (program, _updated_parameters(program))
        param = self._updates[1].get(node.index)
        target = "the parameters" if param is None else program.values[param].target or param
        return f"{program.optimizer or 'optimizer'} update of {target}"

    def step_start(self, step: int) -> Tick:
        """The tick of the first node of training step `step`, which the caller has checked exists."""
        return self.tl.node_tick[self.program.step_starts[step]]

    def frames_at(self, tick: Tick) -> tuple[Frame, ...]:
        """The source frames of the node at `tick` (none for a user's edit)."""
        node = self.tl.node_at(tick)
        return node.frames if node else ()

    def shown_frames(self, tick: Tick) -> tuple[Frame, ...]:
        """The source frames shown at `tick`: the node's, out to the caller's when the stop there is on a call line
        (a step over a call, or back to it, stops before the call's first node runs and shows the caller's line)."""
        frames = self.frames_at(tick)
        stop = self.last_stop
        if stop is not None and stop.depth is not None and stop.tick == tick == self.tl.position:
            return frames[:stop.depth]
        return frames
