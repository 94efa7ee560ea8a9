import * as assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadTensor } from '../src/dap';
import { byteSpan, decode, gather, Location, MAX_SIDE, sliceOf } from '../src/tensorData';
import { Adapter, REPO } from './dapClient';

const loc = (shape: number[], strides: number[], dtype = 'float32'): Location =>
  ({ chip: 'cpu', unit: 'host', space: 'host', address: 0, nbytes: 0, dtype, shape, strides });

test('half, bfloat16 and float32 bytes decode to their numbers, infinities and NaN included', () => {
  const f16 = new Uint8Array(new Uint16Array([0x3c00, 0xc000, 0x7c00, 0x7e00, 0x0001]).buffer);
  assert.deepEqual(Array.from(decode(f16, 'float16')), [1, -2, Infinity, NaN, 2 ** -24]);
  const bf16 = new Uint8Array(new Uint16Array([0x3f80, 0xc040, 0xff80]).buffer);
  assert.deepEqual(Array.from(decode(bf16, 'bfloat16')), [1, -3, -Infinity]);
  assert.deepEqual(Array.from(decode(new Uint8Array(new Float32Array([0.5, -7]).buffer), 'float32')), [0.5, -7]);
  assert.throws(() => decode(new Uint8Array(4), 'complex64'), /cannot decode dtype 'complex64'/);
});

test('a slice of a transposed layout gathers the logical rows, reading only the bytes it spans', () => {
  // a 2×3×2 tensor whose last two dimensions are stored transposed: element [b, r, c] at b*6 + c*3 + r
  const layout = loc([2, 3, 2], [6, 1, 3]);
  const slice = sliceOf(layout, [1]);
  assert.deepEqual(byteSpan(layout, slice), { offset: 24, count: 24 });
  const storage = new Float32Array(Array.from({ length: 6 }, (_, i) => 100 + i)); // the span of b = 1
  assert.deepEqual(gather(new Uint8Array(storage.buffer), layout, slice), [100, 103, 101, 104, 102, 105]);
});

test('leading indices are checked against the shape', () => {
  assert.throws(() => sliceOf(loc([2, 3, 4], [12, 4, 1]), []), /a 3-D tensor \[2,3,4\] needs 1 leading indices, got \[\]/);
  assert.throws(() => sliceOf(loc([2, 3, 4], [12, 4, 1]), [2]), /index 2 is out of range for dimension 0 \(size 2\)/);
});

test('a 1-D tensor is one row, and a long side is clipped to the view', () => {
  const slice = sliceOf(loc([MAX_SIDE + 10], [1]), []);
  assert.deepEqual([slice.rows, slice.cols, slice.clipped], [1, MAX_SIDE, true]);
});

let adapter: Adapter;
before(async () => {
  adapter = Adapter.spawn();
  const gpt = `${REPO}/examples/gpt.py`;
  await adapter.start('launch', { program: gpt, driver: 'torch:cpu', stopOnEntry: true });
  await adapter.customRequest('setBreakpoints', { source: { path: gpt }, breakpoints: [{ line: 26 }] });
  await adapter.moved('continue', { threadId: 1 });
});
after(() => adapter.close());

// A scalar evaluates to e.g. "float32[] cpu = -0.328904".
const number = async (expression: string) =>
  Number((await adapter.customRequest('evaluate', { expression, context: 'watch' })).result.split('=').pop());

test('the Tensor view reads a strided slice of a source variable through the adapter', async () => {
  const payload = await loadTensor(adapter, { name: 'k' }, [0, 1]);
  assert.equal(payload.title, 'k (transpose_1)');
  assert.deepEqual([payload.dtype, payload.shape, payload.rows, payload.cols], ['float32', [1, 4, 16, 8], 16, 8]);
  for (const [r, c] of [[0, 0], [2, 3], [15, 7]]) {
    assert.ok(Math.abs(payload.values[r * 8 + c] - await number(`k[0, 1, ${r}, ${c}]`)) < 1e-4, `k[0, 1, ${r}, ${c}]`);
  }
  assert.ok(Math.abs(payload.stats.max - await number('k[0, 1].max()')) < 1e-4);
  assert.ok(Math.abs(payload.stats.mean - await number('k[0, 1].mean()')) < 1e-4);
});

test('the Tensor view refuses a name that is not a tensor of the program', async () => {
  await assert.rejects(loadTensor(adapter, { name: 'k.shape[0]' }), /'k.shape\[0\]' is not a tensor value of the program/);
});

test('with the reference, the same slice of the reference run comes along for the diff', async () => {
  const payload = await loadTensor(adapter, { name: 'k' }, [0, 1], true);
  const reference = payload.reference!;
  assert.equal(reference.length, 16 * 8);
  const worst = Math.max(...payload.values.map((v, i) => Math.abs(v - reference[i])));
  assert.ok(worst > 0 && worst < 1e-5, `float32 against float64: worst difference ${worst}`);
});
