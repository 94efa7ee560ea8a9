// The experiment and repair commands: the addPatch arguments a user's choices make, and the reports of
// a real adapter's answers on a model whose softmax overflows float16.

import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, test } from 'node:test';
import { runCommand } from '../src/commands';
import { addPatchArguments, defaultPatchName, parseAttributes, parseEdit, patchRefs, patchTargets } from '../src/experiments';
import { Adapter, lineOf, REPO } from './dapClient';

const MODEL = `${REPO}/tests/models/forensics/softmax_overflow.py`;
const EXP_LINE = lineOf(MODEL, 'torch.exp(scores)');
const FIX = `${REPO}/tests/models/fixes/stable_softmax.py`;
const STABLE = { text: fs.readFileSync(FIX, 'utf8'), file: FIX };

test('each patch kind makes the addPatch arguments of docs/protocol.md, named after what it patches', () => {
  assert.deepEqual(addPatchArguments({ kind: 'precision', node: 'exp', dtype: 'float32', branch: 'wide' }),
    { name: 'exp-float32', branch: 'wide', node: 'exp', precision: 'float32' });
  assert.deepEqual(addPatchArguments({ kind: 'function', node: 'exp', source: STABLE, name: 'stable' }),
    { name: 'stable', node: 'exp', function: STABLE.text });
  assert.deepEqual(addPatchArguments({ kind: 'attributes', node: 'blocks.0.ln1', attributes: 'eps=1e-3, elementwise_affine=false' }),
    { name: 'blocks.0.ln1-eps-elementwise_affine', node: 'blocks.0.ln1', attributes: { eps: 1e-3, elementwise_affine: false } });
  assert.deepEqual(addPatchArguments({ kind: 'edit', edit: 'div[0, 1, 2] = -0.5' }),
    { name: 'div[0,1,2]', edit: { value: 'div', index: [0, 1, 2], set: -0.5 } });
  assert.equal(defaultPatchName({ kind: 'function', node: 'exp', source: STABLE, entry: 'stable_exp' }), 'exp-stable_exp');
  assert.equal(defaultPatchName({ kind: 'function', node: 'exp', source: STABLE }), 'exp-stable_softmax');
});

test('a patch the user got wrong is refused with what is wrong, before the adapter sees it', () => {
  assert.throws(() => addPatchArguments({ kind: 'precision', node: 'exp', dtype: 'float8' }), /one of float64, float32, float16, bfloat16, got 'float8'/);
  assert.throws(() => addPatchArguments({ kind: 'function', source: STABLE }), /needs the node to patch/);
  assert.throws(() => addPatchArguments({ kind: 'function', node: 'exp' }), /needs the Python file that defines the function/);
  assert.throws(() => parseAttributes('eps'), /'eps' is not NAME=VALUE/);
  assert.throws(() => parseAttributes('eps=True'), /eps=True: the value is not JSON/);
  assert.throws(() => parseAttributes(''), /give the attributes to change as NAME=VALUE/);
  assert.deepEqual(parseAttributes('dims=[0, 1] mode="sum"'), { dims: [0, 1], mode: 'sum' });
  assert.throws(() => parseEdit('div 0 1 2 = 0'), /is not VALUE\[I, J, \.\.\.\] = NUMBER/);
  assert.throws(() => parseEdit('div[0] = NaN'), /a finite number .* got 'NaN'/);
});

let adapter: Adapter;
before(async () => {
  process.env.REWIND_KNOWLEDGE = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'rewind-')), 'fixes.json');
  adapter = Adapter.spawn();
  await adapter.start('launch', { program: MODEL, driver: 'torch:cpu', stopOnEntry: true });
});
after(() => adapter.close());

test('the nodes to patch are the pass\'s, in order, with their op and line, then module paths of several', async () => {
  const targets = await patchTargets(adapter);
  assert.deepEqual(targets.map((t) => t.name), ['linear', 'linear_1', 'transpose', 'matmul', 'exp', 'sum_1', 'div', 'matmul_1']);
  assert.equal(targets[4].detail, `aten.exp.default at softmax_overflow.py:${EXP_LINE}, tick 4`);
});

