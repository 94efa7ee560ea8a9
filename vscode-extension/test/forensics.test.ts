// The forensics commands against a model with a planted catastrophic cancellation.

import * as assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { runCommand } from '../src/commands';
import { Adapter, lineOf, REPO } from './dapClient';

const MODEL = `${REPO}/tests/models/forensics/cancellation.py`;
const BUG = lineOf(MODEL, 'bend = 1 - torch.cos(angle)');

let adapter: Adapter;
before(async () => {
  adapter = Adapter.spawn();
  await adapter.start('launch', { program: MODEL, driver: 'torch:cpu', stopOnEntry: true });
});
after(() => adapter.close());

test('Compare with reference reports the outputs, the worst nodes and the first divergence with its fix', async () => {
  const lines = (await runCommand(adapter, 'rewind.compareWithReference', {})).split('\n');
  assert.deepEqual(lines.slice(0, 2), ['against the reference torch:cpu:float64:', '  outputs:']);
  assert.match(lines[2], /^ {4}linear \(float32\): 32 elements beyond tolerance, worst 3\.05e\+3× tolerance, max \|error\| 0\.184$/);
  assert.equal(lines[3], '  3 of 5 node outputs beyond tolerance, worst first:');
  assert.deepEqual(lines.slice(4, 7).map((l) => l.split(' at ')[0]),
    ['    tick 3 div (aten.div.Tensor)', '    tick 4 linear (aten.linear.default)', '    tick 1 rsub (aten.rsub.Scalar)']);
  assert.match(lines[7], new RegExp(`^ {2}first divergence: tick 1 rsub \\(aten\\.rsub\\.Scalar\\) at .*cancellation\\.py:${BUG} \\(float32\\): 32 elements`));
  assert.match(lines[8], /^ {4}catastrophic cancellation: operands up to 1 cancel/);
  assert.match(lines[9], /^ {4}fix: avoid subtracting nearly equal quantities/);
});

test('Ablate precision here runs the line in float64 and the outputs come within tolerance', async () => {
  const text = await runCommand(adapter, 'rewind.ablatePrecision', { line: { file: MODEL, line: BUG } });
  assert.match(text, /^ran cos in float64, rsub in float64: the outputs are within tolerance\n {2}linear: 3\.05e\+3× tolerance before, [\d.e+-]+× after$/);
});
