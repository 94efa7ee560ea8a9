// The Tensor view's histogram as a chart: bars of the finite values' bins over an x axis of bin edges, a y axis of
// counts, NaN and ±Inf as bars of their own right of the bins, and what hovering each bar says. Laid out here in
// pixels and colours, so the page only draws it and a test checks the geometry the user sees.

import { NAN_COLOUR, NEG_INF_COLOUR, POS_INF_COLOUR, RGB } from './colour';
import { Histogram } from './tensorData';

export const CHART = { width: 560, height: 190, left: 52, right: 10, top: 10, bottom: 40 };
export const BIN_COLOUR = '#4f9fe6';
const NONFINITE_SLOT = 40; // pixels per NaN/Inf bar
const NONFINITE_GAP = 16; // between the bins and the NaN/Inf bars, so the last edge's label stays clear of theirs
const MAX_EDGE_LABELS = 6;
const Y_TICKS = 4; // about this many count labels

export type BarKind = 'bin' | 'nan' | 'neginf' | 'posinf';

export interface Bar {
  kind: BarKind;
  x: number;
  y: number;
  width: number;
  height: number;
  fill: string;
  count: number;
  label: string; // what hovering it says
}

export interface Tick {
  at: number; // pixels along the axis
  label: string;
}

export interface HistogramChart {
  width: number;
  height: number;
  plot: { x: number; y: number; width: number; height: number }; // the bins' area
  bars: Bar[];
  edges: number[]; // pixel x of every bin edge
  xTicks: Tick[]; // labelled bin edges, and the names of the NaN/Inf bars
  yTicks: Tick[]; // counts, at pixel y
  xLabel: string;
  caption: string;
}

const NONFINITE: { kind: Exclude<BarKind, 'bin'>; name: string; colour: RGB }[] = [
  { kind: 'nan', name: 'NaN', colour: NAN_COLOUR },
  { kind: 'neginf', name: '−Inf', colour: NEG_INF_COLOUR },
  { kind: 'posinf', name: '+Inf', colour: POS_INF_COLOUR },
];

/** The chart of `h`, whose x axis is `xLabel` (the values, or run − reference). */
export function histogramChart(h: Histogram, xLabel: string): HistogramChart {
  const nonfinite = NONFINITE.filter((k) => h[k.kind] > 0);
  const x = CHART.left, y = CHART.top, height = CHART.height - CHART.top - CHART.bottom;
  const width = CHART.width - CHART.left - CHART.right - (nonfinite.length ? NONFINITE_GAP + nonfinite.length * NONFINITE_SLOT : 0);
  const tallest = Math.max(1, ...h.counts, ...nonfinite.map((k) => h[k.kind]));
  const yStep = niceStep(tallest / Y_TICKS);
  const top = yStep * Math.ceil(tallest / yStep);
  const barTop = (count: number) => y + height - (count / top) * height;
  const n = h.counts.length, bw = n ? width / n : 0;
  const bins: Bar[] = h.counts.map((count, i) => ({
    kind: 'bin', x: x + i * bw, y: barTop(count), width: bw, height: (count / top) * height, fill: BIN_COLOUR, count,
    label: `${binRange(h.edges, i)} · ${countOf(count)}`,
  }));
  const others: Bar[] = nonfinite.map((k, i) => ({
    kind: k.kind, x: x + width + NONFINITE_GAP + i * NONFINITE_SLOT + NONFINITE_SLOT / 4, y: barTop(h[k.kind]), width: NONFINITE_SLOT / 2,
    height: (h[k.kind] / top) * height, fill: `rgb(${k.colour.join(',')})`, count: h[k.kind],
    label: `${k.name} · ${countOf(h[k.kind])}`,
  }));
  return {
    width: CHART.width, height: CHART.height, plot: { x, y, width, height }, bars: [...bins, ...others],
    edges: h.edges.map((_, i) => x + i * bw),
    xTicks: [...edgeTicks(h.edges, x, bw), ...others.map((b, i) => ({ at: b.x + b.width / 2, label: nonfinite[i].name }))],
    yTicks: Array.from({ length: top / yStep + 1 }, (_, i) => ({ at: barTop(i * yStep), label: String(i * yStep) })),
    xLabel,
    caption: n ? `${n} bin${n > 1 ? 's' : ''} of width ${precise(h.edges[1] - h.edges[0])}` : 'no finite value to put in bins',
  };
}

/** The smallest of 1, 2, 5 × 10^k (an integer: counts are) at or above `rough`. */
export function niceStep(rough: number): number {
  const power = 10 ** Math.max(0, Math.floor(Math.log10(Math.max(1, rough))));
  return [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough) as number;
}

/** Every k-th edge labelled (about MAX_EDGE_LABELS), the first and the last always; none crowding the last. */
function edgeTicks(edges: number[], x: number, bw: number): Tick[] {
  const n = edges.length - 1;
  if (n < 1) {
    return [];
  }
  const k = Math.ceil(n / (MAX_EDGE_LABELS - 1));
  const shown = edges.map((_, i) => i).filter((i) => i === n || (i % k === 0 && n - i >= k / 2));
  const step = n > 1 ? (edges[n] - edges[0]) * (k / n) : Math.abs(edges[0]);
  return shown.map((i) => ({ at: x + i * bw, label: axisNumber(edges[i], step) }));
}

/** `v` on an axis whose labels are `step` apart: enough decimals to tell neighbours apart, and no more. */
export function axisNumber(v: number, step: number): string {
  const decimals = 2 - Math.floor(Math.log10(step || 1));
  if (Math.abs(v) >= 1e5 || decimals > 6) {
    return v.toExponential(2);
  }
  return v.toFixed(Math.max(0, decimals));
}

/** A bin as an interval: [lo, hi), the last one closed. */
export function binRange(edges: number[], i: number): string {
  return `[${precise(edges[i])}, ${precise(edges[i + 1])}${i === edges.length - 2 ? ']' : ')'}`;
}

function precise(v: number): string {
  return String(Number(v.toPrecision(6)));
}

function countOf(n: number): string {
  return `${n} value${n === 1 ? '' : 's'}`;
}
