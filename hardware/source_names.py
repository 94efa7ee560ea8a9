"""Source variable names: `scores`, `q`, `x` as the user wrote them, bound to Program values.

torch.export names values after ops (`div_1`). A line like `scores = q @ k.T / s` is an
assignment: the last node of that line's execution wrote the value the name now holds. We
parse each user source line once and bind the assigned names to the outputs of the line's
last node, per frame instance (so `scores` in blocks.1.attn is not the one of blocks.0).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from hardware.program import Frame, Program


@dataclass(frozen=True)
class Assignment:
    node: int  # index of the node whose outputs the names receive
    frame: tuple  # the frame instance (file, function, module_path) of the assigning line
    names: dict[str, str]  # source name -> value name


def frame_instance(frame: Frame) -> tuple:
    return (frame.loc.file, frame.loc.function, frame.module_path)


@functools.lru_cache(maxsize=64)
def parse_source(source: str | None) -> ast.Module | None:
    """The syntax tree of a user source file (parsed once), None if it does not parse."""
    if source is None:
        return None
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _targets(source: str | None, line: int) -> list[list[str]] | None:
    """Names assigned by the statement at `line`: [[x]] or [[q, k, v]]; None if not an assignment."""
    tree = parse_source(source)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.lineno == line:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out = []
            for t in targets:
                if isinstance(t, ast.Name):
                    out.append([t.id])
                elif isinstance(t, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in t.elts):
                    out.append([e.id for e in t.elts])
            return out or None
    return None


def assignments(program: Program) -> list[Assignment]:
    """Every assignment in execution order, bound to the last node of its line's run."""
    cache: dict[tuple[str, int], list[list[str]] | None] = {}
    result: list[Assignment] = []
    nodes = program.nodes
    for i, node in enumerate(nodes):
        nxt = nodes[i + 1].frames if i + 1 < len(nodes) else ()
        for level, frame in enumerate(node.frames):
            # The run of this line (in this frame instance) ends here if the next node is elsewhere.
            same = len(nxt) > level and [(f.loc.file, f.loc.line, f.module_path) for f in nxt[: level + 1]] == [
                (f.loc.file, f.loc.line, f.module_path) for f in node.frames[: level + 1]]
            if same:
                continue
            key = (frame.loc.file, frame.loc.line)
            if key not in cache:
                cache[key] = _targets(program.source_files.get(frame.loc.file), frame.loc.line)
            targets = cache[key]
            if not targets:
                continue
            names: dict[str, str] = {}
            for group in targets:
                if len(group) == 1:
                    names[group[0]] = node.outputs[0]
                elif len(group) == len(node.outputs):
                    names.update(zip(group, node.outputs))
            if names:
                result.append(Assignment(i, frame_instance(frame), names))
    return result

