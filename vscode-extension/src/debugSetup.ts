// VS Code glue for the `rewind` debug type: configurations, the adapter to start, and the stops
// the views follow. The decisions are in launch.ts and adapter.ts.

import * as vscode from 'vscode';
import { chooseAdapter } from './adapter';
import { contributions } from './contributions';
import { resolveConfiguration } from './launch';

export const DEBUG_TYPE = 'rewind';

class ConfigurationProvider implements vscode.DebugConfigurationProvider {
  provideDebugConfigurations(): vscode.DebugConfiguration[] {
    return contributions().debuggers[0].initialConfigurations as vscode.DebugConfiguration[];
  }

  resolveDebugConfiguration(_folder: unknown, config: vscode.DebugConfiguration): vscode.DebugConfiguration | undefined {
    const resolved = resolveConfiguration(config, vscode.window.activeTextEditor?.document.uri.fsPath);
    if ('error' in resolved) {
      void vscode.window.showErrorMessage(resolved.error);
      return undefined; // abort the launch
    }
    return resolved.config;
  }
}

class AdapterFactory implements vscode.DebugAdapterDescriptorFactory {
  createDebugAdapterDescriptor(session: vscode.DebugSession): vscode.DebugAdapterDescriptor {
    const python = vscode.workspace.getConfiguration('rewind').get<string>('python', 'python3');
    const choice = chooseAdapter(session.configuration as never, python, session.workspaceFolder?.uri.fsPath);
    if (choice.kind === 'server') {
      return new vscode.DebugAdapterServer(choice.port, choice.host);
    }
    return new vscode.DebugAdapterExecutable(choice.command, choice.args, { cwd: choice.cwd });
  }
}

/** Register the debug type; `onStopped` runs after every `stopped` event of a Rewind session, `onMessage` on every
 * message its adapter sends. */
export function registerDebugType(context: vscode.ExtensionContext, onStopped: (s: vscode.DebugSession) => void,
  onMessage: (s: vscode.DebugSession, m: { type: string }) => void) {
  context.subscriptions.push(
    vscode.debug.registerDebugConfigurationProvider(DEBUG_TYPE, new ConfigurationProvider()),
    vscode.debug.registerDebugAdapterDescriptorFactory(DEBUG_TYPE, new AdapterFactory()),
    vscode.debug.registerDebugAdapterTrackerFactory(DEBUG_TYPE, {
      createDebugAdapterTracker: (session) => ({
        onDidSendMessage: (m: { type: string; event?: string }) => {
          onMessage(session, m);
          if (m.type === 'event' && m.event === 'stopped') {
            onStopped(session);
          }
        },
      }),
    }),
  );
}
