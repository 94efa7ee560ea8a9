"""Determinism: the settings that make replay bit-exact where torch allows it, and the report of ops that
have no deterministic kernel (their ticks are what replay's digest check may flag)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from checkpoint.timeline import Timeline
from hardware import determinism
from hardware.drivers.torch import TorchDriver
from tests.conftest import fresh_module, program

UNPOOL = str(Path(__file__).resolve().parent / "models" / "unpool.py")
# The workspace configs torch itself accepts as deterministic (at::Context::checkCuBLASConfigDeterministic)
TORCH_DETERMINISTIC_CUBLAS = {":4096:8", ":16:8"}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("found", [None, ":16:8", ":4096:8", ":0:0"])
def test_a_deterministic_driver_sets_torch_cudnn_and_cublas_then_gives_them_back(monkeypatch, found):
    """Whatever the machine's CUBLAS_WORKSPACE_CONFIG was: a deterministic one is kept, any other is replaced by
    one torch accepts, and everything is given back as it was."""
    if found is None:
        monkeypatch.delenv(determinism.CUBLAS_WORKSPACE, raising=False)
    else:
        monkeypatch.setenv(determinism.CUBLAS_WORKSPACE, found)
    before = determinism.current()
    driver = TorchDriver(torch.device("cpu"), deterministic=True)
    try:
        now = determinism.current()
        assert (now.algorithms, now.warn_only, now.fill_uninitialized) == (True, True, False)
        assert (now.cudnn_deterministic, now.cudnn_benchmark) == (True, False)
        workspace = os.environ[determinism.CUBLAS_WORKSPACE]
        assert workspace in TORCH_DETERMINISTIC_CUBLAS
        assert workspace == found or found not in TORCH_DETERMINISTIC_CUBLAS
    finally:
        determinism.apply(driver.replaced)
    assert determinism.current() == before
    assert os.environ.get(determinism.CUBLAS_WORKSPACE) == found


def test_a_workspace_config_torch_counts_as_non_deterministic_is_replaced_reported_and_given_back(monkeypatch):
    monkeypatch.setenv(determinism.CUBLAS_WORKSPACE, ":0:0")  # a valid config, but one that makes cuBLAS ops raise
    unpool = program(UNPOOL)
    reports: list[str] = []
    driver = TorchDriver(torch.device("cpu"), deterministic=True)
    driver.on_report = reports.append
    try:
        assert os.environ[determinism.CUBLAS_WORKSPACE] == ":4096:8"
        driver.load(unpool)  # tells the user what it changed
    finally:
        determinism.apply(driver.replaced)
    assert os.environ[determinism.CUBLAS_WORKSPACE] == ":0:0"
    assert any("CUBLAS_WORKSPACE_CONFIG=:0:0 is not deterministic: replaced by :4096:8" in r for r in reports)


def kernels_torch_alerts(path: str, device: str) -> set[str]:
    """The kernels torch itself says have no deterministic implementation on `device` when the model file's module
    runs eagerly there: torch's own alerts, with deterministic algorithms on in warn-only mode."""
    module = fresh_module(path)
    model, inputs = module.build()
    model, inputs = model.to(device), tuple(t.to(device) for t in inputs)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            model(*inputs)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    said = " does not have a deterministic implementation"
    return {str(w.message).split(said)[0].strip() for w in caught if said in str(w.message)}


def written_digests(tl: Timeline) -> dict[tuple[int, str], int]:
    return {(r.tick, r.value): r.digest for r in tl.log if r.kind != "view"}


@pytest.mark.parametrize("device", DEVICES)
def test_an_op_without_a_deterministic_kernel_is_reported_once_by_name(device):
    """What must hold on any machine: the driver reports exactly the kernels torch alerts about on that device, each
    once, by op and kernel; replaying flags nothing but the ticks of those ops; and two runs write the same digests
    at every other tick."""
    unpool = program(UNPOOL)  # exported before: export runs the op's decomposition, which alerts too
    alerting = kernels_torch_alerts(UNPOOL, device)
    reports: list[str] = []
    driver = TorchDriver(torch.device(device), deterministic=True)
    driver.on_report = reports.append
    try:
        tl = Timeline(unpool, driver, budget=1 << 20)
        tl.seek(tl.end)
        said = list(reports)
        findings = tl.replay_check()  # runs every node again: nothing new to report
        again = Timeline(unpool, driver, budget=1 << 20)  # a second run, by a second Timeline
        again.seek(again.end)
    finally:
        determinism.apply(driver.replaced)
    found = driver.watch.found  # op -> the kernel torch named
    assert set(found.values()) == alerting
    assert set(found) <= {n.op for n in unpool.nodes}
    op_reports = [r for r in said if "which torch has no deterministic kernel for" in r]
    assert len(op_reports) == len(found)  # once each
    for op, kernel in found.items():
        assert sum(op in r and kernel in r for r in op_reports) == 1, (op, kernel, op_reports)
    assert [r for r in reports if r in op_reports] == op_reports  # replaying and running again: nothing new
    flagged = set(found)
    assert all(tl.node_at(f.tick).op in flagged for f in findings), findings
    assert tl.nondeterminism == findings
    first, second = written_digests(tl), written_digests(again)
    assert first.keys() == second.keys()
    for (tick, value), digest in first.items():
        if tl.node_at(tick).op not in flagged:
            assert second[tick, value] == digest, (tick, value)
