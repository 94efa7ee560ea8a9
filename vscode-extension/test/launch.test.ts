import * as assert from 'node:assert/strict';
import { test } from 'node:test';
import { contributions } from '../src/contributions';
import { analysisOptions, resolveConfiguration } from '../src/launch';

const error = (config: object, activeFile?: string) => {
  const r = resolveConfiguration(config, activeFile);
  assert.ok('error' in r, `expected an error for ${JSON.stringify(config)}`);
  return r.error;
};
const launch = (extra: object) => ({ type: 'rewind', request: 'launch', name: 'run', program: 'model.py', ...extra });

test('F5 without a launch.json debugs the open Python file, stopped on entry', () => {
  const r = resolveConfiguration({}, '/work/model.py');
  assert.deepEqual(r, {
    config: { type: 'rewind', request: 'launch', name: 'Rewind: debug model', program: '/work/model.py', stopOnEntry: true, entry: 'build' },
  });
});

test('F5 without a launch.json and no Python file open is refused, saying what to do', () => {
  assert.match(error({}, '/work/notes.md'), /open a Python model file, or add a 'rewind' configuration/);
});

test('the schema covers every launch attribute of the issue', () => {
  const launchSchema = contributions().debuggers[0].configurationAttributes.launch;
  for (const attribute of ['program', 'entry', 'driver', 'stopOnEntry', 'checkpoint', 'reference', 'trace', 'seed', 'schedule', 'faults']) {
    assert.ok(launchSchema.properties?.[attribute]?.description, `no documented '${attribute}' in the launch schema`);
  }
  assert.deepEqual(Object.keys(launchSchema.properties?.checkpoint.properties ?? {}), ['budgetMB', 'every']);
});

test('wrong attribute values are refused, each problem named', () => {
  const message = error(launch({ driver: 'tpu', stopOnEntry: 'yes', checkpoint: { budgetMB: 0, every: 1.5 }, seed: -1,
    schedule: 'fair', faults: { kind: 'drop_barrier' } }));
  assert.match(message, /'driver' is "tpu"; expected auto, torch:cpu, torch:cuda, torch:cuda:N, sim or sim:<config>/);
  assert.match(message, /'stopOnEntry' must be a boolean, got "yes"/);
  assert.match(message, /'checkpoint.budgetMB' must be more than 0, got 0/);
  assert.match(message, /'checkpoint.every' must be an integer, got 1.5/);
  assert.match(message, /'seed' must be at least 0, got -1/);
  assert.match(message, /'schedule' is "fair"; expected one of "round-robin", "random"/);
  assert.match(message, /'faults' must be an array, got \{"kind":"drop_barrier"\}/);
});

test('a launch needs a program or a trace', () => {
  assert.match(error({ type: 'rewind', request: 'launch', name: 'x' }), /'program' is required \(or 'trace'/);
  assert.ok('config' in resolveConfiguration({ type: 'rewind', request: 'launch', name: 'x', trace: 'run.rwtrace' }));
});

test('an attach needs a port in range, and an unknown request kind is refused', () => {
  assert.match(error({ type: 'rewind', request: 'attach', name: 'a', program: 'm.py' }), /'port' is required/);
  assert.match(error({ type: 'rewind', request: 'attach', name: 'a', program: 'm.py', port: 70000 }), /'port' must be at most 65535/);
  assert.match(error({ type: 'rewind', request: 'debug', name: 'a' }), /'request' must be "launch" or "attach", got "debug"/);
});

test('the initial configuration and every snippet body conform to the schema', () => {
  const debuggerContribution = contributions().debuggers[0] as any;
  const bodies = [...debuggerContribution.initialConfigurations, ...debuggerContribution.configurationSnippets.map((s: any) => s.body)];
  for (const snippet of bodies) {
    const body = JSON.parse(JSON.stringify(snippet).replace(/\$\{\d+:([^}]*)\}/g, '$1')); // as VS Code inserts it
    const resolved = resolveConfiguration(body);
    assert.ok('config' in resolved, `${body.name}: ${'error' in resolved && resolved.error}`);
  }
});

test('the language server analyses the attributes that choose the run', () => {
  const config = launch({ entry: 'small', driver: 'sim', checkpoint: { budgetMB: 64, every: 4 }, stopOnEntry: true, seed: 3,
    schedule: 'random', reference: 'ref.rwtrace' });
  assert.deepEqual(analysisOptions(config as never),
    { program: 'model.py', entry: 'small', driver: 'sim', reference: 'ref.rwtrace', seed: 3, schedule: 'random', budgetMB: 64 });
  assert.deepEqual(analysisOptions(launch({ trace: 'run.rwtrace', entry: 'small' }) as never), { trace: 'run.rwtrace' });
});
