// The real VS Code UI: code-server with the packaged .vsix installed, driven in headless chromium as a user would
// drive it: open examples/gpt.py, set a breakpoint, F5, the Variables view, Step Back and Reverse Continue on the
// debug toolbar, the Rewind Timeline and the Tensor panel. Screenshots of every step are kept in tests/ui/out/.
// Run by `make ui` (node 24 and code-server from this folder's package.json; /usr/bin/chromium).

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');
const VSIX = join(ROOT, 'vscode-extension', 'rewind-debugger.vsix');
const PYTHON = process.env.REWIND_PYTHON ?? join(ROOT, '.venv', 'bin', 'python');
const CODE_SERVER = join(HERE, 'node_modules', '.bin', 'code-server');
const OUT = join(HERE, 'out');
const BREAKPOINT_LINE = 29; // `weights = torch.softmax(scores, dim=-1)` in Attention.forward
const STOP_MS = 90_000;

const home = mkdtempSync(join(tmpdir(), 'rewind-ui-'));
const dirs = { user: join(home, 'user'), extensions: join(home, 'extensions'), workspace: join(home, 'workspace') };
let server, browser, page, shots = 0;

async function shot(name) {
  await page.screenshot({ path: join(OUT, `${String(++shots).padStart(2, '0')}-${name}.png`) });
}

/** code-server on a free port of loopback, in a process group of its own (ended with it). */
function startCodeServer() {
  server = spawn(CODE_SERVER, ['--auth', 'none', '--bind-addr', '127.0.0.1:0', '--user-data-dir', dirs.user,
    '--extensions-dir', dirs.extensions, '--config', '/dev/null', '--disable-telemetry', '--disable-update-check',
    '--disable-workspace-trust', dirs.workspace], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolveUrl, reject) => {
    let said = '';
    const listen = (data) => {
      said += data;
      const found = said.match(/HTTP server listening on (http:\/\/\S+)/);
      if (found) resolveUrl(found[1]);
    };
    server.stdout.on('data', listen);
    server.stderr.on('data', listen);
    server.on('exit', (code) => reject(new Error(`code-server exited (${code}): ${said}`)));
  });
}

/** The top frame of the Call Stack view, once the session is paused there and it contains `text`. */
async function stoppedAt(text, name) {
  await page.waitForFunction((want) => {
    const row = document.querySelector('.debug-call-stack .monaco-list-row');
    return row?.textContent.includes(want) && document.querySelector('.debug-toolbar .codicon-debug-continue');
  }, text, { timeout: STOP_MS });
  await shot(name);
  return page.locator('.debug-call-stack .monaco-list-row').first().textContent();
}

before(async () => {
  rmSync(OUT, { recursive: true, force: true });
  mkdirSync(OUT, { recursive: true });
  mkdirSync(join(dirs.user, 'User'), { recursive: true });
  mkdirSync(dirs.workspace);
  copyFileSync(join(ROOT, 'examples', 'gpt.py'), join(dirs.workspace, 'gpt.py'));
  writeFileSync(join(dirs.user, 'User', 'settings.json'), JSON.stringify({
    'rewind.python': PYTHON,
    'rewind.languageServer.enabled': false, // its analysis is tested elsewhere; here it would only share the cores
    'workbench.startupEditor': 'none',
    'workbench.secondarySideBar.defaultVisibility': 'hidden',
    'chat.disableAIFeatures': true,
    'security.workspace.trust.enabled': false,
    'telemetry.telemetryLevel': 'off',
    'extensions.autoCheckUpdates': false,
    'extensions.autoUpdate': false,
    'update.mode': 'none',
  }));
  const installed = spawnSync(CODE_SERVER, ['--user-data-dir', dirs.user, '--extensions-dir', dirs.extensions,
    '--config', '/dev/null', '--install-extension', VSIX], { encoding: 'utf8' });
  assert.match(installed.stdout, /successfully installed/, installed.stdout + installed.stderr);
  const url = await startCodeServer();
  browser = await chromium.launch({
    executablePath: '/usr/bin/chromium', headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-quic', '--no-first-run',
      '--disable-component-update', '--disable-sync'],
  });
  page = await browser.newPage({ viewport: { width: 1600, height: 1100 } });
  await page.goto(`${url}?folder=${encodeURIComponent(dirs.workspace)}`);
  await page.waitForSelector('.monaco-workbench', { timeout: 120_000 });
});

after(async () => {
  await browser?.close();
  if (server?.exitCode === null) process.kill(-server.pid, 'SIGTERM');
  rmSync(home, { recursive: true, force: true });
});

test('a Rewind session in VS Code: breakpoint, F5, variables, step back, reverse continue, timeline, tensor',
  { timeout: 600_000 }, async () => {
    try {
      await debugGpt();
    } catch (failure) {
      await shot('failure');
      throw failure;
    }
  });

