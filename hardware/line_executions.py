"""Where an execution of a source line begins: what breakpoints, hit counts, `next`, `stepBack` and goto targets count.

A line begins executing when the frames down to it change (another line, another call of its function), when it
calls into another instance of the same code (a loop over blocks calls Block.forward of blocks.0, then of
blocks.1), and when a line in the body of a loop runs the body again. Torch's own modules have no user frames, so
`x = torch.relu(layer(x))` under `for layer in self.layers` has the same frames in every iteration; what marks the
next iteration is that the line runs its first node's code again: the same op, from the same code below the line,
in modules of the same classes (`linear` of layers.1 after `linear` of layers.0 and a `relu`). Outside a loop's
body a line that calls the same code twice (`self.b(self.a(x))`, two nn.Linear) is one execution.
"""

from __future__ import annotations

import ast
import functools

from hardware.program import Frame, Node, Program

_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _frame_key(f: Frame) -> tuple:
    return (f.loc.file, f.loc.line, f.module_path)


def frames_begin(frames_prev: tuple[Frame, ...], frames: tuple[Frame, ...], level: int) -> bool:
    """Do the frames alone say the line at frames[level] begins executing here (after frames_prev)?"""
    if len(frames_prev) <= level:
        return True
    if [_frame_key(f) for f in frames_prev[: level + 1]] != [_frame_key(f) for f in frames[: level + 1]]:
        return True
    # Same line, same frames: a new call from it into another instance of the same code is a new execution.
    if len(frames_prev) > level + 1 and len(frames) > level + 1:
        a, b = frames_prev[level + 1], frames[level + 1]
        return (a.loc.file, a.loc.function) == (b.loc.file, b.loc.function) and a.module_path != b.module_path
    return False


@functools.lru_cache(maxsize=64)
def loop_lines(source: str | None) -> frozenset[int]:
    """The lines of a source file inside the body of a loop (a for, a while, a comprehension)."""
    try:
        tree = ast.parse(source) if source is not None else None
    except SyntaxError:
        tree = None
    lines: set[int] = set()
    for loop in ast.walk(tree) if tree is not None else ():
        if isinstance(loop, _LOOPS):
            body = loop.body if isinstance(loop, (ast.For, ast.AsyncFor, ast.While)) else [loop]
            for stmt in body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return frozenset(lines)


def _code(node: Node, level: int) -> tuple:
    """What a node runs below the line at frames[level]: its op, the code of the frames under the line, the classes
    of its modules (not their paths: those are what differ from one iteration to the next)."""
    below = tuple((f.loc.file, f.loc.function, f.loc.line) for f in node.frames[level + 1:])
    return node.op, below, tuple(cls for _, cls in node.module_stack)


class LineExecutions:
    """For each node of a Program, the frame levels at which it begins another iteration of a loop's body line
    though its frames are the previous node's (computed once per Program, kept with it: `of`)."""

    def __init__(self, program: Program):
        self.iterations: dict[int, frozenset[int]] = {}
        first: dict[int, tuple] = {}  # level -> the code of the first node of the line's open execution
        prev: tuple[Frame, ...] = ()
        prev_phase = None
        for node in program.nodes:
            frames = node.frames
            if node.phase != prev_phase:
                prev = ()
            begun, again = False, set()
            for level, f in enumerate(frames):
                code = _code(node, level)
                if not begun and not frames_begin(prev, frames, level) and first.get(level) == code \
                        and f.loc.line in loop_lines(program.source_files.get(f.loc.file)):
                    again.add(level)
                    begun = True
                elif begun:
                    again.add(level)  # the lines it calls begin with it
                if begun or frames_begin(prev, frames, level):
                    first[level] = code
            for level in [lv for lv in first if lv >= len(frames)]:
                del first[level]
            if again:
                self.iterations[node.index] = frozenset(again)
            prev, prev_phase = frames, node.phase

    @staticmethod
    def of(program: Program) -> "LineExecutions":
        found = program.__dict__.get("_line_executions")
        if found is None:
            found = program.__dict__["_line_executions"] = LineExecutions(program)
        return found

    def begins(self, frames_prev: tuple[Frame, ...], node: Node, level: int) -> bool:
        """Does the line at node.frames[level] begin executing at `node` (after a node with frames_prev)?"""
        return frames_begin(frames_prev, node.frames, level) or level in self.iterations.get(node.index, ())
