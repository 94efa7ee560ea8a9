// The Timeline view's marks: each birth of NaN/Inf and where the pass started to diverge from its reference, on an
// inference pass with a planted float16 overflow (exp writes Inf at line `# BUG`, the division after it NaN).

import * as assert from 'node:assert/strict';
import * as path from 'node:path';
import { after, before, test } from 'node:test';
import { loadTimeline, runAction } from '../src/dap';
import { DivergenceWatch } from '../src/divergenceWatch';
import { Birth, MAX_BIRTHS_SHOWN, timelineTree, TimelineItem } from '../src/timelineModel';
import { Adapter, lineOf, REPO } from './dapClient';

const MODEL = path.join(REPO, 'tests', 'models', 'forensics', 'softmax_overflow.py');
const BUG = lineOf(MODEL, '# BUG');
let adapter: Adapter;
const item = (items: TimelineItem[], id: string) => items.find((i) => i.id === id) as TimelineItem;

before(async () => {
  adapter = Adapter.spawn();
  await adapter.start('launch', { program: MODEL, driver: 'torch:cpu', stopOnEntry: true });
});
after(() => adapter.close());

const birth = (tick: number, kind: Birth['kind'], value: string): Birth =>
  ({ tick, node: value, op: 'aten.exp.default', source: `/m/model.py:${tick}`, value, kind, count: 1, reachesOutput: true });
const entry = (tick: number) =>
  ({ tick, unit: 'host', node: `n${tick}`, op: 'aten.exp.default', source: null, module: null, executed: true, edit: null });

test('a tick is marked by the worst birth there, else by the divergence starting there; long lists of births are cut', () => {
  const births = [birth(2, 'nan', 'a'), birth(2, 'inf', 'b'), birth(3, 'inf', 'c'),
    ...Array.from({ length: MAX_BIRTHS_SHOWN }, (_, i) => birth(10 + i, 'inf', `v${i}`))];
  const divergence = { reference: 'torch:cpu:float64', divergence: {
    tick: 1, node: 'n1', op: 'aten.exp.default', source: null, value: 'n1', count: 3, pattern: null,
    origin: { node: 'n0', op: 'aten.cos.default', source: '/m/model.py:7', tick: 0 } } };
  const window = { position: 1, end: 200, ticks: [0, 1, 2, 3].map(entry) };
  const items = timelineTree(window, [], births, divergence);
  assert.deepEqual(item(items, 'ticks').children?.map((t) => t.mark ?? null), [null, 'divergence', 'nan', 'inf']);
  assert.match(item(items, 'ticks').children?.[2].tooltip ?? '', /\nNaN born at tick 2: 1 in a, written by a/);
  const listed = item(items, 'births').children ?? [];
  assert.equal(item(items, 'births').label, `NaN/Inf born (${births.length})`);
  assert.deepEqual([listed.length, listed.at(-1)?.label], [MAX_BIRTHS_SHOWN + 1, '+3 more']);
  assert.deepEqual([item(items, 'divergence').label, item(items, 'divergence').current], ['Divergence started: tick 1', true]);
  const origin = item(items, 'divergence').children?.[0];
  assert.deepEqual([origin?.label, origin?.description, origin?.action?.args.targetId], ['error introduced: tick 0', 'n0 · model.py:7', 1]);
  const none = timelineTree(window, [], [], { reference: 'torch:cpu:float64', divergence: null, divergenceReason: 'no node leaves it' });
  assert.deepEqual([item(none, 'births').description, item(none, 'divergence').label, item(none, 'divergence').tooltip],
    ['none in this run', 'No divergence', 'no node leaves it']);
});

test('before the run has reached its end and before forensics, the view says what it does not know yet', async () => {
  const { items } = await loadTimeline(adapter);
  assert.deepEqual(items.map((i) => i.id), ['now', 'births', 'divergence', 'checkpoints', 'ticks']);
  assert.deepEqual([item(items, 'births').description, item(items, 'births').children], ['known once the run has reached its end', undefined]);
  assert.equal(item(items, 'divergence').label, 'Divergence: not looked for');
});

test('at the end of an inference pass, each birth of NaN/Inf is marked with its node and line, and a click goes there', async () => {
  const { end } = await adapter.customRequest('timeline', { count: 0 });
  await adapter.moved('goto', { threadId: 1, targetId: end + 1 });
  const births = item((await loadTimeline(adapter)).items, 'births');
  assert.equal(births.label, 'NaN/Inf born (2)');
  const [inf, nan] = births.children ?? [];
  assert.deepEqual([inf.label, inf.description, inf.mark], ['tick 4', `Inf in exp · softmax_overflow.py:${BUG}`, 'inf']);
  assert.deepEqual([nan.label, nan.description, nan.mark], ['tick 6', `NaN in div · softmax_overflow.py:${BUG + 1}`, 'nan']);
  assert.match(inf.tooltip ?? '', new RegExp(`^Inf born at tick 4: 4 in exp, written by exp \\(aten\\.exp\\.default\\) at .*softmax_overflow\\.py:${BUG}; reaches an output\\n`));
  await Promise.all([adapter.dc.waitForEvent('stopped'), runAction(adapter, nan.action!)]);
  const { position, items } = await loadTimeline(adapter);
  assert.equal(position, 6);
  assert.ok(item(items, 'births').children?.[1].current);
  assert.deepEqual(item(items, 'ticks').children?.filter((t) => t.mark).map((t) => [t.label, t.mark]), [['tick 4', 'inf'], ['tick 6', 'nan']]);
});

test('once forensics has found where the divergence started it is marked there, until the pass changes', async () => {
  const watch = new DivergenceWatch();
  assert.equal(watch.heard(await adapter.dc.customRequest('firstDivergence', {})), true);
  const divergence = item((await loadTimeline(adapter, watch.known)).items, 'divergence');
  assert.deepEqual([divergence.label, divergence.description, divergence.mark],
    ['Divergence started: tick 4', `exp · softmax_overflow.py:${BUG}`, 'divergence']);
  assert.match(divergence.tooltip ?? '', /^4 elements of exp beyond tolerance of torch:cpu:float64, .*\nexp\/softmax overflow without max subtraction; fix: subtract the row max/);
  await Promise.all([adapter.dc.waitForEvent('stopped'), runAction(adapter, divergence.action!)]);
  const { position, items } = await loadTimeline(adapter, watch.known);
  assert.deepEqual([position, item(items, 'divergence').current], [4, true]);
  assert.equal(watch.heard(await adapter.dc.customRequest('timeline', { count: 0 })), false, 'reading changes nothing');
  assert.equal(watch.heard(await adapter.dc.customRequest('restoreBranch', { branch: 'original' })), true);
  assert.equal(item((await loadTimeline(adapter, watch.known)).items, 'divergence').label, 'Divergence: not looked for');
});
