"""The write log: one WriteRecord per memory write, stored column by column.

Columns are numpy arrays grown by doubling, so a million writes cost tens of MB, and the
queries (last writer of an address at tick t, a value's history) are vectorised scans.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from hardware.driver import WriteStats
from hardware.memory import Location
from hardware.program import Program, SourceLoc

KIND_NODE, KIND_BUFFER, KIND_EDIT, KIND_VIEW = 0, 1, 2, 3
# A view (transpose, reshape, slice) writes no memory: it is logged, its stats are computed on demand.
KIND_NAMES = {KIND_NODE: "node output", KIND_BUFFER: "buffer write", KIND_EDIT: "user edit", KIND_VIEW: "view"}
VIEW_REASON = "a view (a reshape, a transpose, a slice) writes no memory of its own"
NO_SOURCE = "torch.export recorded no source line for this node"
EDIT_REASON = "a user edit wrote it, not a node of the program"

_STATS = ("digest", "nan", "inf", "min", "max", "mean")  # the columns a write's checks fill, last in a row
_COLUMNS = [
    ("tick", np.int64), ("unit", np.int32), ("node", np.int32), ("value", np.int32), ("kind", np.int8),
    ("space", np.int16), ("address", np.uint64), ("nbytes", np.int64), ("digest", np.int64),
    ("nan", np.int64), ("inf", np.int64), ("min", np.float64), ("max", np.float64), ("mean", np.float64),
]
_STATS_AT = [name for name, _ in _COLUMNS].index(_STATS[0])
_WIDTH = len(_COLUMNS)  # fields of a row


@dataclass(frozen=True)
class WriteRecord:
    index: int
    tick: int
    unit: str
    node: int | None  # None for a user edit
    node_name: str | None
    op: str | None
    value: str
    kind: str
    loc: SourceLoc | None
    location: Location
    digest: int
    dtype: str
    shape: tuple[int, ...]
    stats: WriteStats

    def to_dict(self) -> dict:
        """As JSON says it; each null field has its reason beside it (a view wrote no memory: no digest, no
        stats of its own)."""
        out = {
            "tick": self.tick, "unit": self.unit, "node": self.node_name, "op": self.op, "value": self.value,
            "kind": self.kind, "source": {"file": self.loc.file, "line": self.loc.line} if self.loc else None,
            "location": self.location.to_dict(), "digest": f"{self.digest & 0xFFFFFFFFFFFFFFFF:016x}",
            "dtype": self.dtype, "shape": list(self.shape),
            "stats": {"min": self.stats.min, "max": self.stats.max, "mean": self.stats.mean,
                      "nan": self.stats.nan, "inf": self.stats.inf},
        }
        if self.node is None:
            out.update(nodeReason=EDIT_REASON, opReason=EDIT_REASON)
        if self.loc is None:
            out["sourceReason"] = NO_SOURCE if self.node is not None else EDIT_REASON
        if self.kind == KIND_NAMES[KIND_VIEW]:
            out.update(digest=None, digestReason=VIEW_REASON, stats=None,
                       statsReason=f"{VIEW_REASON}; its stats are those of the value it views at tick {self.tick + 1}")
        return out


class _Interned(dict):
    """Each string's id, numbered in the order they come (`names` the other way): `interned[s]` is one dict lookup
    for a string seen before, which is every write's but a value's first."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __missing__(self, s: str) -> int:
        i = self[s] = len(self.names)
        self.names.append(s)
        return i


