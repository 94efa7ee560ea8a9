import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, test } from 'node:test';
import { COMMANDS, nodesAtLine, runCommand, SHOW_TENSOR, TIMELINE_GO, TIMELINE_REFRESH } from '../src/commands';
import { contributions } from '../src/contributions';
import { Adapter, lineOf, REPO } from './dapClient';

const GPT = `${REPO}/examples/gpt.py`;

test('every command package.json declares is one the extension runs, and the other way round', () => {
  const declared = contributions().commands.map((c) => c.command).sort();
  assert.deepEqual(declared, [...Object.keys(COMMANDS), SHOW_TENSOR, TIMELINE_REFRESH, TIMELINE_GO].sort());
});

let adapter: Adapter;
before(async () => {
  adapter = Adapter.spawn();
  await adapter.start('launch', { program: GPT, driver: 'torch:cpu', stopOnEntry: true });
  await adapter.customRequest('setBreakpoints', { source: { path: GPT }, breakpoints: [{ line: lineOf(GPT, 'scores = q @ k') }] });
  await adapter.moved('continue', { threadId: 1 });
});
after(() => adapter.close());

test('a command without what it needs, or an unknown command, is refused by name', async () => {
  await assert.rejects(runCommand(adapter, 'rewind.locateTensor', {}), /rewind.locateTensor needs a tensor: run it on a variable, or type a name/);
  await assert.rejects(runCommand(adapter, 'rewind.saveTrace', {}), /needs a file to save the trace to/);
  await assert.rejects(runCommand(adapter, 'rewind.nothing', {}), /'rewind.nothing' is not a Rewind command/);
});

test('Locate tensor reports where a source variable lives, strides and all', async () => {
  const text = await runCommand(adapter, 'rewind.locateTensor', { value: { name: 'k' } });
  assert.match(text, /^transpose_1 lives at\n {2}cpu · host · 0x[0-9a-f]+ · 5\.8 KiB · float32\[1, 4, 16, 8\] strides \[1536, 8, 96, 1\] · unit host$/);
});

test('Show provenance reports the writer, the writes and the lineage', async () => {
  const lines = (await runCommand(adapter, 'rewind.showProvenance', { value: { name: 'q' } })).split('\n');
  assert.equal(lines[0], 'transpose: intermediate float32[1, 4, 16, 8]');
  assert.match(lines[1], /^ {2}last written tick \d+: aten\.transpose\.int 'transpose' \(view, unit host\) at .*gpt\.py:23 · /);
  assert.equal(lines[2], '  writes (1):');
  assert.match(lines.at(-2)!, /^ {2}computed from \d+ nodes: transpose \(aten\.transpose\.int\) ← view \(aten\.view\.default\) ← /);
  assert.match(lines.at(-1)!, /^ {2}roots: .*tokens/);
});

test('the nodes of an editor line are those it runs itself, not those of the calls it makes', async () => {
  assert.deepEqual(await nodesAtLine(adapter, GPT, lineOf(GPT, 'scores = q @ k')), ['transpose_3', 'matmul', 'div']);
  await assert.rejects(nodesAtLine(adapter, GPT, lineOf(GPT, 'x = block(x)')), /gpt\.py:\d+ runs no node itself \(it calls others\)/);
  await assert.rejects(nodesAtLine(adapter, GPT, 1), /no node runs at line 1: it performs no tensor operation/);
});

test('Save trace writes the recorded run to the file and says how much', async () => {
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'rewind-')), 'run.rwtrace');
  const text = await runCommand(adapter, 'rewind.saveTrace', { path: file });
  assert.match(text, new RegExp(`^saved \\d+ ticks to ${file} \\([\\d.]+ KiB\\)$`));
  assert.equal(fs.readFileSync(file).subarray(0, 8).toString('latin1'), 'RWNDTRC\0');
});
