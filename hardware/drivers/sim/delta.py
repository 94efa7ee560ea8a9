"""A delta of chip memory: the bytes of some ranges, kept to be put back.

A node-start checkpoint is one (the pre-images of what the node may write), kept lz4-compressed
for as long as the node's run is recorded: most of it is memory no node had written yet. What a
replay displaces from the frontier state is another, kept only until the replay ends.
"""

from __future__ import annotations

from typing import Iterator

import lz4.block
import numpy as np

from hardware.drivers.sim.chip import Memories

Range = tuple[str, "int | None", int, int]  # (space, core, start, stop): bytes of one memory


class Delta:
    def __init__(self, memories: Memories, ranges: list[Range], compress: bool = False):
        self.compressed = compress
        self._parts: list[tuple[str, int | None, int, int, bytes | np.ndarray]] = []
        for space, core, start, stop in ranges:
            raw = memories.backing(space, core)[start:stop]
            self._parts.append((space, core, start, stop - start, lz4.block.compress(raw.tobytes()) if compress
                                else raw.copy()))

    def parts(self) -> Iterator[tuple[str, int | None, int, np.ndarray]]:
        for space, core, offset, _, data in self._parts:
            yield space, core, offset, np.frombuffer(lz4.block.decompress(data), np.uint8) if self.compressed else data

    def restore(self, memories: Memories) -> None:
        for space, core, offset, data in self.parts():
            memories.backing(space, core)[offset:offset + len(data)] = data

    @property
    def nbytes(self) -> int:
        """The bytes it stands for."""
        return sum(n for *_, n, _ in self._parts)

    @property
    def stored(self) -> int:
        """The bytes it holds."""
        return sum(len(data) if self.compressed else data.nbytes for *_, data in self._parts)
