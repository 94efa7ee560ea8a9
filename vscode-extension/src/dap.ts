// What the extension asks the adapter, over any client with `customRequest` (a vscode.DebugSession
// in the editor, a plain DAP connection in tests): the Timeline view's data, a tensor slice for the
// Tensor view, and the requests behind the Rewind commands.

import { FirstDivergence } from './divergenceWatch';
import { byteSpan, gather, Location, sliceOf, stats, TensorPayload } from './tensorData';
import { Action, Birth, CheckpointEntry, tickWindow, TimelineBody, timelineTree, TimelineItem } from './timelineModel';

export interface DebugClient {
  customRequest(command: string, args?: unknown): PromiseLike<any>;
}

export const MAX_READ_BYTES = 4 * 2 ** 20; // the adapter's readMemory limit per request

/** The Timeline view's tree, and the position it shows; `divergence`: what forensics last found (DivergenceWatch). */
export async function loadTimeline(client: DebugClient, divergence?: FirstDivergence): Promise<{ position: number; items: TimelineItem[] }> {
  const now: TimelineBody = await client.customRequest('timeline', { count: 0 });
  const window: TimelineBody = await client.customRequest('timeline', tickWindow(now.position));
  const { checkpoints }: { checkpoints: CheckpointEntry[] } = await client.customRequest('checkpoints', {});
  const births = await loadBirths(client, window.end);
  return { position: window.position, items: timelineTree(window, checkpoints, births, divergence) };
}

/** The births of NaN/Inf of a run recorded to its end; undefined before it is (`timelineEvents` would first run the
 * rest of the program, which refreshing a view must not do). */
async function loadBirths(client: DebugClient, end: number): Promise<Birth[] | undefined> {
  const last: TimelineBody = await client.customRequest('timeline', { start: end - 1, count: 1 });
  if (!last.ticks[0]?.executed) {
    return undefined;
  }
  const { events }: { events: ({ event: string } & Birth)[] } = await client.customRequest('timelineEvents', {});
  return events.filter((e) => e.event === 'birth');
}

export async function runAction(client: DebugClient, action: Action): Promise<void> {
  await client.customRequest(action.request, action.args);
}

export interface ValueRef {
  name: string; // a source variable (`scores`) or a Program value (`div`)
  frameId?: number;
}

/** The 2-D slice at `index` (leading indices; default all 0) of a tensor, read with readMemory;
 * with `reference`, the same slice of the reference run's value too (readReference), for the diff. */
export async function loadTensor(client: DebugClient, ref: ValueRef, index?: number[], reference = false): Promise<TensorPayload> {
  const evaluated = await client.customRequest('evaluate', { expression: ref.name, frameId: ref.frameId, context: 'watch' });
  if (!evaluated.memoryReference) {
    throw new Error(`'${ref.name}' is not a tensor value of the program (it evaluates to ${evaluated.result})`);
  }
  const placement: { value: string; shards: Location[] } = await client.customRequest('locate', ref);
  const loc = placement.shards[0];
  const slice = sliceOf(loc, index ?? loc.shape.slice(0, -2).map(() => 0));
  const values = gather(await readBytes(byteSpan(loc, slice), async (offset, count) =>
    (await client.customRequest('readMemory', { memoryReference: evaluated.memoryReference, offset, count })).data), loc, slice);
  const title = placement.value === ref.name ? ref.name : `${ref.name} (${placement.value})`;
  return {
    title, dtype: loc.dtype, shape: loc.shape, index: slice.index, rows: slice.rows, cols: slice.cols, values,
    stats: stats(values), clipped: slice.clipped, ...(reference ? { reference: await loadReference(client, ref, slice.index) } : {}),
  };
}

async function loadReference(client: DebugClient, ref: ValueRef, index: number[]): Promise<number[]> {
  const read = async (offset: number, count: number) => (await client.customRequest('readReference', { ...ref, offset, count })).data;
  const layout = await client.customRequest('readReference', { ...ref, count: 0 });
  const loc: Location = { chip: 'reference', unit: '', space: '', address: 0, nbytes: 0, ...layout };
  const slice = sliceOf(loc, index);
  return gather(await readBytes(byteSpan(loc, slice), read), loc, slice);
}

/** The bytes of `span`, read in pieces the adapter accepts; `read` answers base64. */
async function readBytes(span: { offset: number; count: number }, read: (offset: number, count: number) => Promise<string>) {
  const out = new Uint8Array(span.count);
  for (let done = 0; done < span.count; ) {
    const chunk = Buffer.from((await read(span.offset + done, Math.min(MAX_READ_BYTES, span.count - done))) ?? '', 'base64');
    if (chunk.length === 0) {
      throw new Error(`the adapter returned no bytes at offset ${span.offset + done}`);
    }
    out.set(chunk, done);
    done += chunk.length;
  }
  return out;
}
