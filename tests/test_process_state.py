"""A Session gives back the process-wide state it changed when it closes: torch's determinism settings, sys.path,
the user's modules in sys.modules, linecache entries; and each DAP session numbers its own progress reports."""

from __future__ import annotations

import gc
import linecache
import os
import sys
import textwrap
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import hardware.session.session as session_module
from dap_server.events import SessionEvents
from hardware import determinism
from hardware.drivers.torch import TorchDriver
from hardware.errors import ProgramLoadError
from hardware.frontends.torch_export import load_module
from hardware.session import LaunchOptions, Session
from provenance.fixes import named_patch, text_file
from tests.conftest import EXAMPLES, MODELS, program

GPT = str(EXAMPLES / "gpt.py")
# Not deterministic, and unlike what a deterministic driver sets in every field it can
BEFORE = determinism.Determinism(algorithms=False, warn_only=False, fill_uninitialized=True,
                                 cudnn_deterministic=False, cudnn_benchmark=True, cublas_workspace=None)
IDENTITY = "def keep(x, *args, **kwargs):\n    return x\n"


@pytest.fixture(autouse=True)
def process_settings():
    """Start from BEFORE with no leftover holders (drivers other tests dropped), and put back what was there."""
    gc.collect()
    found = determinism.current()
    determinism.apply(BEFORE)
    yield
    determinism.apply(found)


@pytest.fixture
def deterministic_drivers(monkeypatch):
    """Sessions open the driver a GPU run gets (one that switches torch to deterministic kernels), on the CPU."""
    monkeypatch.setattr(session_module, "open_driver",
                        lambda spec, options=None: TorchDriver(torch.device("cpu"), deterministic=True))


def launched(path: str = GPT, given: bool = True) -> Session:
    session = Session()
    session.launch(LaunchOptions(path, driver="torch:cpu", budget_mb=64), program=program(path) if given else None)
    return session


def is_deterministic() -> bool:
    now = determinism.current()
    return (now.algorithms, now.cudnn_deterministic, now.cudnn_benchmark) == (True, True, False)


# -- 1. determinism settings ----------------------------------------------------------------------------------

def test_closing_a_session_gives_back_the_determinism_settings_its_driver_switched(deterministic_drivers):
    session = launched()
    assert is_deterministic() and os.environ[determinism.CUBLAS_WORKSPACE] == ":4096:8"
    session.close()
    assert determinism.current() == BEFORE
    assert determinism.CUBLAS_WORKSPACE not in os.environ


@pytest.mark.parametrize("first", [0, 1], ids=["first-opened-closes-first", "last-opened-closes-first"])
def test_two_sessions_keep_determinism_until_the_last_of_them_closes(deterministic_drivers, first):
    sessions = [launched(), launched()]
    sessions[first].close()
    assert is_deterministic()  # the other one still replays
    sessions[1 - first].close()
    assert determinism.current() == BEFORE


def test_a_relaunch_onto_a_driver_that_needs_no_determinism_gives_the_settings_back(deterministic_drivers,
                                                                                      monkeypatch):
    session = launched()
    assert is_deterministic()
    monkeypatch.setattr(session_module, "open_driver", lambda spec, options=None: TorchDriver(torch.device("cpu")))
    session.launch(LaunchOptions(GPT, driver="torch:cpu", budget_mb=64), program=program(GPT))
    assert determinism.current() == BEFORE
    session.close()
    assert determinism.current() == BEFORE


def test_a_deterministic_driver_no_session_closes_gives_the_settings_back_once_dropped():
    from checkpoint.timeline import Timeline

    timeline = Timeline(program(GPT), TorchDriver(torch.device("cpu"), deterministic=True), budget=1 << 24)
    timeline.seek(timeline.end)  # a reference pass: run to the end, kept for its values
    assert is_deterministic()
    del timeline
    gc.collect()
    assert determinism.current() == BEFORE


# -- 2. progress ids --------------------------------------------------------------------------------------------

