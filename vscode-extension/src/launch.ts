// Resolving a `rewind` debug configuration before a session starts: defaults for F5 without a
// launch.json, and every problem named before the adapter is even started.

import { configurationSchema } from './contributions';
import { problems } from './schema';

export interface RewindConfiguration {
  type: string;
  request: string;
  name: string;
  program?: string;
  entry?: string;
  driver?: string;
  stopOnEntry?: boolean;
  checkpoint?: { budgetMB?: number; every?: number };
  reference?: string;
  trace?: string;
  seed?: number;
  schedule?: string;
  faults?: object[];
  python?: string;
  cwd?: string;
  port?: number;
  host?: string;
  [attribute: string]: unknown;
}

export type Resolution = { config: RewindConfiguration } | { error: string };

/** The configuration to start, or the reason it cannot start. `activeFile`: the editor's file, for F5. */
export function resolveConfiguration(config: Partial<RewindConfiguration>, activeFile?: string): Resolution {
  if (!config.type && !config.request && !config.name) {
    if (!activeFile?.endsWith('.py')) {
      return { error: "Rewind: open a Python model file, or add a 'rewind' configuration to launch.json" };
    }
    config = { type: 'rewind', request: 'launch', name: 'Rewind: debug model', program: activeFile, stopOnEntry: true };
  }
  const request = config.request ?? '';
  const schema = configurationSchema(request);
  if (!schema) {
    return { error: `Rewind: 'request' must be "launch" or "attach", got ${JSON.stringify(config.request)}` };
  }
  const found = problems(config, schema);
  if (config.program === undefined && config.trace === undefined) {
    found.push("'program' is required (or 'trace', to open a recorded run)");
  }
  if (found.length) {
    return { error: `Rewind: ${config.name ?? 'the configuration'}: ${found.join('; ')}` };
  }
  return { config: { entry: 'build', ...config } as RewindConfiguration };
}

/** What the language server analyses for a configuration: the recorded run if it opens a trace,
 * else the program, with the attributes that choose the run. */
export function analysisOptions(config: RewindConfiguration): Record<string, unknown> {
  const options: Record<string, unknown> = {};
  const run = config.trace !== undefined ? (['trace'] as const) : (['program', 'entry'] as const);
  const keys = [...run, 'driver', 'reference', 'seed', 'schedule', 'faults'] as const;
  for (const key of keys) {
    if (config[key] !== undefined) {
      options[key] = config[key];
    }
  }
  if (config.checkpoint?.budgetMB !== undefined) {
    options.budgetMB = config.checkpoint.budgetMB;
  }
  return options;
}
