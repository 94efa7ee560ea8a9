"""The checks of every write, read back from the device in batches: one host sync per batch, not per node.

Each write's digest, NaN/Inf counts and stats are computed on the device as it is logged
(`Driver.check`); after `batch` writes they cross to the host together (`Driver.read_checks`,
asynchronous on a GPU) and fill the write log's rows when they land. Until then the rows are
pending: the write log waits for them before it answers anything about them, and a Session
scanning forward checks each tick's exceptions when its batch lands, stopping at the tick that
set the flag, not at the one where it was seen. A pending write's tensor is held until its batch
lands (at most `batch` writes and the readbacks in flight), for the closer look a flagged one needs.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from hardware.driver import ChecksReadback, Driver, check, read_checks
from hardware.errors import RewindError


@dataclass
class _Write:
    row: int  # -1 once the row was truncated away
    tick: int
    tensor: Any
    check: Any


class WriteChecks:
    def __init__(self, driver: Driver, log: Any, batch: int):
        if batch < 1:
            raise RewindError(f"a batch of checks holds at least one write, not {batch}")
        self.driver, self.log, self.batch = driver, log, batch
        self._open: list[_Write] = []  # checked on the device, not yet sent
        self._sent: deque[tuple[ChecksReadback, list[_Write]]] = deque()
        self._rows: set[int] = set()
        self._ticks: Counter[int] = Counter()  # tick -> its writes still on their way
        self.readbacks = 0  # batches sent to the host: the host syncs batching costs
        log.pending = self

    def add(self, row: int, tick: int, tensor: Any) -> None:
        """Check the write logged at `row` on the device; its stats fill the row when its batch lands."""
        self._open.append(_Write(row, tick, tensor, check(self.driver, tensor)))
        self._rows.add(row)
        self._ticks[tick] += 1
        if len(self._open) >= self.batch:
            self._send()

    def _send(self) -> None:
        if self._open:
            # a run that asks for no stats (no exception filters) lands the batches here, or they would keep every
            # write's tensor to its end: on a GPU, the outputs the pool copied would never go back to the allocator
            self.poll()
            writes, self._open = self._open, []
            self._sent.append((read_checks(self.driver, [w.check for w in writes], [w.tensor for w in writes]), writes))
            self.readbacks += 1

    def poll(self) -> None:
        """Fill the rows of every batch that has landed, without waiting for the others."""
        while self._sent and self._sent[0][0].ready():
            self._land(*self._sent.popleft())

    def settle(self) -> None:
        """Send what is open and wait for every batch: afterwards the write log is complete."""
        self._send()
        while self._sent:
            self._land(*self._sent.popleft())

    def _land(self, readback: ChecksReadback, writes: list[_Write]) -> None:
        for write, stats in zip(writes, readback.stats()):
            if write.row >= 0:
                self.log.fill(write.row, stats)
                self._landed(write)

    def _landed(self, write: _Write) -> None:
        self._rows.discard(write.row)
        self._ticks[write.tick] -= 1
        if not self._ticks[write.tick]:
            del self._ticks[write.tick]

    def holds(self, row: int | None = None) -> bool:
        """Are the stats of `row` (of any row: None) still on their way?"""
        return bool(self._rows) if row is None else row in self._rows

    def waiting(self, tick: int) -> bool:
        """Are checks of a write at `tick` still on their way?"""
        return tick in self._ticks

    def forget_from(self, row: int) -> None:
        """The write log dropped its rows from `row` on (a rewritten future): their checks fill nothing."""
        for write in [w for _, writes in self._sent for w in writes] + self._open:
            if write.row >= row:
                self._landed(write)
                write.row = -1
        self._open = [w for w in self._open if w.row >= 0]
