// VS Code glue for the Tensor webview; the page is tensorView.ts, the data dap.ts.

import { randomBytes } from 'crypto';
import * as vscode from 'vscode';
import { DebugClient, loadTensor, ValueRef } from './dap';
import { tensorHtml, viewModel } from './tensorView';

interface Shown {
  client: DebugClient;
  ref: ValueRef;
  reference: boolean;
}

let panel: vscode.WebviewPanel | undefined;
let shown: Shown | undefined;

/** Show the tensor `ref` names in the Tensor panel: its slice at `index` (default the first),
 * and with `reference` its difference from the reference run. */
export async function showTensor(client: DebugClient, ref: ValueRef, index?: number[], reference = false): Promise<void> {
  const payload = await loadTensor(client, ref, index, reference);
  shown = { client, ref, reference };
  panel ??= createPanel();
  panel.title = `Tensor: ${payload.title}`;
  panel.webview.html = tensorHtml(viewModel(payload), randomBytes(16).toString('hex'), panel.webview.cspSource);
  panel.reveal(undefined, true);
}

function createPanel(): vscode.WebviewPanel {
  const created = vscode.window.createWebviewPanel('rewind.tensor', 'Tensor', vscode.ViewColumn.Beside, { enableScripts: true });
  created.onDidDispose(() => (panel = shown = undefined));
  created.webview.onDidReceiveMessage((m: { type: 'slice' | 'reference'; index: number[] }) => {
    if (shown) {
      showTensor(shown.client, shown.ref, m.index, shown.reference || m.type === 'reference')
        .catch((e) => vscode.window.showErrorMessage(`Rewind: ${e.message}`));
    }
  });
  return created;
}
