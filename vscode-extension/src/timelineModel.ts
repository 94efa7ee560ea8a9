// The Rewind Timeline view as data: the current tick, the checkpoints (click: restore) and the
// ticks around now (click: go there), built from the adapter's `timeline` and `checkpoints` answers.

export interface TickEntry {
  tick: number;
  unit: string;
  node: string | null;
  op: string;
  source: { file: string; line: number } | null;
  module: string | null;
  executed: boolean;
  edit: string | null;
}

export interface TimelineBody {
  position: number;
  end: number;
  ticks: TickEntry[];
}

export interface CheckpointEntry {
  tick: number;
  bytes: number;
  tier: string;
  values: number;
}

/** A DAP request the item runs when clicked. */
export interface Action {
  request: 'goto' | 'restoreCheckpoint';
  args: Record<string, number>;
}

export interface TimelineItem {
  id: string;
  label: string;
  description?: string;
  tooltip?: string;
  current?: boolean;
  action?: Action;
  children?: TimelineItem[];
}

export const TICKS_AROUND = 8;
const THREAD_ID = 1;

/** The window of ticks the view shows around `position`: the `timeline` request's arguments. */
export function tickWindow(position: number): { start: number; count: number } {
  const start = Math.max(0, position - TICKS_AROUND);
  return { start, count: position - start + TICKS_AROUND + 1 };
}

export function timelineTree(timeline: TimelineBody, checkpoints: CheckpointEntry[]): TimelineItem[] {
  const { position, end, ticks } = timeline;
  const here = ticks.find((t) => t.tick === position);
  const now: TimelineItem = {
    id: 'now',
    label: position >= end ? `Now: end of program (tick ${end})` : `Now: tick ${position} of ${end}`,
    description: here ? describeTick(here) : undefined,
    current: true,
  };
  return [
    now,
    {
      id: 'checkpoints',
      label: `Checkpoints (${checkpoints.length})`,
      children: checkpoints.map((c) => checkpointItem(c, position)),
    },
    { id: 'ticks', label: 'Ticks around now', children: ticks.map((t) => tickItem(t, position)) },
  ];
}

function checkpointItem(c: CheckpointEntry, position: number): TimelineItem {
  return {
    id: `checkpoint-${c.tick}`,
    label: `tick ${c.tick}`,
    description: `${c.tier} · ${formatBytes(c.bytes)} · ${c.values} values`,
    tooltip: `Restore the checkpoint at tick ${c.tick}`,
    current: c.tick === position,
    action: { request: 'restoreCheckpoint', args: { tick: c.tick } },
  };
}

function tickItem(t: TickEntry, position: number): TimelineItem {
  return {
    id: `tick-${t.tick}`,
    label: `tick ${t.tick}`,
    description: describeTick(t) + (t.executed ? '' : ' · not run yet'),
    tooltip: `Go to tick ${t.tick} (unit ${t.unit})`,
    current: t.tick === position,
    action: { request: 'goto', args: { threadId: THREAD_ID, targetId: t.tick + 1 } },
  };
}

export function describeTick(t: TickEntry): string {
  if (t.edit) {
    return `edit: ${t.edit}`;
  }
  const where = t.source ? ` · ${basename(t.source.file)}:${t.source.line}` : '';
  const module = t.module ? ` · ${t.module}` : '';
  return `${t.node} (${t.op})${module}${where}`;
}

export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function basename(file: string): string {
  return file.split(/[\\/]/).pop() ?? file;
}
