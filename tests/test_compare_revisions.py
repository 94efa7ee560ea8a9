"""A side at a git revision (`model.py@HEAD~1`): read with git show into a temporary folder, named as the user
wrote it; the refactor of a committed model is localized to its line."""

import json
import subprocess
from pathlib import Path

from dap_server.cli import main

HERE = Path(__file__).parent / "models" / "candidates"


def committed(tmp_path: Path) -> Path:
    """A git repository whose model.py was committed as the original, then refactored (swapped projections)."""
    model = tmp_path / "model.py"
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    model.write_text((HERE / "attention_model.py").read_text())
    subprocess.run(git + ["add", "model.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "original"], check=True)
    model.write_text((HERE / "attention_refactor.py").read_text())
    subprocess.run(git + ["commit", "-qam", "refactor"], check=True)
    return model


def report(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["compare", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code != 2, err
    return code, json.loads(out)


def test_the_refactor_against_its_previous_revision_names_the_swapped_line(capsys, tmp_path):
    model = committed(tmp_path)
    code, found = report(capsys, str(model), "--against", f"{model}@HEAD~1")
    line = model.read_text().splitlines().index("        q = self.k_proj(x)") + 1
    assert code == 1 and found["reference"] == "model.py@HEAD~1"
    assert found["source"] == {"file": "model.py", "line": line, "text": "q = self.k_proj(x)"}
    assert not list(tmp_path.parent.glob("rewind-compare-*"))  # the revision's temporary folder is gone


def test_a_revision_as_the_candidate_is_named_as_written(capsys, tmp_path):
    model = committed(tmp_path)
    model.write_text((HERE / "attention_model.py").read_text())  # the working copy is the original again
    code, found = report(capsys, f"{model}@HEAD", "--against", str(model))
    assert code == 1 and found["candidate"] == "model.py@HEAD"
    assert found["source"]["file"] == "model.py@HEAD" and found["source"]["text"] == "q = self.k_proj(x)"


def test_the_same_revision_is_clean(capsys, tmp_path):
    model = committed(tmp_path)
    code, found = report(capsys, str(model), "--against", f"{model}@HEAD")
    assert code == 0 and found["verdict"] == "clean"
