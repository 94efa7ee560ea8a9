"""Rewind in Python: a time-travel debugger for models, in a script or a notebook.

    import rewind
    s = rewind.debug(model, inputs)     # an nn.Module in memory (or rewind.debug("model.py"))
    s.run(); s.value("scores")          # the next stop; a value with its stats, heatmap and histogram

A session runs the model once under the engine every Rewind surface uses (VS Code, the `rewind debug` console,
the DAP server), records it, and stops at tick 0. From there:

  moving        s.run(), s.run(reverse=True), s.step(), s.step("in"), s.finish(), s.back(), s.goto(tick),
                s.goto_step(k) (training), s.find("x.isnan().any()")
  breakpoints   s.breakpoint("model.py", 12, condition="x.abs().max() > 10"), s.breakpoint("blocks.1.attn"),
                s.breakpoint("aten.softmax"), s.delete(n), s.breakpoints, s.stop_on("nan", "inf", "divergence")
  looking       s.where(), s.value("x" or "$node_name" or an expression), s.locate(name), s.prov(name),
                s.history(name), s.diff(expr, tick1, tick2), s.timeline(), s.checkpoints()
  forensics     s.forensics() (the root cause, the pattern, the fix, a precision fix; .save_html(path) writes the
                report to send), s.compare(), s.first_divergence(), s.reference(name), s.ablate(*nodes)
  experiments   s.patch("softmax", precision="float64"), s.measure(), s.compare("experiment"), s.undo(),
                s.patches(), s.branch(name), s.unpatch(name), s.suggest(), s.repair("fix.py")
  keeping       s.save("run.rwtrace"); later rewind.open("run.rwtrace"), no device needed

Every answer prints as the console prints it; in Jupyter it shows more (the source around a stop, a tensor's
heatmap and histogram, errors against the reference drawn by tick, the forensics report). `answer.data` holds
what `rewind debug --json` gives. `with rewind.debug(...) as s:` closes the engine at the end of the block.
What goes wrong is a RewindError that says why in words. Training: rewind.debug("train.py",
entry="train_step", steps=N). docs/python-api.md has the whole API.
"""

from hardware.errors import RewindError
from rewind.displays import Answer, ChartAnswer, ForensicsAnswer, StopAnswer, ValueAnswer
from rewind.launch import debug
from rewind.launch import open as _open
from rewind.session import DebugSession

open = _open  # rewind.open: left out of __all__, so a star import never hides Python's own open
__all__ = ["Answer", "ChartAnswer", "DebugSession", "ForensicsAnswer", "RewindError", "StopAnswer", "ValueAnswer",
           "debug"]
