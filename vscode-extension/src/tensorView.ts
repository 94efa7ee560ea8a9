// The Tensor webview: a heatmap of a 2-D slice (or of its difference from the reference run),
// a colour legend and a histogram. `tensorHtml` is the whole page: the cells' colours are computed
// here and the page's small script only paints them.

import { colourAt, colourOf, RGB, Scale, scaleFor } from './colour';
import { histogram, stats, Stats, TensorPayload } from './tensorData';

export const HISTOGRAM_BINS = 32;
const HEATMAP_PX = 512; // the longer side of the heatmap
const LEGEND_STEPS = 64;

export interface Panel {
  rgb: string; // base64 of rows × cols × 3 bytes
  scale: Scale;
  stats: Stats;
  histogram: { lo: number; hi: number; counts: number[] };
}

export interface ViewModel {
  title: string;
  subtitle: string;
  index: number[];
  rows: number;
  cols: number;
  cell: number; // pixels per cell
  panels: { values: Panel; diff?: Panel };
  legend: { values: RGB[]; diff?: RGB[] };
}

export function viewModel(p: TensorPayload): ViewModel {
  const diff = p.reference && p.values.map((v, i) => v - (p.reference as number[])[i]);
  const where = p.index.length ? `[${p.index.join(', ')}, :, :]` : '';
  return {
    title: p.title,
    subtitle: `${p.dtype}[${p.shape.join(', ')}]${where} · ${p.rows} × ${p.cols}${p.clipped ? ' (clipped)' : ''}`,
    index: p.index,
    rows: p.rows,
    cols: p.cols,
    cell: Math.max(1, Math.floor(HEATMAP_PX / Math.max(p.rows, p.cols))),
    panels: { values: panel(p.values, false), ...(diff ? { diff: panel(diff, true) } : {}) },
    legend: { values: legend(false), ...(diff ? { diff: legend(true) } : {}) },
  };
}

function panel(values: number[], diverging: boolean): Panel {
  const scale = scaleFor(values, diverging);
  const bytes = Buffer.alloc(values.length * 3);
  values.forEach((v, i) => bytes.set(colourOf(v, scale), i * 3));
  return { rgb: bytes.toString('base64'), scale, stats: stats(values), histogram: histogram(values, HISTOGRAM_BINS) };
}

function legend(diverging: boolean): RGB[] {
  const stops = scaleFor([], diverging).stops;
  return Array.from({ length: LEGEND_STEPS }, (_, i) => colourAt(stops, i / (LEGEND_STEPS - 1)));
}

export function tensorHtml(model: ViewModel, nonce: string, cspSource: string): string {
  const data = JSON.stringify(model).replace(/</g, '\\u003c');
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src ${cspSource} 'unsafe-inline'; script-src 'nonce-${nonce}';">
<style>
 body { font-family: var(--vscode-font-family, sans-serif); color: var(--vscode-foreground, #ccc); background: var(--vscode-editor-background, #1e1e1e); margin: 12px; }
 h1 { font-size: 14px; margin: 0; } .sub, .stats { font-size: 12px; opacity: .8; margin: 4px 0 8px; }
 canvas { image-rendering: pixelated; display: block; margin: 6px 0; }
 button { margin-right: 4px; } button[aria-pressed=true] { font-weight: bold; }
</style></head><body>
<h1 id="title"></h1><div class="sub" id="subtitle"></div>
<div id="modes"></div>
<form id="slice" hidden>leading indices <input id="index" size="12"> <button>Show</button></form>
<canvas id="heatmap"></canvas>
<canvas id="legend" height="12"></canvas><div class="stats" id="range"></div>
<div class="stats" id="stats"></div>
<canvas id="histogram" width="512" height="120"></canvas><div class="stats" id="bins"></div>
<script nonce="${nonce}">
const model = ${data};
${PAGE_SCRIPT}
</script></body></html>`;
}

// Paints the panel of the chosen mode; no colour is decided here.
const PAGE_SCRIPT = `
const $ = (id) => document.getElementById(id);
const fmt = (x) => Number.isFinite(x) ? x.toPrecision(4) : String(x);
function paint(mode) {
  const p = model.panels[mode], bytes = atob(p.rgb), c = model.cell;
  const heat = $('heatmap'); heat.width = model.cols * c; heat.height = model.rows * c;
  const g = heat.getContext('2d');
  for (let i = 0; i < model.rows * model.cols; i++) {
    g.fillStyle = 'rgb(' + bytes.charCodeAt(3 * i) + ',' + bytes.charCodeAt(3 * i + 1) + ',' + bytes.charCodeAt(3 * i + 2) + ')';
    g.fillRect((i % model.cols) * c, Math.floor(i / model.cols) * c, c, c);
  }
  const stops = model.legend[mode], leg = $('legend'); leg.width = heat.width;
  const lg = leg.getContext('2d'), w = leg.width / stops.length;
  stops.forEach((s, i) => { lg.fillStyle = 'rgb(' + s.join(',') + ')'; lg.fillRect(i * w, 0, Math.ceil(w), leg.height); });
  $('range').textContent = (mode === 'diff' ? 'run − reference: ' : '') + fmt(p.scale.lo) + ' … ' + fmt(p.scale.hi);
  $('stats').textContent = 'min ' + fmt(p.stats.min) + ' · max ' + fmt(p.stats.max) + ' · mean ' + fmt(p.stats.mean) + ' · NaN ' + p.stats.nan + ' · Inf ' + p.stats.inf;
  const h = $('histogram'), hg = h.getContext('2d'), counts = p.histogram.counts, top = Math.max(1, ...counts);
  hg.clearRect(0, 0, h.width, h.height); hg.fillStyle = '#4f9fe6';
  const bw = h.width / counts.length;
  counts.forEach((n, i) => { const bh = (n / top) * (h.height - 2); hg.fillRect(i * bw + 1, h.height - bh, bw - 2, bh); });
  $('bins').textContent = counts.length + ' bins from ' + fmt(p.histogram.lo) + ' to ' + fmt(p.histogram.hi) + ', tallest ' + top;
  document.querySelectorAll('#modes button').forEach((b) => b.setAttribute('aria-pressed', String(b.dataset.mode === mode)));
}
$('title').textContent = model.title; $('subtitle').textContent = model.subtitle;
if (model.panels.diff) {
  for (const [mode, label] of [['values', 'Values'], ['diff', 'Diff vs reference']]) {
    const b = document.createElement('button'); b.textContent = label; b.dataset.mode = mode;
    b.onclick = () => paint(mode); $('modes').appendChild(b);
  }
}
// Another slice, or the reference's values: the extension reads them and sends a new page.
const host = typeof acquireVsCodeApi === 'function' ? acquireVsCodeApi() : undefined;
if (model.index.length && host) {
  $('slice').hidden = false; $('index').value = model.index.join(', ');
  $('slice').onsubmit = (e) => { e.preventDefault(); host.postMessage({ type: 'slice', index: $('index').value.split(',').map(Number) }); };
}
if (!model.panels.diff && host) {
  const b = document.createElement('button'); b.textContent = 'Compare with reference';
  b.onclick = () => host.postMessage({ type: 'reference', index: model.index }); $('modes').appendChild(b);
}
paint('values');
`;
