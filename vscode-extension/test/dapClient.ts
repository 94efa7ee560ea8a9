// Rewind's adapter for tests, driven by VS Code's own DAP test client (@vscode/debugadapter-testsupport),
// and seen through the DebugClient interface the extension's logic uses (request -> response body).

import { ChildProcess, spawn } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { DebugClient as TestClient } from '@vscode/debugadapter-testsupport';
import { DebugClient } from '../src/dap';

export const REPO = path.resolve(__dirname, '..', '..', '..');
export const PYTHON = process.env.REWIND_PYTHON ?? path.join(REPO, '.venv', 'bin', 'python');
/** The 1-based number of the first line of `file` containing `text`. */
export function lineOf(file: string, text: string): number {
  return fs.readFileSync(file, 'utf8').split('\n').findIndex((l) => l.includes(text)) + 1;
}

const HANG_MS = 120_000; // loading a model takes seconds; this only turns a hang into a failure

/** The test client, reading and writing the streams of a process this file started. */
class StreamClient extends TestClient {
  over(readable: NodeJS.ReadableStream, writable: NodeJS.WritableStream): void {
    this.connect(readable as never, writable as never);
  }
}

export class Adapter implements DebugClient {
  private constructor(readonly dc: TestClient, private readonly child?: ChildProcess) {
    dc.defaultTimeout = HANG_MS;
  }

  /** An adapter started as a process speaking DAP on stdin/stdout: `command args` in `cwd`. */
  static spawn(command = PYTHON, args = ['-m', 'dap_server'], cwd = REPO): Adapter {
    const child = spawn(command, args, { cwd, stdio: ['pipe', 'pipe', 'inherit'] });
    const dc = new StreamClient(command, args.join(' '), 'rewind');
    dc.over(child.stdout!, child.stdin!);
    return new Adapter(dc, child);
  }

  /** An adapter already listening on a TCP port of this machine. */
  static async connect(port: number): Promise<Adapter> {
    const dc = new TestClient('unused', 'unused', 'rewind');
    await dc.start(port);
    return new Adapter(dc);
  }

  async customRequest(command: string, args?: unknown): Promise<any> {
    return (await this.dc.customRequest(command, args)).body ?? {};
  }

  /** initialize, launch (or attach), configurationDone, as VS Code does; resolves at the first stop. */
  async start(request: 'launch' | 'attach', args: Record<string, unknown>): Promise<void> {
    await this.customRequest('initialize', { adapterID: 'rewind', linesStartAt1: true, columnsStartAt1: true });
    await Promise.all([this.dc.waitForEvent('initialized'), this.customRequest(request, args)]);
    await this.moved('configurationDone', {});
  }

  /** Send a request that moves the session and wait for the stop it ends in. */
  async moved(command: string, args: unknown): Promise<void> {
    await Promise.all([this.dc.waitForEvent('stopped'), this.customRequest(command, args)]);
  }

  async close(): Promise<void> {
    await this.dc.stop();
    this.child?.kill();
  }
}