def progress_ids(events: SessionEvents, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        with events.progress("work", cancellable=False) as progress:
            ids.append(progress.id)
    return ids


def test_each_dap_session_numbers_its_progress_reports_from_one():
    def adapter():
        return SimpleNamespace(emit=lambda event, body: None, client=SimpleNamespace(progress=True))

    first, second = SessionEvents(adapter()), SessionEvents(adapter())
    assert progress_ids(first, 2) == ["rewind-progress-1", "rewind-progress-2"]
    assert progress_ids(second, 2) == ["rewind-progress-1", "rewind-progress-2"]
    assert progress_ids(first, 1) == ["rewind-progress-3"]


# -- 3. sys.path and the user's modules -------------------------------------------------------------------------

def test_a_session_on_a_model_that_edits_sys_path_leaves_sys_path_and_sys_modules_as_they_were():
    """deep_gpt.py puts examples/ on sys.path and imports gpt from there."""
    path_before, modules_before = list(sys.path), set(sys.modules)
    session = launched(str(MODELS / "deep_gpt.py"), given=False)
    session.close()
    assert sys.path == path_before
    user_folders = {str(EXAMPLES), str(MODELS)}
    added = {name for name in set(sys.modules) - modules_before
             if os.path.dirname(getattr(sys.modules[name], "__file__", None) or "") in user_folders}
    assert added == set()


def test_a_model_whose_import_raises_leaves_sys_path_as_it_was(tmp_path):
    model = tmp_path / "broken.py"
    model.write_text("import sys\nsys.path.insert(0, '/nowhere')\nraise ValueError('half written')\n")
    before = list(sys.path)
    with pytest.raises(ProgramLoadError, match="half written"):
        load_module(model)
    assert sys.path == before


def write_model(folder: Path, scale: float) -> Path:
    """A model.py that imports its own layers.py (the same names in every folder)."""
    folder.mkdir()
    (folder / "layers.py").write_text(f"SCALE = {scale}\n")
    model = folder / "model.py"
    model.write_text(textwrap.dedent("""\
        import torch
        import layers

        class Scale(torch.nn.Module):
            def forward(self, x):
                return x * layers.SCALE

        def build():
            return Scale(), (torch.ones(3),)
    """))
    return model


def test_two_model_files_of_one_name_in_two_folders_each_run_their_own_code(tmp_path):
    for scale in (2.0, 5.0):
        session = launched(str(write_model(tmp_path / f"scale{int(scale)}", scale)), given=False)
        session.run()
        assert torch.equal(session.tensor(session.program.outputs[0]), torch.full((3,), scale))
        session.close()
    assert "layers" not in sys.modules


# -- 4. linecache -------------------------------------------------------------------------------------------------

@pytest.fixture
def only_these_sessions(monkeypatch):
    """The sessions this test opens are the process's only open ones: fix sources go when the last open Session
    closes, and a module fixture elsewhere in this process may hold a Session open all along."""
    monkeypatch.setattr(session_module, "_OPEN", weakref.WeakSet())


def fix_source_in_linecache(session: Session) -> str:
    """Load a patch function (the addPatch request's way); the pseudo file linecache holds its text under."""
    named_patch(session.program, "keep", session.program.nodes[0].name, function=IDENTITY)
    file = text_file(IDENTITY, "function")
    assert linecache.getline(file, 1) == IDENTITY.splitlines(True)[0]
    return file


def test_closing_a_session_drops_the_fix_sources_it_put_in_linecache(only_these_sessions):
    session = launched()
    before = set(linecache.cache)
    fix_source_in_linecache(session)
    session.close()
    assert set(linecache.cache) == before


@pytest.mark.parametrize("first", [0, 1], ids=["first-opened-closes-first", "last-opened-closes-first"])
def test_fix_sources_stay_in_linecache_until_the_last_open_session_closes(first, only_these_sessions):
    sessions = [launched(), launched()]
    file = fix_source_in_linecache(sessions[0])
    sessions[first].close()
    assert linecache.getline(file, 1) == IDENTITY.splitlines(True)[0]  # the other session's tracebacks show it
    sessions[1 - first].close()
    assert file not in linecache.cache
