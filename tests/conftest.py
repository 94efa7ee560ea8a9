"""Shared fixtures: programs are exported once per test session (export takes seconds)."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from dap_server import pool
from hardware.frontends.cache_folder import CACHE_DIR_ENV, CAP_ENV, NO_CACHE_ENV
from hardware.frontends.torch_export import load_program
from hardware.ranks.launcher import RankLauncher
from hardware.session import LaunchOptions, Session

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"

warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session", autouse=True)
def program_cache(tmp_path_factory):
    """The suite launches with the program cache on (a model's second launch loads its cached program, as a user's
    does), kept in one temporary folder that every worker of the run shares (an entry written once serves them
    all; entries are put in place whole, so workers writing at once see one or the other): nothing is written
    beside the repository's models. What the environment of the person running the tests says about the cache does
    not count. Processes the tests start inherit it."""
    saved = {k: os.environ.pop(k) for k in (CACHE_DIR_ENV, CAP_ENV, NO_CACHE_ENV) if k in os.environ}
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's folder is inside the run's, which all workers share
        base = base.parent
    folder = base / "program-cache"
    folder.mkdir(exist_ok=True)
    os.environ[CACHE_DIR_ENV] = str(folder)
    yield
    del os.environ[CACHE_DIR_ENV]
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def engine_pool(tmp_path_factory):
    """The DAP servers the tests start fork their engines from one pool of this worker's (docs/engine-pool.md), as a
    user running `rewind pool` has them: a session starts in milliseconds instead of seconds. Engines asked for
    in an environment it cannot give are started the usual way; tests/dap/test_engine_process.py runs some of its tests
    both ways."""
    folder = tmp_path_factory.mktemp("pool", numbered=True)
    path = str(folder / "engines.sock")
    with open(folder / "pool.log", "wb") as said:  # each engine it forks and reaps, to count them after a run
        process = pool.spawn(path, verbose=True, stderr=said.fileno())
    os.environ[pool.POOL_VARIABLE] = path
    yield process
    os.environ.pop(pool.POOL_VARIABLE, None)
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def launcher():
    """One rank launcher for a module's rank launches: it imports torch once and forks every launch's ranks."""
    launcher = RankLauncher()
    yield launcher
    launcher.close()


def fresh_module(path: str | Path) -> ModuleType:
    """The file imported anew, as a module of its own (not the one in sys.modules): eager runs of a model file."""
    spec = importlib.util.spec_from_file_location(f"eager_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def program(path: str, entry: str = "build"):
    return load_program(path, entry)


def open_session(path: Path, budget_mb: float = 256.0, every: int | None = None, events: list | None = None,
                 entry: str = "build", driver: str = "torch:cpu", **options) -> Session:
    """A launched Session; `options` are further LaunchOptions (the sim chip's seed, schedule, faults)."""
    sink = events.append if events is not None else None
    session = Session(sink)
    session.launch(LaunchOptions(str(path), entry=entry, driver=driver, budget_mb=budget_mb, every=every, **options),
                   program=program(str(path), entry))
    return session


@pytest.fixture
def gpt_path() -> Path:
    return EXAMPLES / "gpt.py"


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the first line of `path` that contains `text`."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