class WriteLog:
    def __init__(self, program: Program, chip: str, capacity: int = 1024):
        self.program = program
        self.chip = chip
        self._n = 0  # rows in the columns
        self._cols = {name: np.zeros(capacity, dtype=dt) for name, dt in _COLUMNS}
        # Rows appended since the last query, their fields one after another in column order in one flat list: the
        # columns take them in bulk when next read (a dozen numpy element stores a write cost more than the row
        # itself), and a write allocates nothing of its own for it.
        self._staged: list = []
        self._units, self._values, self._spaces = _Interned(), _Interned(), _Interned()
        self._pending: weakref.ref | None = None

    @property
    def pending(self) -> Any:
        """hardware.stats_batch.WriteChecks: rows whose stats are still on the device (None: every row is filled)."""
        return self._pending() if self._pending is not None else None

    @pending.setter
    def pending(self, checks: Any) -> None:
        # weakly: the Timeline owns its checks, and a log that held them back would make a cycle that keeps a
        # Timeline's last batch of tensors, and the log, until the garbage collector finds it
        self._pending = weakref.ref(checks) if checks is not None else None

    def __len__(self) -> int:
        return self._n + len(self._staged) // _WIDTH

    @property
    def nbytes(self) -> int:
        self._flush()
        return sum(c.nbytes for c in self._cols.values())

    def append(self, tick: int, unit: str, node: int | None, value: str, kind: int,
               location: Location, stats: WriteStats | None) -> int:
        """Log one write; `stats` None: its checks are still on the device and `fill` brings them."""
        return self.add(tick, unit, node, value, kind, location.space, location.address, location.nbytes, stats)

    def add(self, tick: int, unit: str, node: int | None, value: str, kind: int, space: str, address: int,
            nbytes: int, stats: WriteStats | None) -> int:
        """`append` with the write's memory space, address and bytes (all the log keeps of its Location)."""
        stats = WriteStats.empty() if stats is None else stats
        staged = self._staged
        staged += (tick, self._units[unit], -1 if node is None else node, self._values[value], kind,
                   self._spaces[space], address, nbytes, stats.digest, stats.nan, stats.inf, stats.min, stats.max,
                   stats.mean)
        return self._n + len(staged) // _WIDTH - 1

    def _flush(self) -> None:
        """Move the staged rows into the columns."""
        staged = self._staged
        if not staged:
            return
        count = len(staged) // _WIDTH
        self._reserve(count)
        end = self._n + count
        for j, col in enumerate(self._cols.values()):
            col[self._n: end] = staged[j::_WIDTH]
        self._n = end
        staged.clear()

    def fill(self, i: int, stats: WriteStats) -> None:
        """The stats of row i, come back from the device."""
        if i >= self._n:
            at = (i - self._n) * _WIDTH + _STATS_AT
            self._staged[at: at + len(_STATS)] = [getattr(stats, name) for name in _STATS]
            return
        for name in _STATS:
            self._cols[name][i] = getattr(stats, name)

    def _settle(self, row: int | None = None) -> None:
        """Wait for the device's checks of row `row` (of every row: None) if they are still on their way."""
        if self.pending is not None and self.pending.holds(row):
            self.pending.settle()

    def row(self, i: int) -> list:
        """Record i as a plain list (for trace files); `append_row` takes it back."""
        self._settle(i)
        self._flush()
        c = {name: col[i].item() for name, col in self._cols.items()}
        return [c["tick"], self._units.names[c["unit"]], c["node"], self._values.names[c["value"]], c["kind"],
                self._spaces.names[c["space"]], c["address"], c["nbytes"], c["digest"], c["nan"], c["inf"],
                c["min"], c["max"], c["mean"]]

    def append_row(self, row: list) -> int:
        tick, unit, node, value, kind, space, address, nbytes, digest, nan, inf, lo, hi, mean = row
        return self.add(int(tick), str(unit), None if node < 0 else int(node), str(value), int(kind), str(space),
                        int(address), int(nbytes),
                        WriteStats(int(digest), int(nan), int(inf), float(lo), float(hi), float(mean)))

    def truncate(self, tick: int) -> None:
        """Forget every record at or after `tick` (the future of a rewritten history)."""
        self._flush()
        self._n = self._first_at(tick)
        if self.pending is not None:
            self.pending.forget_from(self._n)

    def tail(self, tick: int) -> dict[str, np.ndarray]:
        """A copy of the records at or after `tick` (a branch sets its original future aside)."""
        self._settle()
        self._flush()
        keep = self._first_at(tick)
        return {name: col[keep: self._n].copy() for name, col in self._cols.items()}

    def _first_at(self, tick: int) -> int:
        return int(np.searchsorted(self._col("tick"), tick, side="left"))

    def extend(self, tail: dict[str, np.ndarray]) -> None:
        """Append records taken by `tail` (the log must end before their first tick)."""
        count = len(tail["tick"])
        self._flush()
        self._reserve(count)
        for name, col in self._cols.items():
            col[self._n: self._n + count] = tail[name]
        self._n += count

    def _reserve(self, count: int) -> None:
        while self._n + count > len(self._cols["tick"]):
            for name, col in self._cols.items():
                self._cols[name] = np.concatenate([col, np.zeros_like(col)])

    def _col(self, name: str) -> np.ndarray:
        self._flush()
        return self._cols[name][: self._n]

    def record(self, i: int) -> WriteRecord:
        self._settle(i)
        self._flush()
        c = {name: col[i] for name, col in self._cols.items()}
        node_idx = int(c["node"])
        node = self.program.nodes[node_idx] if node_idx >= 0 else None
        value = self._values.names[int(c["value"])]
        info = self.program.values.get(value)
        dtype, shape = (info.dtype, info.shape) if info else ("", ())
        unit = self._units.names[int(c["unit"])]
        location = Location(self.chip, unit, self._spaces.names[int(c["space"])], int(c["address"]),
                            int(c["nbytes"]), dtype, shape)
        stats = WriteStats(int(c["digest"]), int(c["nan"]), int(c["inf"]), float(c["min"]), float(c["max"]),
                           float(c["mean"]))
        return WriteRecord(i, int(c["tick"]), unit, node_idx if node else None, node.name if node else None,
                           node.op if node else None, value, KIND_NAMES[int(c["kind"])],
                           node.loc if node else None, location, int(c["digest"]), dtype, shape, stats)

    # -- queries ---------------------------------------------------------------------------
    def at_tick(self, tick: int) -> list[WriteRecord]:
        ticks = self._col("tick")
        lo, hi = np.searchsorted(ticks, tick, "left"), np.searchsorted(ticks, tick, "right")
        return [self.record(i) for i in range(int(lo), int(hi))]

    def history(self, value: str, before: int | None = None, since: int = 0) -> list[WriteRecord]:
        """Every write of `value`, oldest first (optionally only those from tick `since` and before tick `before`)."""
        vid = self._values.get(value)
        if vid is None:
            return []
        mask = self._col("value") == vid
        if before is not None:
            mask &= self._col("tick") < before
        if since > 0:
            mask &= self._col("tick") >= since
        return [self.record(int(i)) for i in np.flatnonzero(mask)]

    def last_writer(self, value: str | None = None, address: int | None = None,
                    before: int | None = None) -> WriteRecord | None:
        """The latest write of a value, or of any byte at `address`, before tick `before`."""
        self._flush()
        n = self._n
        mask = np.ones(n, dtype=bool)
        if value is not None:
            vid = self._values.get(value)
            if vid is None:
                return None
            mask &= self._col("value") == vid
        if address is not None:
            start = self._col("address")
            mask &= (start <= np.uint64(address)) & (np.uint64(address) < start + self._col("nbytes").astype(np.uint64))
        if before is not None:
            mask &= self._col("tick") < before
        hits = np.flatnonzero(mask)
        return self.record(int(hits[-1])) if len(hits) else None

    def first_nonfinite(self, after: int = -1, nan: bool = True, inf: bool = True) -> WriteRecord | None:
        self._settle()
        mask = self._col("tick") > after  # (the staged rows flushed)
        bad = np.zeros(self._n, dtype=bool)
        if nan:
            bad |= self._col("nan") > 0
        if inf:
            bad |= self._col("inf") > 0
        hits = np.flatnonzero(mask & bad)
        return self.record(int(hits[0])) if len(hits) else None

    def digests_at(self, tick: int) -> dict[str, int]:
        """Digests of the memory written at a tick (views wrote none)."""
        return {r.value: r.digest for r in self.at_tick(tick) if r.kind != KIND_NAMES[KIND_VIEW]}

    def __iter__(self) -> Iterator[WriteRecord]:
        self._flush()
        return (self.record(i) for i in range(self._n))
