// A 2-D slice of a tensor from its bytes: which bytes to read (readMemory), how to decode them
// for its dtype, the slice's values, their stats and histogram. The payload the Tensor view draws.

export interface Location {
  chip: string;
  unit: string;
  space: string;
  address: number;
  nbytes: number;
  dtype: string;
  shape: number[];
  strides: number[];
}

export interface SliceSpec {
  index: number[]; // the leading indices (all but the last two dimensions)
  rows: number;
  cols: number;
  rowStride: number; // in elements
  colStride: number;
  first: number; // element offset of [index, 0, 0]
  clipped: boolean; // the slice was cut to the view's limits
}

export interface Stats {
  min: number;
  max: number;
  mean: number;
  nan: number;
  inf: number;
}

export interface TensorPayload {
  title: string;
  dtype: string;
  shape: number[];
  index: number[];
  rows: number;
  cols: number;
  values: number[]; // row-major; NaN and ±Infinity as they are
  reference?: number[]; // the same slice in the reference run, for the diff mode
  stats: Stats;
  clipped: boolean;
}

export const MAX_SIDE = 256;
const ITEM_SIZE: Record<string, number> = {
  float64: 8, float32: 4, float16: 2, bfloat16: 2, int64: 8, int32: 4, int16: 2, int8: 1, uint8: 1, bool: 1,
};

export function itemSize(dtype: string): number {
  const size = ITEM_SIZE[dtype];
  if (size === undefined) {
    throw new Error(`the Tensor view cannot decode dtype '${dtype}' (it knows ${Object.keys(ITEM_SIZE).join(', ')})`);
  }
  return size;
}

/** The 2-D slice at `index` (leading indices) of a tensor, cut to MAX_SIDE × MAX_SIDE. */
export function sliceOf(loc: Location, index: number[]): SliceSpec {
  const lead = Math.max(0, loc.shape.length - 2);
  if (index.length !== lead) {
    throw new Error(`a ${loc.shape.length}-D tensor [${loc.shape}] needs ${lead} leading indices, got [${index}]`);
  }
  index.forEach((i, d) => {
    if (!Number.isInteger(i) || i < 0 || i >= loc.shape[d]) {
      throw new Error(`index ${i} is out of range for dimension ${d} (size ${loc.shape[d]})`);
    }
  });
  const strides = loc.strides.length === loc.shape.length ? loc.strides : contiguousStrides(loc.shape);
  const [rows, cols] = loc.shape.length >= 2 ? loc.shape.slice(-2) : [1, loc.shape[0] ?? 1];
  const [rowStride, colStride] = loc.shape.length >= 2 ? strides.slice(-2) : [0, strides[0] ?? 1];
  const first = index.reduce((sum, i, d) => sum + i * strides[d], 0);
  return {
    index, rows: Math.min(rows, MAX_SIDE), cols: Math.min(cols, MAX_SIDE), rowStride, colStride, first,
    clipped: rows > MAX_SIDE || cols > MAX_SIDE,
  };
}

function contiguousStrides(shape: number[]): number[] {
  return shape.map((_, d) => shape.slice(d + 1).reduce((a, b) => a * b, 1));
}

/** The bytes (offset from the value's first element, count) that hold every element of the slice. */
export function byteSpan(loc: Location, slice: SliceSpec): { offset: number; count: number } {
  const size = itemSize(loc.dtype);
  const last = slice.first + (slice.rows - 1) * slice.rowStride + (slice.cols - 1) * slice.colStride;
  return { offset: slice.first * size, count: (last - slice.first + 1) * size };
}

/** The slice's values, row-major, from the bytes of `byteSpan`. */
export function gather(bytes: Uint8Array, loc: Location, slice: SliceSpec): number[] {
  const decoded = decode(bytes, loc.dtype);
  const out: number[] = [];
  for (let r = 0; r < slice.rows; r++) {
    for (let c = 0; c < slice.cols; c++) {
      out.push(decoded[r * slice.rowStride + c * slice.colStride]);
    }
  }
  return out;
}

export function decode(bytes: Uint8Array, dtype: string): ArrayLike<number> {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = Math.floor(bytes.byteLength / itemSize(dtype));
  const read = READERS[dtype];
  return Float64Array.from({ length: n }, (_, i) => read(view, i));
}

const READERS: Record<string, (v: DataView, i: number) => number> = {
  float64: (v, i) => v.getFloat64(i * 8, true),
  float32: (v, i) => v.getFloat32(i * 4, true),
  float16: (v, i) => half(v.getUint16(i * 2, true)),
  bfloat16: (v, i) => bfloat(v.getUint16(i * 2, true)),
  int64: (v, i) => Number(v.getBigInt64(i * 8, true)),
  int32: (v, i) => v.getInt32(i * 4, true),
  int16: (v, i) => v.getInt16(i * 2, true),
  int8: (v, i) => v.getInt8(i),
  uint8: (v, i) => v.getUint8(i),
  bool: (v, i) => v.getUint8(i),
};

function half(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0x1f) {
    return fraction ? NaN : sign * Infinity;
  }
  return exponent ? sign * 2 ** (exponent - 15) * (1 + fraction / 1024) : sign * 2 ** -14 * (fraction / 1024);
}

function bfloat(bits: number): number {
  const view = new DataView(new ArrayBuffer(4));
  view.setUint32(0, bits << 16);
  return view.getFloat32(0);
}

export function stats(values: number[]): Stats {
  let min = Infinity, max = -Infinity, sum = 0, finite = 0, nan = 0, inf = 0;
  for (const v of values) {
    if (Number.isNaN(v)) {
      nan++;
    } else if (!Number.isFinite(v)) {
      inf++;
    } else {
      min = Math.min(min, v);
      max = Math.max(max, v);
      sum += v;
      finite++;
    }
  }
  return finite ? { min, max, mean: sum / finite, nan, inf } : { min: NaN, max: NaN, mean: NaN, nan, inf };
}

/** A histogram as the adapter's `histogram` request answers it: the finite values in equal bins from their min to
 * their max (`edges` one longer than `counts`; one bin when they are all equal, none when no value is finite), each
 * bin [edge, next edge) but the last, which holds its upper edge; NaN and each infinity counted apart. */
export interface Histogram {
  edges: number[];
  counts: number[];
  nan: number;
  posinf: number;
  neginf: number;
}

export function histogram(values: number[], bins: number): Histogram {
  const { min, max } = stats(values);
  const n = Number.isNaN(min) ? 0 : max > min ? bins : 1;
  const edges = n ? Array.from({ length: n + 1 }, (_, i) => (i === n ? max : min + ((max - min) * i) / n)) : [];
  const out: Histogram = { edges, counts: new Array(n).fill(0), nan: 0, posinf: 0, neginf: 0 };
  for (const v of values) {
    if (Number.isNaN(v)) {
      out.nan++;
    } else if (v === Infinity) {
      out.posinf++;
    } else if (v === -Infinity) {
      out.neginf++;
    } else {
      out.counts[binOf(v, edges)]++;
    }
  }
  return out;
}

/** The last bin whose lower edge is at or below `v`: exact at the edges, where dividing by the width may round. */
function binOf(v: number, edges: number[]): number {
  let lo = 0;
  for (let hi = edges.length - 2; lo < hi; ) {
    const mid = Math.ceil((lo + hi) / 2);
    [lo, hi] = edges[mid] <= v ? [mid, hi] : [lo, mid - 1];
  }
  return lo;
}
