// The Tensor webview: a heatmap of a 2-D slice (or of its difference from the reference run),
// a colour legend and a histogram with axes. `tensorHtml` is the whole page: the cells' colours and the
// chart's layout are computed here and the page's small script only paints them.

import { colourAt, colourOf, RGB, Scale, scaleFor } from './colour';
import { HistogramChart, histogramChart } from './histogramChart';
import { histogram, stats, Stats, TensorPayload } from './tensorData';

export const HISTOGRAM_BINS = 32;
const HEATMAP_PX = 512; // the longer side of the heatmap
const LEGEND_STEPS = 64;

export interface Panel {
  rgb: string; // base64 of rows × cols × 3 bytes
  scale: Scale;
  stats: Stats;
  histogram: HistogramChart;
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
  const chart = histogramChart(histogram(values, HISTOGRAM_BINS), diverging ? 'run − reference' : 'value');
  return { rgb: bytes.toString('base64'), scale, stats: stats(values), histogram: chart };
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
 #chart { position: relative; display: inline-block; margin-top: 6px; }
 #histogram text { fill: currentColor; font-size: 10px; } .axis { stroke: currentColor; stroke-opacity: .6; }
 .bin:hover .bar, .bin:focus .bar { fill-opacity: .7; } .bin:focus { outline: none; }
 .bar.nan, .bar.neginf, .bar.posinf { stroke: #888; }
 #tip { position: absolute; pointer-events: none; white-space: nowrap; font-size: 12px;
   padding: 2px 6px; background: var(--vscode-editorHoverWidget-background, #252526);
   color: var(--vscode-editorHoverWidget-foreground, #ccc); border: 1px solid var(--vscode-editorHoverWidget-border, #454545); }
</style></head><body>
<h1 id="title"></h1><div class="sub" id="subtitle"></div>
<div id="modes"></div>
<form id="slice" hidden>leading indices <input id="index" size="12"> <button>Show</button></form>
<canvas id="heatmap"></canvas>
<canvas id="legend" height="12"></canvas><div class="stats" id="range"></div>
<div class="stats" id="stats"></div>
<div id="chart"><svg id="histogram" role="img" aria-label="histogram"></svg><div id="tip" role="tooltip" hidden></div></div>
<div class="stats" id="bins"></div>
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
  chart(p.histogram);
  document.querySelectorAll('#modes button').forEach((b) => b.setAttribute('aria-pressed', String(b.dataset.mode === mode)));
}
const SVG = 'http://www.w3.org/2000/svg';
function add(parent, name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return parent.appendChild(e);
}
// The histogram: axes, their ticks and labels, then each bar with a hover area the height of the plot.
function chart(c) {
  const svg = $('histogram'), tip = $('tip'), p = c.plot, base = p.y + p.height;
  svg.replaceChildren(); svg.setAttribute('width', c.width); svg.setAttribute('height', c.height); tip.hidden = true;
  add(svg, 'line', { class: 'axis', x1: p.x, y1: base, x2: c.width, y2: base });
  add(svg, 'line', { class: 'axis', x1: p.x, y1: p.y, x2: p.x, y2: base });
  c.yTicks.forEach((t) => { add(svg, 'line', { class: 'axis', x1: p.x - 4, y1: t.at, x2: p.x, y2: t.at });
    add(svg, 'text', { x: p.x - 6, y: t.at + 3, 'text-anchor': 'end' }, t.label); });
  c.edges.forEach((x) => add(svg, 'line', { class: 'axis', x1: x, y1: base, x2: x, y2: base + 3 }));
  c.xTicks.forEach((t) => { add(svg, 'line', { class: 'axis', x1: t.at, y1: base, x2: t.at, y2: base + 6 });
    add(svg, 'text', { x: t.at, y: base + 16, 'text-anchor': 'middle' }, t.label); });
  add(svg, 'text', { x: p.x + p.width / 2, y: c.height - 4, 'text-anchor': 'middle' }, c.xLabel);
  add(svg, 'text', { x: 0, y: 0, 'text-anchor': 'middle', transform: 'translate(12 ' + (p.y + p.height / 2) + ') rotate(-90)' }, 'count');
  for (const b of c.bars) {
    const g = add(svg, 'g', { class: 'bin', tabindex: 0, 'aria-label': b.label });
    add(g, 'rect', { x: b.x, y: p.y, width: b.width, height: p.height, fill: 'transparent' });
    const inset = b.width > 2 ? 0.5 : 0;
    add(g, 'rect', { class: 'bar ' + b.kind, x: b.x + inset, y: b.y, width: b.width - 2 * inset, height: b.height, fill: b.fill });
    const show = () => { tip.textContent = b.label; tip.hidden = false; // over the bar, inside the chart
      tip.style.left = Math.min(c.width - tip.offsetWidth, Math.max(0, b.x + b.width / 2 - tip.offsetWidth / 2)) + 'px';
      tip.style.top = Math.max(0, b.y - tip.offsetHeight - 4) + 'px'; };
    g.addEventListener('mouseenter', show); g.addEventListener('focus', show);
    g.addEventListener('mouseleave', () => (tip.hidden = true)); g.addEventListener('blur', () => (tip.hidden = true));
  }
  $('bins').textContent = c.caption;
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
