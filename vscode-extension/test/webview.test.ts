// The Tensor webview's page rendered by a real headless Chromium: screenshots are checked
// pixel by pixel against the data and the colour scale.

import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, test } from 'node:test';
import { Browser, chromium, Page } from 'playwright-core';
import { PNG } from 'pngjs';
import { colourAt, colourOf, DIVERGING, NAN_COLOUR, RGB, SEQUENTIAL } from '../src/colour';
import { stats, TensorPayload } from '../src/tensorData';
import { tensorHtml, viewModel, ViewModel } from '../src/tensorView';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = path.join(__dirname, 'screenshots');
const ROWS = 6, COLS = 8;
// A ramp from -3 (top left) to 4.05 (bottom right), one NaN; the reference is the ramp shifted at one cell.
const values = Array.from({ length: ROWS * COLS }, (_, i) => -3 + i * 0.15);
values[2 * COLS + 3] = NaN;
const reference = values.map((v, i) => (i === 4 * COLS + 5 ? v - 2 : i === COLS + 1 ? v + 1 : v));
const payload: TensorPayload = {
  title: 'scores (div_1)', dtype: 'float32', shape: [2, ROWS, COLS], index: [1], rows: ROWS, cols: COLS,
  values, reference, stats: stats(values), clipped: false,
};
const model = viewModel(payload);

let browser: Browser;
let page: Page;