/** What a user does, in order; each step checks what the UI shows. */
async function debugGpt() {
  await page.locator('.explorer-folders-view .monaco-list-row', { hasText: 'gpt.py' }).dblclick();
  await page.locator('.monaco-editor .view-lines', { hasText: 'class Attention' }).click();
  await page.locator('.monaco-editor.focused').waitFor();
  await page.keyboard.press('Control+G');
  await page.keyboard.type(String(BREAKPOINT_LINE));
  await page.keyboard.press('Enter');
  const glyph = page.locator('.codicon-debug-breakpoint').first();
  for (let tries = 0; !(await glyph.isVisible()); tries++) { // F9 does nothing until the extension's debugger is known
    assert.ok(tries < 30, 'F9 set no breakpoint');
    await page.keyboard.press('F9');
    await glyph.waitFor({ timeout: 2_000 }).catch(() => {});
  }
  await shot('breakpoint');

  await page.keyboard.press('F5'); // no launch.json: the extension debugs the open file, stopped on entry
  await page.locator('.debug-toolbar .codicon-debug-continue').waitFor({ timeout: STOP_MS });
  await page.keyboard.press('Control+Shift+D');
  assert.match(await stoppedAt('gpt.py69:', 'entry'), /^embedding \(aten\.embedding\) \[<root>\]/);
  await page.keyboard.press('F5');
  assert.match(await stoppedAt(`gpt.py${BREAKPOINT_LINE}:`, 'breakpoint-hit'), /^softmax \(aten\.softmax\) \[blocks\.0\.attn\]/);

  const variables = page.locator('.debug-variables .monaco-list-row');
  const locals = variables.filter({ hasText: /^Locals$/ });
  const scores = variables.filter({ hasText: /^scores =/ });
  for (let tries = 0; !(await scores.isVisible()); tries++) { // the tree renders again as the stop's scopes arrive
    assert.ok(tries < 15, 'the Locals scope shows no scores');
    await page.mouse.move(800, 1090); // off the tree: a variable's hover would take the click
    if ((await locals.getAttribute('aria-expanded')) !== 'true') await locals.click();
    await scores.waitFor({ timeout: 2_000 }).catch(() => {});
  }
  assert.match(await scores.textContent(), /^scores =float32\[1, 4, 16, 16\] cpu min=-1\.3\d+ max=1\.04\d+ .* inf=480$/);
  const names = (await variables.allTextContents()).map((row) => row.split(' =')[0]);
  for (const local of ['x', 'q', 'k', 'v', 'scores', 'mask']) assert.ok(names.includes(local), `${local} in ${names}`);
  await shot('variables');

  await page.keyboard.press('F5');
  assert.match(await stoppedAt('[blocks.1.attn]gpt.py29:', 'second-block'), /^softmax_1 /);
  await page.locator('.debug-toolbar .codicon-debug-step-back').click();
  assert.match(await stoppedAt('[blocks.1.attn]gpt.py28:', 'step-back'), /^bitwise_not_1 /); // line 28's first node
  await page.locator('.debug-toolbar .codicon-debug-reverse-continue').click();
  assert.match(await stoppedAt('[blocks.0.attn]gpt.py29:', 'reverse-continue'), /^softmax \(aten\.softmax\)/);

  await page.locator('.pane-header', { hasText: 'Rewind Timeline' }).click();
  const now = page.locator('.monaco-list-row', { hasText: /^Now: tick \d+ of \d+/ });
  await now.waitFor();
  assert.match(await now.textContent(), /^Now: tick \d+ of \d+softmax \(aten\.softmax\.int\) · blocks\.0\.attn · gpt\.py:29$/);
  await shot('timeline');

  const tab = page.locator('.tab', { hasText: 'Tensor: scores' });
  for (let tries = 0; !(await tab.isVisible()); tries++) { // a menu item clicked as the menu opens does nothing
    assert.ok(tries < 8, 'Show tensor opened no panel');
    await page.keyboard.press('Escape');
    await page.mouse.move(800, 1090);
    await scores.click({ button: 'right' });
    const item = page.getByRole('menuitem', { name: 'Show tensor' });
    await item.waitFor({ timeout: 5_000 }).catch(() => {});
    await page.waitForTimeout(300 * (tries + 1)); // the menu takes clicks once it has settled: longer on a busy host
    await item.hover().catch(() => {});
    await item.click().catch(() => {});
    await tab.waitFor({ timeout: 10_000 }).catch(() => {});
  }
  const tensor = page.frameLocator('iframe.webview').frameLocator('iframe');
  await tensor.locator('#heatmap').waitFor({ timeout: 30_000 });
  assert.match(await tensor.locator('body').textContent(), /float32\[1, 4, 16, 16\]/);
  await shot('tensor');

  await page.keyboard.press('F1'); // every notification of the session, the toasts that hid themselves too
  await page.keyboard.type('Notifications: Show Notifications');
  await page.locator('.quick-input-list .monaco-list-row', { hasText: 'Notifications: Show Notifications' }).waitFor();
  await page.keyboard.press('Enter');
  const center = page.locator('.notifications-center');
  await center.waitFor();
  await shot('notifications');
  // VS Code, redrawing the previous stop's Variables tree as a motion runs, sometimes asks for a reference the motion
  // cleared: the adapter refuses it without showUser (dap_server/failures.ExpiredReference), so no toast either.
  const errors = await center.locator('.notification-list-item', { has: page.locator('.codicon-error') })
    .allTextContents();
  assert.deepEqual(errors, [], 'no error notification in the session');
}
