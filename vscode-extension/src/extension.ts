// The extension's entry point: wires the debug type, the views, the commands and the language
// server into VS Code. Every decision lives in a module that does not import vscode.

import * as vscode from 'vscode';
import { CommandContext, COMMANDS, runCommand, SHOW_TENSOR, TIMELINE_GO, TIMELINE_REFRESH } from './commands';
import { ValueRef } from './dap';
import { DEBUG_TYPE, registerDebugType } from './debugSetup';
import { askBranch, askBranches, askFixes, askPatch, askPatchRef } from './experimentPrompts';
import * as languageServer from './languageServer';
import { RewindConfiguration } from './launch';
import { showTensor } from './tensorPanel';
import { TimelineView } from './timelineView';

const output = vscode.window.createOutputChannel('Rewind');

export function activate(context: vscode.ExtensionContext): void {
  const timeline = new TimelineView();
  registerDebugType(context, (session) => void onStopped(session, timeline),
    (session, message) => timeline.heard(session, message) && void guarded(() => timeline.refresh(session)));
  context.subscriptions.push(
    output,
    vscode.window.registerTreeDataProvider('rewind.timeline', timeline),
    vscode.commands.registerCommand(TIMELINE_REFRESH, () => guarded(() => timeline.refresh())),
    vscode.commands.registerCommand(TIMELINE_GO, (action) => guarded(() => timeline.go(action))),
    vscode.commands.registerCommand(SHOW_TENSOR, (arg) => guarded(async () => {
      const value = await valueFrom(arg);
      return value && showTensor(rewindSession(), value);
    })),
    ...Object.keys(COMMANDS).map((id) =>
      vscode.commands.registerCommand(id, (arg) => guarded(() => report(id, arg)))),
    vscode.debug.onDidStartDebugSession((s) => s.type === DEBUG_TYPE &&
      guarded(() => languageServer.analyse(s.configuration as RewindConfiguration, s.workspaceFolder?.uri.fsPath))),
    vscode.debug.onDidTerminateDebugSession((s) => guarded(() => (timeline.forget(s), timeline.refresh()))),
  );
}

export function deactivate(): Promise<void> {
  return languageServer.stop();
}

async function onStopped(session: vscode.DebugSession, timeline: TimelineView): Promise<void> {
  await guarded(async () => {
    const position = await timeline.refresh(session);
    if (position !== undefined) {
      await languageServer.follow(position);
    }
  });
}

/** How each thing a command needs is asked for: from what it was run on, or from the user. */
const ASK: { [K in keyof CommandContext]-?: (session: vscode.DebugSession, arg: unknown) => Promise<CommandContext[K]> } = {
  value: (_, arg) => valueFrom(arg),
  path: async () => (await vscode.window.showSaveDialog({ filters: { 'Rewind trace': ['rwtrace'] } }))?.fsPath,
  line: async () => {
    const editor = vscode.window.activeTextEditor;
    return editor && { file: editor.document.uri.fsPath, line: editor.selection.active.line + 1 };
  },
  patch: askPatch,
  branch: askBranch,
  branches: askBranches,
  patchRef: askPatchRef,
  fixes: askFixes,
};

async function report(id: string, arg: unknown): Promise<void> {
  const session = rewindSession();
  const ctx: Record<string, unknown> = {};
  const needs = COMMANDS[id].needs;
  if (needs) {
    ctx[needs] = await ASK[needs](session, arg);
    if (ctx[needs] === undefined) {
      return; // the user cancelled
    }
  }
  output.appendLine(await runCommand(session, id, ctx as CommandContext));
  output.show(true);
}

/** The tensor a command is about: the variable it was run on, else a name the user types. */
async function valueFrom(arg: unknown): Promise<ValueRef | undefined> {
  const frame = vscode.debug.activeStackItem;
  const frameId = frame instanceof vscode.DebugStackFrame ? frame.frameId : undefined;
  const variable = (arg as { variable?: { name: string; evaluateName?: string } } | undefined)?.variable;
  const name = variable ? variable.evaluateName ?? variable.name
    : await vscode.window.showInputBox({ prompt: 'Tensor: a source variable (scores) or a value of the program (div_1)' });
  return name ? { name, frameId } : undefined;
}

function rewindSession(): vscode.DebugSession {
  const session = vscode.debug.activeDebugSession;
  if (session?.type !== DEBUG_TYPE) {
    throw new Error('no Rewind debug session is active');
  }
  return session;
}

async function guarded(work: () => Promise<unknown> | unknown): Promise<void> {
  try {
    await work();
  } catch (err) {
    void vscode.window.showErrorMessage(`Rewind: ${err instanceof Error ? err.message : String(err)}`);
  }
}
