import * as assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, before, test } from 'node:test';
import { loadTimeline, runAction } from '../src/dap';
import { stepAt, TimelineItem } from '../src/timelineModel';
import { Adapter, lineOf, REPO } from './dapClient';

// Three SGD steps; only step 2's batch makes the backward of a log divide 0 by 0 (and its forward write -inf).
const MODEL = path.join(REPO, 'tests', 'models', 'training', 'session_late_nan.py');
let adapter: Adapter;
const child = (items: TimelineItem[], id: string) => items.find((i) => i.id === id)?.children ?? [];

before(async () => {
  adapter = Adapter.spawn();
  await adapter.start('launch', { program: MODEL, entry: 'train_step', steps: 3, driver: 'torch:cpu', stopOnEntry: true });
});
after(() => adapter.close());

test('the step of a tick is the last step starting at or before it', () => {
  const steps = [0, 22, 44].map((tick, step) => ({ step, tick, loss: `loss_${step}` }));
  assert.deepEqual([0, 21, 22, 43, 44, 66].map((t) => stepAt(steps, t)), [0, 0, 1, 1, 2, 2]);
});

test('a training run shows its steps and each tick its step and phase; births wait for the run to reach its end', async () => {
  const { items } = await loadTimeline(adapter);
  assert.deepEqual(items.map((i) => i.id), ['now', 'steps', 'births', 'divergence', 'checkpoints', 'ticks']);
  assert.match(items[0].label, /^Now: step 0, tick 0 of \d+$/);
  assert.match(items[0].description ?? '', /^forward · mul \(aten\.mul\.Tensor\) · session_late_nan\.py:\d+$/);
  const steps = child(items, 'steps');
  assert.deepEqual(steps.map((s) => s.label), ['step 0', 'step 1', 'step 2']);
  assert.deepEqual(steps.map((s) => s.current ?? false), [true, false, false]);
  assert.equal(items[1].description, 'NaN/Inf births: once the run has reached its end');
  assert.ok(steps.every((s) => s.mark === undefined), 'nothing marked before the births are known');
  assert.match(child(items, 'ticks')[0].description ?? '', /^step 0 · forward · mul /);
});

test('at the end of the run, the step whose backward made a NaN is marked with where it was born', async () => {
  const { end } = await adapter.customRequest('timeline', { count: 0 });
  await adapter.moved('goto', { threadId: 1, targetId: end + 1 });
  const { items } = await loadTimeline(adapter);
  assert.equal(items[1].description, '1 with NaN/Inf born');
  const steps = child(items, 'steps');
  assert.deepEqual(steps.map((s) => s.mark ?? null), [null, null, 'nan']);
  const bug = `session_late_nan\\.py:${lineOf(MODEL, '# BUG')}`;
  assert.match(steps[2].description ?? '', new RegExp(`^tick \\d+ · NaN and Inf born: log_step2 \\(${bug}\\), log_backward_step2 \\(${bug}\\)$`));
  assert.match(steps[2].tooltip ?? '', new RegExp(`NaN born at tick \\d+: 1 in log_backward_step2, .*${bug}; reaches an output`));
  assert.match(steps[2].tooltip ?? '', /Inf born at tick \d+: 1 in log_step2, .*; absorbed downstream/);
  assert.ok(steps[2].current, 'the end belongs to the last step');
  assert.deepEqual(child(items, 'births').map((b) => [b.description, b.mark]),
    [['Inf in log_step2 · session_late_nan.py:' + lineOf(MODEL, '# BUG'), 'inf'], ['NaN in log_backward_step2 · session_late_nan.py:' + lineOf(MODEL, '# BUG'), 'nan']]);
});

test('clicking a step goes to its start', async () => {
  const step = child((await loadTimeline(adapter)).items, 'steps')[1];
  const start = Number(/^tick (\d+)/.exec(step.description ?? '')?.[1]);
  await Promise.all([adapter.dc.waitForEvent('stopped'), runAction(adapter, step.action!)]);
  const { items, position } = await loadTimeline(adapter);
  assert.equal(position, start);
  assert.match(items[0].label, new RegExp(`^Now: step 1, tick ${start} of`));
  assert.deepEqual(child(items, 'steps').map((s) => s.current ?? false), [false, true, false]);
  assert.deepEqual(child(items, 'steps').map((s) => s.mark ?? null), [null, null, 'nan'], 'the births stay known');
});