before(async () => {
  assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} is missing: run scripts/ensure-chromium.sh (make test does)`);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run', '--force-color-profile=srgb'],
  });
  page = await browser.newPage({ deviceScaleFactor: 1 });
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
  await page.setContent(tensorHtml(model, 'n0nce', 'vscode-resource:'));
  assert.deepEqual(errors, [], 'the page ran without errors (its script passed the CSP)');
  fs.mkdirSync(SHOTS, { recursive: true });
});
after(() => browser?.close());

async function shot(selector: string, name: string): Promise<PNG> {
  const png = await page.locator(selector).screenshot({ path: path.join(SHOTS, `${name}.png`) });
  return PNG.sync.read(png);
}

function pixel(png: PNG, x: number, y: number): RGB {
  const i = (png.width * y + x) * 4;
  return [png.data[i], png.data[i + 1], png.data[i + 2]];
}

/** The pixel at the centre of cell [r, c] of the heatmap. */
const cell = (png: PNG, r: number, c: number) => pixel(png, Math.floor((c + 0.5) * model.cell), Math.floor((r + 0.5) * model.cell));

function assertColour(actual: RGB, expected: RGB, what: string): void {
  assert.ok(actual.every((v, k) => Math.abs(v - expected[k]) <= 2), `${what}: got rgb(${actual}), expected rgb(${expected})`);
}

function distinctColours(png: PNG): number {
  const seen = new Set<number>();
  for (let i = 0; i < png.data.length; i += 4) {
    seen.add((png.data[i] << 16) | (png.data[i + 1] << 8) | png.data[i + 2]);
  }
  return seen.size;
}

test('the heatmap is drawn cell by cell, the lowest value dark purple and the highest yellow', async () => {
  const png = await shot('#heatmap', 'heatmap');
  assert.deepEqual([png.width, png.height], [COLS * model.cell, ROWS * model.cell]);
  assert.ok(distinctColours(png) >= ROWS * COLS - 1, `a blank or flat heatmap: ${distinctColours(png)} colours`);
  assertColour(cell(png, 0, 0), colourAt(SEQUENTIAL, 0), 'the minimum cell');
  assertColour(cell(png, ROWS - 1, COLS - 1), colourAt(SEQUENTIAL, 1), 'the maximum cell');
  assertColour(cell(png, 2, 3), NAN_COLOUR, 'the NaN cell');
  const scale = model.panels.values.scale;
  assert.deepEqual([scale.lo, scale.hi], [-3, values[ROWS * COLS - 1]]);
  assertColour(cell(png, 3, 4), colourOf(values[3 * COLS + 4], scale), 'a middle cell');
});

test('the legend runs along the same scale, low to high', async () => {
  const png = await shot('#legend', 'legend');
  const y = Math.floor(png.height / 2);
  assertColour(pixel(png, 1, y), colourAt(SEQUENTIAL, 0), 'the legend start');
  assertColour(pixel(png, png.width - 2, y), colourAt(SEQUENTIAL, 1), 'the legend end');
  assert.match(await page.locator('#range').textContent() ?? '', /^-3\.000 … 4\.050$/);
});

test('the histogram has axes of bin edges and counts, a bar for the NaN, and says a bar\'s interval and count on hover', async () => {
  const chart = model.panels.values.histogram;
  const texts = await page.locator('#histogram text').allTextContents();
  for (const label of ['-3.00', '4.05', 'NaN', '0', '2', 'value', 'count']) {
    assert.ok(texts.includes(label), `no '${label}' on the axes: ${texts.join(' | ')}`);
  }
  assert.equal(await page.locator('#bins').textContent(), '32 bins of width 0.220312');
  await page.locator('#histogram .bin').first().hover();
  assert.equal(await page.locator('#tip').textContent(), '[-3, -2.77969) · 2 values');
  const png = await shot('#chart', 'histogram'); // kept with the tooltip showing
  const baseline = chart.plot.y + chart.plot.height - 3; // a row just above the x axis and the bars' outlines
  const columns = (colour: RGB) => Array.from({ length: png.width }, (_, x) => pixel(png, x, baseline))
    .filter((p) => p.every((v, k) => Math.abs(v - colour[k]) <= 2)).length;
  assert.ok(columns([79, 159, 230]) > chart.plot.width / 2, `only ${columns([79, 159, 230])} columns of bars on the x axis`);
  assert.ok(columns(NAN_COLOUR) >= 10, 'the NaN bar stands right of the bins');
  const tip = (await page.locator('#tip').boundingBox())!, box = (await page.locator('#chart').boundingBox())!;
  assert.ok(tip.x >= box.x && tip.x + tip.width <= box.x + box.width, 'the tooltip stays inside the chart');
  await page.locator('#histogram .bin').last().hover();
  assert.equal(await page.locator('#tip').textContent(), 'NaN · 1 value');
  await page.mouse.move(0, 0);
  assert.equal(await page.locator('#tip').isHidden(), true, 'the tooltip goes when the pointer leaves the bars');
  assert.match(await page.locator('#stats').textContent() ?? '', /NaN 1 · Inf 0$/);
});

test('diff mode colours run minus reference: grey where equal, red above, blue below', async () => {
  await page.getByRole('button', { name: 'Diff vs reference' }).click();
  const png = await shot('#heatmap', 'diff');
  assertColour(cell(png, 0, 0), colourAt(DIVERGING, 0.5), 'an equal cell');
  assertColour(cell(png, 4, 5), colourAt(DIVERGING, 1), 'the cell 2 above its reference');
  assertColour(cell(png, 1, 1), colourOf(-1, model.panels.diff!.scale), 'the cell 1 below its reference');
  assert.match(await page.locator('#range').textContent() ?? '', /^run − reference: -2\.000 … 2\.000$/);
  assert.equal(await page.getByRole('button', { name: 'Diff vs reference' }).getAttribute('aria-pressed'), 'true');
  assert.ok((await page.locator('#histogram text').allTextContents()).includes('run − reference'), 'the histogram is of the difference');
});

/** The page as VS Code hosts it: acquireVsCodeApi() is there; here it records what the page posts. */
async function hostedPage(view: ViewModel): Promise<Page> {
  const hosted = await browser.newPage();
  await hosted.addInitScript(() => {
    const posted: unknown[] = ((window as any).posted = []);
    (window as any).acquireVsCodeApi = () => ({ postMessage: (m: unknown) => posted.push(m) });
  });
  const url = 'https://webview.test/'; // init scripts run on a navigation, which setContent is not
  await hosted.route(url, (r) => r.fulfill({ contentType: 'text/html', body: tensorHtml(view, 'n0nce', 'vscode-resource:') }));
  await hosted.goto(url);
  return hosted;
}

test('another slice is asked of the extension through the webview host', async () => {
  const hosted = await hostedPage(model);
  assert.equal(await hosted.locator('#index').inputValue(), '1');
  await hosted.locator('#index').fill('0');
  await hosted.getByRole('button', { name: 'Show' }).click();
  assert.deepEqual(await hosted.evaluate(() => (window as any).posted), [{ type: 'slice', index: [0] }]);
  await hosted.close();
});

test('a page without the reference offers to fetch it; one with it does not', async () => {
  const withoutReference = viewModel({ ...payload, reference: undefined });
  const hosted = await hostedPage(withoutReference);
  await hosted.getByRole('button', { name: 'Compare with reference' }).click();
  assert.deepEqual(await hosted.evaluate(() => (window as any).posted), [{ type: 'reference', index: [1] }]);
  await hosted.close();
  const withReference = await hostedPage(model);
  assert.equal(await withReference.getByRole('button', { name: 'Compare with reference' }).count(), 0);
  await withReference.close();
});
