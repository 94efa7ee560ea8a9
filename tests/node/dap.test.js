// Rewind's DAP server driven over TCP by VS Code's own test client, @vscode/debugadapter-testsupport.
// One server and one DebugClient for the file (tests run in order); disconnected once, at the end.
const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { DebugClient } = require('@vscode/debugadapter-testsupport');

const ROOT = path.resolve(__dirname, '..', '..');
const PYTHON = process.env.REWIND_PYTHON || path.join(ROOT, '.venv', 'bin', 'python');
const GPT = fs.realpathSync(path.join(ROOT, 'examples', 'gpt.py'));
const SOURCE = fs.readFileSync(GPT, 'utf8').split('\n');
const lineOf = (text) => SOURCE.findIndex((line) => line.includes(text)) + 1;
const MASK = lineOf('mask = torch.ones');
const SCORES = lineOf('scores = q @ k');

let server;
let dc;

function listen() {
  server = spawn(PYTHON, ['-m', 'dap_server', '--port', '0'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    let seen = '';
    server.stderr.on('data', (chunk) => {
      seen += chunk;
      const match = /listening on [\d.]+:(\d+)/.exec(seen);
      if (match) resolve(Number(match[1]));
    });
    server.on('exit', (code) => reject(new Error(`the server exited (${code}) before listening: ${seen}`)));
  });
}

async function topFrame() {
  const trace = await dc.stackTraceRequest({ threadId: 1 });
  return trace.body.stackFrames[0];
}

async function scalar(expression) {
  const answer = await dc.evaluateRequest({ expression, context: 'repl', frameId: 1 });
  return Number(answer.body.result.split('=').pop());
}

before(async () => {
  const port = await listen();
  dc = new DebugClient('unused', 'unused', 'rewind');
  await dc.start(port);
}, { timeout: 30000 });

after(async () => {
  await dc.stop();
  server.kill();
}, { timeout: 30000 });

test('hitBreakpoint: a line breakpoint in attention stops there', { timeout: 120000 }, async () => {
  await dc.hitBreakpoint({ program: GPT, driver: 'torch:cpu' }, { path: GPT, line: MASK });
  assert.match((await topFrame()).name, /blocks\.0\.attn/);
});

test('stepBackRequest: steps back to the line before', { timeout: 60000 }, async () => {
  await Promise.all([
    dc.stepBackRequest({ threadId: 1 }),
    dc.assertStoppedLocation('step', { path: GPT, line: SCORES }),
  ]);
});

test('reverseContinueRequest: lands on the last hit before here', { timeout: 60000 }, async () => {
  await Promise.all([dc.continueRequest({ threadId: 1 }), dc.assertStoppedLocation('breakpoint', { line: MASK })]);
  await Promise.all([dc.continueRequest({ threadId: 1 }), dc.assertStoppedLocation('breakpoint', { line: MASK })]);
  assert.match((await topFrame()).name, /blocks\.1\.attn/);
  await Promise.all([
    dc.reverseContinueRequest({ threadId: 1 }),
    dc.assertStoppedLocation('breakpoint', { path: GPT, line: MASK }),
  ]);
  assert.match((await topFrame()).name, /blocks\.0\.attn/);
});

test('readMemoryRequest: the bytes of a tensor are its elements', { timeout: 60000 }, async () => {
  const scopes = await dc.scopesRequest({ frameId: 1 });
  const locals = scopes.body.scopes.find((scope) => scope.name === 'Locals');
  const variables = await dc.variablesRequest({ variablesReference: locals.variablesReference });
  const scores = variables.body.variables.find((variable) => variable.name === 'scores');
  assert.ok(scores.memoryReference);
  const memory = await dc.customRequest('readMemory', { memoryReference: scores.memoryReference, offset: 0, count: 16 });
  const bytes = Buffer.from(memory.body.data, 'base64');
  assert.equal(bytes.length, 16);
  for (let i = 0; i < 4; i++) {
    const expected = await scalar(`scores[0, 0, 0, ${i}]`);
    assert.ok(Math.abs(bytes.readFloatLE(4 * i) - expected) < 1e-5 * Math.max(1, Math.abs(expected)));
  }
});

test('evaluate refuses code and the session keeps serving', { timeout: 60000 }, async () => {
  await assert.rejects(dc.evaluateRequest({ expression: "__import__('os')", context: 'repl', frameId: 1 }),
    /not allowed/);
  const threads = await dc.threadsRequest();
  assert.equal(threads.body.threads[0].id, 1);
});
