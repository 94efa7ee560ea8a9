"""Bit-exact replay where torch allows it, and a report of the ops where it does not.

Replay re-checks every write's digest against the write log. On a GPU that check passes only
if the kernels are deterministic: cuBLAS needs a fixed workspace configuration (read when it
first creates a handle), cuDNN must not pick algorithms by timing, and torch must choose its
deterministic kernels. An op torch knows has none is reported the first time it runs; what
torch does not know about, the digest check catches.

The settings are process-wide: a driver holds them while it is open and they are given back,
as they were before, when the last driver holding them lets go (a Session lets go at close).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
# The workspace configs torch accepts as deterministic (at::Context::checkCuBLASConfigDeterministic): with any
# other, every cuBLAS call in deterministic mode alerts.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
_ALERT = " does not have a deterministic implementation"
# torch decides whether cuBLAS is deterministic once, at its first cuBLAS call: a process that used cuBLAS before
# the workspace config was set gets this alert from every cuBLAS op in deterministic mode
_CUBLAS_ALERT = "it uses CuBLAS"


@dataclass(frozen=True)
class Determinism:
    """torch's process-wide determinism settings."""

    algorithms: bool
    warn_only: bool  # a non-deterministic op warns (and is reported) instead of failing the run
    fill_uninitialized: bool  # torch fills new memory in deterministic mode unless told not to: it costs a pass
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    cublas_workspace: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"use_deterministic_algorithms": self.algorithms, "warn_only": self.warn_only,
                "fill_uninitialized_memory": self.fill_uninitialized,
                "cudnn.deterministic": self.cudnn_deterministic, "cudnn.benchmark": self.cudnn_benchmark,
                CUBLAS_WORKSPACE: self.cublas_workspace}


def current() -> Determinism:
    return Determinism(torch.are_deterministic_algorithms_enabled(),
                       torch.is_deterministic_algorithms_warn_only_enabled(),
                       torch.utils.deterministic.fill_uninitialized_memory,
                       torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                       os.environ.get(CUBLAS_WORKSPACE))


def apply(settings: Determinism) -> None:
    torch.use_deterministic_algorithms(settings.algorithms, warn_only=settings.warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = settings.fill_uninitialized
    torch.backends.cudnn.deterministic = settings.cudnn_deterministic
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    if settings.cublas_workspace is None:
        os.environ.pop(CUBLAS_WORKSPACE, None)
    else:
        os.environ[CUBLAS_WORKSPACE] = settings.cublas_workspace


# Who holds the settings. Each deterministic driver holds them while it lives, and several can be alive in one
# process: a Session's and its forensics reference pass's, or two Sessions' (a notebook, a test run). The rule:
# the first holder records the settings it found, later holders join, and the recorded settings are put back
# when the last holder lets go, whatever the order they let go in. A setting changed by hand while some holder
# is alive is overwritten then.
_lock = threading.RLock()  # a collected driver releases from wherever the collector runs: maybe inside the lock
_holders = 0
_found: Determinism | None = None  # the settings before the first of the current holders


class Hold:
    """One holder's claim on the deterministic settings; `release` lets go (once; again does nothing)."""

    def __init__(self, replaced: Determinism, caveats: list[str]):
        self.replaced = replaced  # the settings this holder found (an earlier holder's, when there was one)
        self.caveats = caveats  # what could not take effect
        self.released = False

    def release(self) -> None:
        global _holders, _found
        with _lock:
            if self.released:
                return
            self.released = True
            _holders -= 1
            if _holders == 0 and _found is not None:
                apply(_found)
                _found = None


def make_deterministic() -> Hold:
    """Switch torch to its deterministic kernels, process-wide, until the returned hold (and every other one)
    is released. The hold carries warnings about what could not take effect."""
    global _holders, _found
    with _lock:
        _holders += 1  # first: a release meanwhile (a collected driver's) cannot give the settings back under us
        before = current()
        if _holders == 1:
            _found = before
        workspace = before.cublas_workspace if before.cublas_workspace in CUBLAS_DETERMINISTIC else CUBLAS_DETERMINISTIC[0]
        apply(Determinism(True, True, False, True, False, workspace))
    caveats = []
    if before.cublas_workspace not in (None, workspace):
        caveats.append(f"{CUBLAS_WORKSPACE}={before.cublas_workspace} is not deterministic: replaced by {workspace} "
                       f"(torch accepts {' or '.join(CUBLAS_DETERMINISTIC)})")
    if before.cublas_workspace != workspace and torch.cuda.is_available() and torch.cuda.is_initialized():
        caveats.append(f"{CUBLAS_WORKSPACE} was set after CUDA started: torch reads it once, at its first cuBLAS "
                       "call, and a handle created before may keep its workspace (set it before the process uses CUDA)")
    return Hold(before, caveats)


class OpWatch:
    """Learns which ops have no deterministic kernel: each op's first run makes torch's alert an error (torch
    raises it before the kernel writes anything, so the op then runs again from the start). Those ops are
    reported once and afterwards run with the alert off; torch itself would print it at every call, and only
    to stderr when an op is called through the dispatcher as a driver does."""

    def __init__(self, report: Callable[[str, str], None]):
        self._report = report
        self._seen: set[str] = set()
        self.found: dict[str, str] = {}  # op -> the kernel torch named as non-deterministic

    def watches(self, op: str) -> bool:
        return op not in self._seen or op in self.found

    def run(self, op: str, fn: Callable[[], Any]) -> Any:
        if op in self.found:
            return _with_algorithms(False, fn)
        self._seen.add(op)
        try:
            return _with_algorithms(True, fn)
        except RuntimeError as exc:
            kernel = _alerted_kernel(str(exc))
            if kernel is None:
                raise
            self.found[op] = kernel
            self._report(op, kernel)
            return _with_algorithms(False, fn)


def _alerted_kernel(message: str) -> str | None:
    """The kernel a determinism alert of torch's names; None when `message` is not one."""
    if _ALERT in message:
        return message.split(_ALERT)[0].strip()
    if _CUBLAS_ALERT in message:
        return f"cuBLAS (torch read {CUBLAS_WORKSPACE} at its first cuBLAS call, before it was set)"
    return None


def _with_algorithms(deterministic: bool, fn: Callable[[], Any]) -> Any:
    """Run `fn` with deterministic algorithms on, their alerts raising (True), or off (False)."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(deterministic)
    try:
        return fn()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
