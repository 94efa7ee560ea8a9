// VS Code glue for Rewind's language server (python -m provenance.lsp): started for the program
// of the first Rewind session, told about later programs and about every stop's tick.

import * as vscode from 'vscode';
import { LanguageClient } from 'vscode-languageclient/node';
import { analysisOptions, RewindConfiguration } from './launch';

let client: LanguageClient | undefined;

export async function analyse(config: RewindConfiguration, cwd?: string): Promise<void> {
  const settings = vscode.workspace.getConfiguration('rewind');
  if (!settings.get<boolean>('languageServer.enabled', true)) {
    return;
  }
  const options = analysisOptions(config);
  if (client) {
    await client.sendRequest('workspace/executeCommand', { command: 'rewind.analyse', arguments: [options] });
    return;
  }
  const python = config.python || settings.get<string>('python', 'python3');
  client = new LanguageClient('rewind', 'Rewind findings',
    { command: python, args: ['-m', 'provenance.lsp'], options: { cwd: config.cwd ?? cwd } },
    { documentSelector: [{ scheme: 'file', language: 'python' }], initializationOptions: options });
  await client.start();
}

/** Hovers describe the debugger's current tick. */
export async function follow(tick: number): Promise<void> {
  await client?.sendRequest('workspace/executeCommand', { command: 'rewind.goto', arguments: [tick] });
}

export async function stop(): Promise<void> {
  await client?.stop();
  client = undefined;
}
