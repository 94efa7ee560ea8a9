// VS Code prompts for the experiment commands: quick picks and input boxes whose choices come from the
// adapter (experiments.ts lists them) and whose input is checked by experiments.ts's parsers as it is typed.
// Each returns undefined when the user cancels.

import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { DebugClient } from './dap';
import {
  branchNames, DEFAULT_BRANCH, defaultPatchName, DTYPES, Listing, ORIGINAL, parseAttributes, parseEdit, PATCH_KINDS, PatchKind,
  patchRefs, PatchSpec, patchTargets,
} from './experiments';

/** A patch: what it changes, of which node, how, on which branch, under which name. */
export async function askPatch(client: DebugClient): Promise<PatchSpec | undefined> {
  const kinds = Object.entries(PATCH_KINDS).map(([label, detail]) => ({ label, detail }));
  const kind = await vscode.window.showQuickPick(kinds, { placeHolder: 'What the patch changes' });
  if (!kind) {
    return undefined;
  }
  const spec: PatchSpec = { kind: kind.label as PatchKind };
  if (spec.kind !== 'edit') {
    const targets = (await patchTargets(client)).map((t) => ({ label: t.name, description: t.detail }));
    spec.node = (await vscode.window.showQuickPick(targets, { placeHolder: 'The node to patch (or a module path: all its nodes)',
      matchOnDescription: true }))?.label;
  }
  if ((spec.kind !== 'edit' && !spec.node) || !(await askChange(spec))) {
    return undefined;
  }
  const { active }: Listing = await client.customRequest('listPatches', {});
  spec.branch = await vscode.window.showInputBox({ prompt: 'The branch: an existing one or a new name',
    value: active === ORIGINAL ? DEFAULT_BRANCH : active });
  spec.name = spec.branch && await vscode.window.showInputBox({ prompt: 'The patch\'s name', value: defaultPatchName(spec) });
  return spec.name ? spec : undefined;
}

/** What the node does instead, by kind; false when cancelled. */
async function askChange(spec: PatchSpec): Promise<boolean> {
  switch (spec.kind) {
    case 'precision':
      spec.dtype = await vscode.window.showQuickPick(DTYPES, { placeHolder: `Run ${spec.node} at` });
      return spec.dtype !== undefined;
    case 'function': {
      const [file] = await vscode.window.showOpenDialog({ filters: { Python: ['py'] }, openLabel: 'Use its function' }) ?? [];
      spec.source = file && { text: fs.readFileSync(file.fsPath, 'utf8'), file: file.fsPath };
      spec.entry = spec.source && await vscode.window.showInputBox({ prompt: 'The function (blank: the one the file defines)' });
      return spec.entry !== undefined;
    }
    case 'attributes':
      spec.attributes = await checkedInput('The attributes to change: NAME=VALUE, …', 'eps=1e-3', parseAttributes);
      return spec.attributes !== undefined;
    case 'edit':
      spec.edit = await checkedInput('Set one element of a node\'s output: VALUE[I, J, …] = NUMBER', 'div[0, 1, 2] = 0', parseEdit);
      return spec.edit !== undefined;
  }
}

function checkedInput(prompt: string, placeHolder: string, parse: (text: string) => unknown): Thenable<string | undefined> {
  return vscode.window.showInputBox({ prompt, placeHolder, validateInput: (text) => {
    try {
      parse(text);
      return undefined;
    } catch (err) {
      return (err as Error).message;
    }
  } });
}

export async function askBranch(client: DebugClient): Promise<string | undefined> {
  return vscode.window.showQuickPick(await branches(client), { placeHolder: 'The experiment branch' });
}

export async function askBranches(client: DebugClient): Promise<string[] | undefined> {
  const picked = await vscode.window.showQuickPick(await branches(client), { placeHolder: 'The branches to compare', canPickMany: true });
  return picked?.length ? picked : undefined;
}

async function branches(client: DebugClient): Promise<string[]> {
  const names = branchNames(await client.customRequest('listPatches', {}));
  if (!names.length) {
    throw new Error('no experiment branch yet: Rewind: Add patch… makes one');
  }
  return names;
}

export async function askPatchRef(client: DebugClient): Promise<{ branch: string; name: string } | undefined> {
  const refs = patchRefs(await client.customRequest('listPatches', {}));
  if (!refs.length) {
    throw new Error('no patch to remove');
  }
  const items = refs.map((r) => ({ label: r.name, description: `branch ${r.branch}`, detail: r.description, ref: r }));
  const picked = await vscode.window.showQuickPick(items, { placeHolder: 'The patch to remove' });
  return picked && { branch: picked.ref.branch, name: picked.ref.name };
}

/** Fix files to try, or none: the knowledge base's suggestions. */
export async function askFixes(): Promise<{ text: string; name: string }[] | undefined> {
  const choices = [
    { label: 'Fix files…', detail: 'Python files defining PATCHES (docs/repair.md), tried in order' },
    { label: 'The knowledge base\'s suggestions', detail: 'fixes validated before and built-in recipes, for this pass\'s findings' },
  ];
  const how = await vscode.window.showQuickPick(choices, { placeHolder: 'What the repair loop tries' });
  if (how !== choices[0]) {
    return how && [];
  }
  const files = await vscode.window.showOpenDialog({ canSelectMany: true, filters: { Python: ['py'] }, openLabel: 'Try these fixes' });
  return files?.map((f) => ({ text: fs.readFileSync(f.fsPath, 'utf8'), name: path.basename(f.fsPath) }));
}
