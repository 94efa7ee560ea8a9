"""A user's file becomes a Program: nodes, source lines, module stacks; bad files fail clearly."""

from pathlib import Path

import pytest

from hardware.drivers import open_driver
from hardware.errors import DriverError, ProgramLoadError
from hardware.frontends.torch_export import load_program
from tests.conftest import EXAMPLES, MODELS, program


def test_nodes_carry_user_source_line_and_module_stack():
    prog = program(str(EXAMPLES / "gpt.py"))
    source = (EXAMPLES / "gpt.py").read_text().splitlines()
    qkv = next(n for n in prog.nodes if n.module_path == "blocks.0.attn.qkv")
    assert qkv.op == "aten.linear.default"
    assert "self.qkv(x)" in source[qkv.loc.line - 1]
    assert Path(qkv.loc.file).name == "gpt.py"
    assert [f.module_path for f in qkv.frames] == ["", "blocks.0", "blocks.0.attn"]
    assert all("torch" not in Path(f.loc.file).parts for n in prog.nodes for f in n.frames)
    softmaxes = prog.find_nodes("aten.softmax")
    assert len(softmaxes) == 2


def test_parameters_buffers_and_inputs_are_values():
    prog = program(str(EXAMPLES / "gpt.py"))
    kinds = {v.kind for v in prog.values.values()}
    assert {"parameter", "input", "intermediate"} <= kinds
    weight = prog.values["p_blocks_1_attn_qkv_weight"]
    assert weight.target == "blocks.1.attn.qkv.weight" and weight.shape == (96, 32)
    kv = program(str(EXAMPLES / "kv_cache.py"))
    assert set(kv.buffer_mutations.values()) == {"b_k_cache", "b_v_cache"}


@pytest.mark.parametrize("entry, message", [
    ("missing_entry", "defines no 'missing_entry'"),
    ("not_callable", "is not callable"),
    ("returns_module_only", "must return (torch.nn.Module, tuple_of_inputs)"),
    ("returns_wrong_inputs", "tuple belongs"),
    ("raises", "failed: weights file missing (at bad_models.py:"),
])
def test_bad_entry_names_the_cause(entry, message):
    with pytest.raises(ProgramLoadError) as err:
        load_program(MODELS / "bad_models.py", entry)
    assert message in str(err.value)


def test_missing_file_is_named():
    with pytest.raises(ProgramLoadError, match="program file not found: .*nowhere.py"):
        load_program("/nowhere.py")


def test_export_failure_keeps_exports_message():
    with pytest.raises(ProgramLoadError) as err:
        load_program(MODELS / "bad_models.py", "export_fails")
    text = str(err.value)
    assert text.startswith("torch.export failed for bad_models")
    assert "data-dependent" in text.lower() or "guard" in text.lower()


def test_driver_specs():
    assert open_driver("torch:cpu").name == "torch:cpu"
    assert open_driver("auto").name in ("torch:cpu", "torch:cuda:0")
    with pytest.raises(DriverError, match="unknown driver 'tpu'"):
        open_driver("tpu")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(DriverError, match="CUDA is not available"):
            open_driver("torch:cuda:1")