test('patches on two branches are listed, measured as a table, compared, undone and removed', async () => {
  await runCommand(adapter, 'rewind.addPatch', { patch: { kind: 'function', node: 'exp', source: STABLE, branch: 'stable', name: 'stable-exp' } });
  const listed = await runCommand(adapter, 'rewind.addPatch', { patch: { kind: 'precision', node: 'exp', dtype: 'float32', branch: 'wide' } });
  assert.deepEqual(listed.split('\n'), [
    '  original (the recorded pass)',
    '  stable, patched from tick 4',
    `    stable-exp: exp (tick 4, softmax_overflow.py:${EXP_LINE}) replaced by stable_exp from stable-exp`,
    '* wide, patched from tick 4',
    `    exp-float32: exp (tick 4, softmax_overflow.py:${EXP_LINE}) run at float32`]);

  const measured = (await runCommand(adapter, 'rewind.measureBranch', { branch: 'stable' })).split('\n');
  assert.equal(measured[0], 'branch stable, patched from tick 4 (errors in units of tolerance)');
  assert.match(measured[2], /^ {2}matmul_1 {2}within \([\d.]+\) {2}48 beyond \(inf\), 48 NaN\/Inf {2}48 beyond \(inf\)$/);
  assert.deepEqual(measured.slice(5, 9).map((l) => l.trim().split(/\s+/).slice(0, 2)),
    [['4', 'exp*'], ['5', 'sum_1'], ['6', 'div'], ['7', 'matmul_1']]);
  assert.match(measured.at(-1)!, /^time from tick 4: [\d.]+ (µs|ms|s) \(original [\d.]+ (µs|ms|s)\)$/);

  const compared = (await runCommand(adapter, 'rewind.compareBranches', { branches: ['stable', 'wide'] })).split('\n');
  assert.match(compared[2], /^ {2}matmul_1 {2}48 beyond \(inf\), 48 NaN\/Inf {2}within \([\d.]+\) {2}48 beyond \(inf\), 48 NaN\/Inf$/);
  const exp = compared[5].trim().split(/\s{2,}/);
  assert.deepEqual(exp.slice(0, 4), ['4', 'exp', 'aten.exp.default', 'inf']);
  assert.ok(exp[4].endsWith('*') && exp[5].endsWith('*'), compared[5]); // both branches patch exp

  assert.match(await runCommand(adapter, 'rewind.undoPatches', {}), /^\* original/);
  assert.match(await runCommand(adapter, 'rewind.installBranch', { branch: 'wide' }), /\n\* wide,/);
  const refs = patchRefs(await adapter.customRequest('listPatches', {}));
  assert.deepEqual(refs.map((r) => [r.branch, r.name]), [['stable', 'stable-exp'], ['wide', 'exp-float32']]);
  const removed = await runCommand(adapter, 'rewind.removePatch', { patchRef: { branch: 'wide', name: 'exp-float32' } });
  assert.ok(removed.startsWith('* original') && !removed.includes('wide'), removed); // the branch was installed: the original is
  assert.equal(await runCommand(adapter, 'rewind.listPatches', {}), removed);
});

test('the adapter\'s refusal of a patch reaches the user with its reason', async () => {
  await assert.rejects(runCommand(adapter, 'rewind.addPatch', { patch: { kind: 'attributes', node: 'exp', attributes: 'eps=1e-3' } }),
    /has no attribute 'eps' \(its attributes: none\)/);
  await assert.rejects(runCommand(adapter, 'rewind.measureBranch', {}), /rewind.measureBranch needs an experiment branch/);
  await assert.rejects(runCommand(adapter, 'rewind.measureBranch', { branch: 'nope' }), /no branch 'nope'/);
});

test('Repair validates a fix file with its evidence, and Suggest fixes then offers it first', async () => {
  const verdict = (await runCommand(adapter, 'rewind.repair', { fixes: [{ text: STABLE.text, name: 'stable_softmax.py' }] })).split('\n');
  assert.equal(verdict[0], `finding: nonfinite at softmax_overflow.py:${EXP_LINE}, node exp (aten.exp.default): exp-overflow`);
  assert.match(verdict[1], /^attempt 1: stable_softmax\.py: VALIDATED: /);
  assert.match(verdict[2], /^ {2}example: ok \(worst output error [\d.]+× tolerance\)$/);
  assert.match(verdict.at(-2)!, /^recorded in the knowledge base \(.*fixes\.json\): exp-overflow → stable_softmax\.py \(validated 1 time\(s\)\)$/);
  assert.match(verdict.at(-1)!, /^verdict: validated: /);
  const suggested = (await runCommand(adapter, 'rewind.suggestFixes', {})).split('\n');
  assert.match(suggested[1], /^suggested for exp: stable_softmax\.py \(learned, validated 1 time\(s\)/);
});
