// VS Code glue for the Rewind Timeline tree view; the tree itself is timelineModel.ts, what it knows of the
// divergence divergenceWatch.ts.

import * as vscode from 'vscode';
import { TIMELINE_GO } from './commands';
import { DEBUG_TYPE } from './debugSetup';
import { loadTimeline, runAction } from './dap';
import { DivergenceWatch } from './divergenceWatch';
import { Action, Mark, TimelineItem } from './timelineModel';

/** Where a NaN (an error) or only an Inf (a warning: often absorbed, as a mask's) was born; where the pass started to
 * leave its reference. */
const MARKS: Record<Mark, vscode.ThemeIcon> = {
  nan: new vscode.ThemeIcon('error', new vscode.ThemeColor('errorForeground')),
  inf: new vscode.ThemeIcon('warning', new vscode.ThemeColor('editorWarning.foreground')),
  divergence: new vscode.ThemeIcon('diff', new vscode.ThemeColor('charts.orange')),
};

export class TimelineView implements vscode.TreeDataProvider<TimelineItem> {
  private items: TimelineItem[] = [];
  private readonly watches = new Map<string, DivergenceWatch>(); // by session id
  private readonly changed = new vscode.EventEmitter<void>();
  readonly onDidChangeTreeData = this.changed.event;

  /** Show the session's timeline (or nothing, without a Rewind session); returns its position. */
  async refresh(session = vscode.debug.activeDebugSession): Promise<number | undefined> {
    const divergence = session && this.watches.get(session.id)?.known;
    const loaded = session?.type === DEBUG_TYPE ? await loadTimeline(session, divergence) : undefined;
    this.items = loaded?.items ?? [];
    this.changed.fire();
    return loaded?.position;
  }

  /** Follow a message the session's adapter sent; true when the view should be refreshed. */
  heard(session: vscode.DebugSession, message: { type: string }): boolean {
    let watch = this.watches.get(session.id);
    if (!watch) {
      this.watches.set(session.id, (watch = new DivergenceWatch()));
    }
    return watch.heard(message);
  }

  forget(session: vscode.DebugSession): void {
    this.watches.delete(session.id);
  }

  async go(action: Action): Promise<void> {
    const session = vscode.debug.activeDebugSession;
    if (session?.type === DEBUG_TYPE) {
      await runAction(session, action);
    }
  }

  getChildren(item?: TimelineItem): TimelineItem[] {
    return item ? item.children ?? [] : this.items;
  }

  getTreeItem(item: TimelineItem): vscode.TreeItem {
    const state = item.children ? vscode.TreeItemCollapsibleState.Expanded : vscode.TreeItemCollapsibleState.None;
    const tree = new vscode.TreeItem(item.label, state);
    tree.id = item.id;
    tree.description = item.description;
    tree.tooltip = item.tooltip;
    tree.iconPath = item.current ? new vscode.ThemeIcon('debug-stackframe') : item.mark && MARKS[item.mark];
    if (item.action) {
      tree.command = { command: TIMELINE_GO, title: item.tooltip ?? item.label, arguments: [item.action] };
    }
    return tree;
  }
}
