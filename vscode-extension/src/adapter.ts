// Which debug adapter a configuration talks to: `python -m dap_server` over stdio with the
// configured interpreter, or an adapter already listening on a port.

import { RewindConfiguration } from './launch';

export type AdapterChoice =
  | { kind: 'executable'; command: string; args: string[]; cwd?: string }
  | { kind: 'server'; host: string; port: number };

export const DEFAULT_HOST = '127.0.0.1';

/** `pythonSetting`: the rewind.python setting; `workspaceFolder`: where a launch without `cwd` runs. */
export function chooseAdapter(config: RewindConfiguration, pythonSetting: string, workspaceFolder?: string): AdapterChoice {
  if (config.request === 'attach') {
    return { kind: 'server', host: config.host ?? DEFAULT_HOST, port: config.port as number };
  }
  const command = config.python || pythonSetting || 'python3';
  const cwd = config.cwd ?? workspaceFolder;
  return { kind: 'executable', command, args: ['-m', 'dap_server'], ...(cwd ? { cwd } : {}) };
}
