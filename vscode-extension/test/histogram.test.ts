// The Tensor view's histogram: its bins, and the chart's axes, bars and hover texts.

import * as assert from 'node:assert/strict';
import { test } from 'node:test';
import { NAN_COLOUR } from '../src/colour';
import { axisNumber, BIN_COLOUR, binRange, CHART, histogramChart, niceStep } from '../src/histogramChart';
import { histogram } from '../src/tensorData';

test('each finite value lands in the bin whose edges hold it, the last bin closed; NaN and each infinity apart', () => {
  const h = histogram([0, 1, 2, 3, NaN, Infinity, 4, -Infinity, Infinity, 0.999], 4);
  assert.deepEqual(h, { edges: [0, 1, 2, 3, 4], counts: [2, 1, 1, 2], nan: 1, posinf: 2, neginf: 1 });
  // what a bar's hover says is what it counts: [edge, next edge), even where dividing by the width rounds
  const values = Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 0.3 + (i % 7) * 0.1);
  const h7 = histogram(values, 7);
  const within = (i: number) => values.filter((v) => h7.edges[i] <= v && (i === 6 ? v <= h7.edges[7] : v < h7.edges[i + 1])).length;
  assert.deepEqual(h7.counts, h7.counts.map((_, i) => within(i)));
});

test('equal values make one closed bin, and no finite value makes none', () => {
  assert.deepEqual(histogram([2.5, 2.5, NaN], 32), { edges: [2.5, 2.5], counts: [2], nan: 1, posinf: 0, neginf: 0 });
  assert.deepEqual(histogram([NaN, -Infinity], 32), { edges: [], counts: [], nan: 1, posinf: 0, neginf: 1 });
  assert.equal(binRange([2.5, 2.5], 0), '[2.5, 2.5]');
});

test('bars stand on the x axis, as tall as their counts on a y axis ticked at 1, 2 or 5 × 10^k', () => {
  const chart = histogramChart(histogram([0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3], 3), 'value');
  const { plot } = chart;
  assert.deepEqual(chart.yTicks.map((t) => t.label), ['0', '5', '10']);
  assert.equal(chart.yTicks[0].at, plot.y + plot.height, 'count 0 is on the x axis');
  assert.equal(chart.yTicks.at(-1)?.at, plot.y, 'the top tick is the top of the plot');
  const bars = chart.bars;
  assert.deepEqual(bars.map((b) => b.count), [1, 2, 10]);
  for (const b of bars) {
    assert.ok(Math.abs(b.y + b.height - (plot.y + plot.height)) < 1e-9, 'a bar stands on the x axis');
    assert.ok(Math.abs(b.height - (b.count / 10) * plot.height) < 1e-9, `a bar of ${b.count} is ${b.height}px tall`);
    assert.equal(b.fill, BIN_COLOUR);
  }
  assert.deepEqual(bars.map((b) => b.x), chart.edges.slice(0, 3), 'each bar starts at its lower edge');
  assert.equal(chart.edges.at(-1), plot.x + plot.width);
  assert.deepEqual([niceStep(0.25), niceStep(3), niceStep(12.5), niceStep(4096)], [1, 5, 20, 5000]);
});

test('hovering a bar says its interval and count', () => {
  const chart = histogramChart(histogram([0, 1, 2, 3, 4], 4), 'value');
  assert.deepEqual(chart.bars.map((b) => b.label),
    ['[0, 1) · 1 value', '[1, 2) · 1 value', '[2, 3) · 1 value', '[3, 4] · 2 values']);
  assert.equal(chart.caption, '4 bins of width 1');
});

test('the x axis labels bin edges, the first and the last among them, as precisely as their spacing needs', () => {
  const edges = Array.from({ length: 33 }, (_, i) => -3 + (7.05 * i) / 32);
  const chart = histogramChart({ edges, counts: new Array(32).fill(1), nan: 0, posinf: 0, neginf: 0 }, 'value');
  const labels = chart.xTicks.map((t) => t.label);
  assert.deepEqual(labels, ['-3.00', '-1.46', '0.08', '1.63', '3.17', '4.05']);
  assert.deepEqual(chart.xTicks.map((t) => t.at), [0, 7, 14, 21, 28, 32].map((i) => chart.edges[i]));
  assert.equal(chart.edges.length, 33, 'every edge has a tick mark');
  assert.deepEqual([axisNumber(1234.5678, 100), axisNumber(0.000123, 0.00001), axisNumber(3e7, 1e6), axisNumber(1e-9, 1e-10)],
    ['1235', '1.23e-4', '3.00e+7', '1.00e-9']);
});

test('NaN and infinities get bars of their own right of the bins, only when there are some', () => {
  const chart = histogramChart(histogram([1, 2, 3, NaN, NaN, Infinity], 2), 'run − reference');
  const nonfinite = chart.bars.filter((b) => b.kind !== 'bin');
  assert.deepEqual(nonfinite.map((b) => [b.kind, b.count, b.label]), [['nan', 2, 'NaN · 2 values'], ['posinf', 1, '+Inf · 1 value']]);
  assert.equal(nonfinite[0].fill, `rgb(${NAN_COLOUR.join(',')})`, 'NaN is the colour of NaN cells in the heatmap');
  assert.ok(nonfinite.every((b) => b.x > chart.plot.x + chart.plot.width && b.x + b.width <= CHART.width), 'right of the bins');
  assert.deepEqual(chart.xTicks.slice(-2).map((t) => t.label), ['NaN', '+Inf']);
  assert.equal(chart.xLabel, 'run − reference');
  const none = histogramChart(histogram([NaN], 4), 'value');
  assert.deepEqual([none.bars.map((b) => b.kind), none.caption], [['nan'], 'no finite value to put in bins']);
  assert.equal(histogramChart(histogram([1, 2], 4), 'value').plot.width, CHART.width - CHART.left - CHART.right,
    'without NaN/Inf the bins take the whole width');
});
