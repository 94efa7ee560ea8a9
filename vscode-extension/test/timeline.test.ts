import * as assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadTimeline, runAction } from '../src/dap';
import { tickWindow, TimelineItem } from '../src/timelineModel';
import { Adapter, REPO } from './dapClient';

let adapter: Adapter;
const child = (items: TimelineItem[], id: string) => items.find((i) => i.id === id)?.children ?? [];

before(async () => {
  adapter = Adapter.spawn();
  await adapter.start('launch', { program: `${REPO}/examples/gpt.py`, driver: 'torch:cpu', stopOnEntry: true, checkpoint: { every: 8 } });
  await adapter.moved('goto', { threadId: 1, targetId: 21 }); // tick 20: checkpoints at 8 and 16 behind
});
after(() => adapter.close());

test('the window of ticks is centred on the position and starts at 0 at the beginning', () => {
  assert.deepEqual(tickWindow(20), { start: 12, count: 17 });
  assert.deepEqual(tickWindow(3), { start: 0, count: 12 });
});

test('an inference pass shows the current tick, its births and divergence, the checkpoints and the ticks around now, and no steps', async () => {
  const { position, items } = await loadTimeline(adapter);
  assert.equal(position, 20);
  assert.deepEqual(items.map((i) => i.id), ['now', 'births', 'divergence', 'checkpoints', 'ticks']);
  assert.match(items[0].label, /^Now: tick 20 of \d+$/);
  assert.match(items[0].description ?? '', /\(aten\.[a-z_]+\.[a-z_]+\).* · gpt\.py:\d+$/);
  const checkpoints = child(items, 'checkpoints');
  assert.deepEqual(checkpoints.slice(0, 3).map((c) => c.label), ['tick 0', 'tick 8', 'tick 16']);
  assert.match(checkpoints[1].description ?? '', /^host · [\d.]+ (B|KiB|MiB) · \d+ values$/);
  const ticks = child(items, 'ticks');
  assert.deepEqual([ticks[0].label, ticks.at(-1)?.label], ['tick 12', 'tick 28']);
  assert.deepEqual(ticks.filter((t) => t.current).map((t) => t.label), ['tick 20']);
  assert.match(ticks.at(-1)?.description ?? '', / · not run yet$/);
  assert.ok(ticks.every((t) => !/^(step \d+|forward) · /.test(t.description ?? '')), 'an inference pass shows no steps or phases');
});

test('clicking a tick goes there and clicking a checkpoint restores it', async () => {
  const ticks = child((await loadTimeline(adapter)).items, 'ticks');
  await Promise.all([adapter.dc.waitForEvent('stopped'), runAction(adapter, ticks[2].action!)]);
  assert.match((await loadTimeline(adapter)).items[0].label, /^Now: tick 14 of/);
  const checkpoint = child((await loadTimeline(adapter)).items, 'checkpoints').find((c) => c.label === 'tick 8');
  await Promise.all([adapter.dc.waitForEvent('stopped'), runAction(adapter, checkpoint!.action!)]);
  const { items } = await loadTimeline(adapter);
  assert.match(items[0].label, /^Now: tick 8 of/);
  assert.ok(child(items, 'checkpoints').find((c) => c.label === 'tick 8')?.current);
});
