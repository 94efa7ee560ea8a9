"""Determinism: the settings that make replay bit-exact where torch allows it, and the report of ops that
have no deterministic kernel (their ticks are what replay's digest check may flag)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from checkpoint.timeline import Timeline
from hardware import determinism
from hardware.drivers.torch import TorchDriver
from tests.conftest import program

UNPOOL = str(Path(__file__).resolve().parent / "models" / "unpool.py")


def test_a_deterministic_driver_sets_torch_cudnn_and_cublas_then_gives_them_back():
    before = determinism.current()
    driver = TorchDriver(torch.device("cpu"), deterministic=True)
    try:
        now = determinism.current()
        assert (now.algorithms, now.warn_only, now.fill_uninitialized) == (True, True, False)
        assert (now.cudnn_deterministic, now.cudnn_benchmark) == (True, False)
        assert os.environ[determinism.CUBLAS_WORKSPACE] == (before.cublas_workspace or ":4096:8")
    finally:
        determinism.apply(driver.replaced)
    assert determinism.current() == before


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


def test_an_op_without_a_deterministic_kernel_is_reported_once_by_name():
    reports: list[str] = []
    unpool = program(UNPOOL)  # exported before: export runs the op's decomposition, which alerts too
    driver = TorchDriver(torch.device("cpu"), deterministic=True)
    driver.on_report = reports.append
    try:
        tl = Timeline(unpool, driver, budget=1 << 20)
        tl.seek(tl.end)
        tl.replay_check()  # runs every node again: nothing new to report
    finally:
        determinism.apply(driver.replaced)
    assert len(reports) == 1 and "max_unpooling2d" in reports[0]
    (op, kernel), = driver.watch.found.items()
    assert op.startswith("aten.max_unpool2d") and kernel.startswith("max_unpooling2d")
    assert tl.nondeterminism == []  # on this machine it happened to replay bit for bit
