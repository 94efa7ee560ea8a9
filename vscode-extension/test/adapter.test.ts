import * as assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { chooseAdapter } from '../src/adapter';
import { RewindConfiguration } from '../src/launch';
import { Adapter, PYTHON, REPO } from './dapClient';

const MLP = `${REPO}/examples/mlp.py`;
const config = (extra: object) => ({ type: 'rewind', request: 'launch', name: 'x', program: MLP, ...extra }) as RewindConfiguration;

test('a launch runs python -m dap_server with the configuration interpreter, else the setting', () => {
  assert.deepEqual(chooseAdapter(config({ python: '/opt/py/bin/python' }), 'python3', '/ws'),
    { kind: 'executable', command: '/opt/py/bin/python', args: ['-m', 'dap_server'], cwd: '/ws' });
  assert.deepEqual(chooseAdapter(config({ cwd: '/elsewhere' }), '/usr/bin/python3.11'),
    { kind: 'executable', command: '/usr/bin/python3.11', args: ['-m', 'dap_server'], cwd: '/elsewhere' });
});

test('an attach connects to the port, on localhost unless a host is given', () => {
  assert.deepEqual(chooseAdapter(config({ request: 'attach', port: 4711 }), 'python3'), { kind: 'server', host: '127.0.0.1', port: 4711 });
  assert.deepEqual(chooseAdapter(config({ request: 'attach', port: 9, host: 'gpu-box' }), 'python3'), { kind: 'server', host: 'gpu-box', port: 9 });
});

test('the adapter a launch starts offers step back and takes the whole configuration VS Code sends', async () => {
  const launch = config({ python: PYTHON, cwd: REPO, driver: 'torch:cpu', stopOnEntry: true, __sessionId: 'x' });
  const choice = chooseAdapter(launch, 'python3');
  if (choice.kind !== 'executable') throw new Error(`expected an executable, got ${choice.kind}`);
  const adapter = Adapter.spawn(choice.command, choice.args, choice.cwd);
  const capabilities = await adapter.customRequest('initialize', { adapterID: 'rewind' });
  assert.equal(capabilities.supportsStepBack, true); // VS Code shows Step Back and Reverse Continue
  await Promise.all([adapter.dc.waitForEvent('initialized'), adapter.customRequest('launch', launch)]);
  await adapter.close();
});

test('an attach debugs through an adapter already listening on a port', async () => {
  const server = spawn(PYTHON, ['-m', 'dap_server', '--port', '0'], { cwd: REPO });
  try {
    const port = await listeningPort(server.stderr);
    const choice = chooseAdapter(config({ request: 'attach', port }), 'python3');
    assert.deepEqual(choice, { kind: 'server', host: '127.0.0.1', port });
    const adapter = await Adapter.connect(port);
    await adapter.start('attach', { program: MLP, driver: 'torch:cpu', stopOnEntry: true, port, host: '127.0.0.1' });
    const { position, end } = await adapter.customRequest('timeline', { count: 0 });
    assert.deepEqual([position, end > 0], [0, true]);
    await adapter.close();
  } finally {
    server.kill();
  }
});

function listeningPort(stderr: NodeJS.ReadableStream): Promise<number> {
  return new Promise((resolve, reject) => {
    let text = '';
    stderr.on('data', (d: Buffer) => {
      text += d.toString();
      const match = /listening on [^:]+:(\d+)/.exec(text);
      if (match) resolve(Number(match[1]));
    });
    stderr.on('close', () => reject(new Error(`the adapter never listened: ${text}`)));
  });
}
