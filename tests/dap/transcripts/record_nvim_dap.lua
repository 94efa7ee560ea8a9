-- Drives real nvim-dap against Rewind for record_nvim_dap.py: what a user does, each step awaiting nvim-dap's own
-- follow-up requests (threads, stackTrace, scopes, the cheap scopes' variables). Exits non-zero if a step misbehaves.
-- The stdio session goes through the recording proxy; a second one checks the ${port} server adapter (unrecorded).
local dap = require('dap')
local entity = require('dap.entity')
local ROOT, PY, PROXY = vim.env.REWIND_ROOT, vim.env.REWIND_PY, vim.env.PROXY
local GPT = ROOT .. '/examples/gpt.py'
local function say(...) io.stdout:write(string.format(...) .. '\n') end
local function fail(msg) say('FAIL: %s', msg); io.stdout:flush(); vim.cmd('cquit 1') end
dap.adapters.rewind = {type = 'executable', command = PY, args = {PROXY}, options = {initialize_timeout_sec = 120}}
dap.adapters.rewind_tcp = {type = 'server', port = '${port}',
  executable = {command = PY, args = {'-m', 'dap_server', '--port', '${port}'}, cwd = ROOT},
  options = {initialize_timeout_sec = 120}}
local stops = {}
dap.listeners.after.event_stopped.drive = function(_, body) table.insert(stops, body) end
local function wait(ms, cond, what) if not vim.wait(ms, cond, 50) then fail('timed out waiting for ' .. what) end end
local function loaded(s)
  local f = s and s.current_frame
  if not (f and f.scopes) then return false end
  for _, sc in ipairs(f.scopes) do if not sc.expensive and sc.variables == nil then return false end end
  return true
end
local function motion(fn, what)
  local s = dap.session(); local before, n = s and s.current_frame, #stops
  fn()
  wait(180000, function() local t = dap.session(); return #stops > n and t.current_frame ~= before and loaded(t) end, what)
  local f = dap.session().current_frame
  say('%s: stopped %s, frame %q line %d', what, stops[#stops].reason, f.name, f.line)
  return f
end
local function line_of(text)
  for i, l in ipairs(vim.fn.readfile(GPT)) do if l:find(text, 1, true) then return i end end
end
local function locals() for _, sc in ipairs(dap.session().current_frame.scopes) do if sc.name:match('^Locals') then return sc end end end
local function children(var)
  local done = false
  entity.variable.fetch_children(var, function() done = true end)
  wait(30000, function() return done end, 'children of ' .. var.name)
  return var.variables
end

local SOFTMAX = line_of('weights = torch.softmax')
local OUT = line_of('out = (weights @ v)')
vim.cmd('edit ' .. GPT)
vim.api.nvim_win_set_cursor(0, {SOFTMAX, 0})
dap.toggle_breakpoint()
local f = motion(function()
  dap.run({type = 'rewind', request = 'launch', name = 'Rewind: gpt.py', program = GPT, driver = 'torch:cpu',
           cwd = ROOT})
end, 'launch')
if f.line ~= SOFTMAX then fail('launch did not stop at the breakpoint') end
local sc = locals(); local names = {}
for _, v in ipairs(sc.variables) do table.insert(names, v.name) end
say('Locals: %s', table.concat(names, ' '))
local done, result = false, nil
dap.session():evaluate('scores', function(err, r) result = err and ('error: ' .. err.message) or r.result; done = true end)
wait(30000, function() return done end, 'evaluate')
say('evaluate scores = %s', result)
f = motion(dap.continue, 'continue')           -- the next block's softmax
local tick_block1 = f.name
f = motion(dap.step_over, 'next')
if f.line ~= OUT then fail('next did not reach the next line') end
f = motion(dap.step_back, 'step back')
if f.line ~= SOFTMAX then fail('step back did not come back') end
f = motion(dap.reverse_continue, 'reverse continue')
if f.line ~= SOFTMAX or f.name == tick_block1 then fail('reverse continue did not reach the first block') end
-- setVariable through nvim-dap's own variable action (its prompt answered)
local var
for _, v in ipairs(locals().variables) do if v.name == 'scores' then var = v end end
local leaf, parent = var, nil
while leaf.variablesReference and leaf.variablesReference > 0 do
  local kids = children(leaf)
  local nxt
  for _, k in ipairs(kids) do if k.name:match('^%[') then nxt = k; break end end
  if not nxt then break end
  leaf = nxt
end
say('setting %s (%s) = %s', leaf.name, leaf.evaluateName or '?', leaf.value)
local action
for _, a in ipairs(entity.variable.tree_spec.compute_actions({item = leaf})) do if a.label == 'Set variable' then action = a end end
if not action then fail('nvim-dap offers no Set variable') end
vim.fn.input = function() return '0.5' end
f = motion(function() action.fn(nil, leaf, nil, {}) end, 'setVariable')
done = false
dap.session():evaluate(leaf.evaluateName, function(err, r) result = err and ('error: ' .. err.message) or r.result; done = true end)
wait(30000, function() return done end, 'evaluate edited')
say('after edit %s = %s', leaf.evaluateName, result)
f = motion(dap.step_back, 'step back over the edit')
-- gotoTargets from the cursor: nvim-dap sends the buffer's file:// URI
vim.api.nvim_win_set_cursor(0, {OUT, 0})
local offered
vim.ui.select = function(items, opts, cb) offered = #items; cb(items[1], 1) end  -- the first block's
f = motion(function() dap.goto_() end, 'goto')
if f.line ~= OUT then fail('goto did not reach the cursor line') end
say('goto offered %d targets', offered)
local closed = false
dap.listeners.after.disconnect.drive = function() closed = true end
dap.disconnect({terminateDebuggee = true})
wait(30000, function() return closed end, 'disconnect')
say('disconnected')
-- the same through a ${port} server adapter
wait(10000, function() return dap.session() == nil end, 'session end')
f = motion(function()
  dap.run({type = 'rewind_tcp', request = 'launch', name = 'Rewind TCP', program = GPT, driver = 'torch:cpu', cwd = ROOT})
end, 'tcp launch')
if f.line ~= SOFTMAX then fail('tcp launch did not stop at the breakpoint') end
f = motion(dap.step_back, 'tcp step back')
closed = false
dap.disconnect({terminateDebuggee = true})
wait(30000, function() return closed end, 'tcp disconnect')
say('OK')
io.stdout:flush()
vim.cmd('qall!')
