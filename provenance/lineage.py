"""Lineage: the nodes and values that fed a value, back to inputs and parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from hardware.program import Program


@dataclass
class Lineage:
    value: str
    nodes: list[int] = field(default_factory=list)  # producer node indices, latest first
    values: list[str] = field(default_factory=list)  # every upstream value, nearest first
    roots: list[str] = field(default_factory=list)  # inputs, parameters, buffers, constants reached

    def to_dict(self, program: Program) -> dict:
        return {
            "value": self.value,
            "nodes": [{"name": program.nodes[i].name, "op": program.nodes[i].op,
                       "source": str(program.nodes[i].loc) if program.nodes[i].loc else None} for i in self.nodes],
            "values": self.values,
            "roots": self.roots,
        }


def lineage(program: Program, value: str, max_nodes: int | None = None) -> Lineage:
    """Breadth-first walk from `value` through producers' inputs."""
    result = Lineage(value)
    seen = {value}
    frontier = [value]
    while frontier:
        nxt: list[str] = []
        for name in frontier:
            info = program.values[name]
            if info.producer is None:
                result.roots.append(name)
                continue
            node = program.nodes[info.producer]
            if node.index not in result.nodes:
                result.nodes.append(node.index)
                if max_nodes is not None and len(result.nodes) >= max_nodes:
                    return result
            for inp in node.input_names():
                if inp not in seen:
                    seen.add(inp)
                    result.values.append(inp)
                    nxt.append(inp)
        frontier = nxt
    return result


def descendants(program: Program, node: int) -> list[int]:
    """Indices of the nodes that read, directly or not, what node `node` wrote; in execution order."""
    reached = set(program.nodes[node].outputs)
    found = []
    for later in program.nodes[node + 1:]:
        if any(name in reached for name in later.input_names()):
            found.append(later.index)
            reached.update(later.outputs)
    return found
