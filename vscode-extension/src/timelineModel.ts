// The Rewind Timeline view as data: the current tick, a training run's steps (click: go to the step's start; marked
// where a NaN or Inf was born), the checkpoints (click: restore) and the ticks around now (click: go there), built
// from the adapter's `timeline`, `timelineEvents` and `checkpoints` answers. An inference pass has no steps: its view
// shows nothing of them.

export interface TickEntry {
  tick: number;
  unit: string;
  node: string | null;
  op: string;
  source: { file: string; line: number } | null;
  module: string | null;
  executed: boolean;
  edit: string | null;
  step?: number; // the training step the tick belongs to
  phase?: string; // forward, backward, optimizer (or edit)
}

/** A training step: where it starts and the value of its loss. */
export interface StepEntry {
  step: number;
  tick: number;
  loss: string;
}

export interface TimelineBody {
  position: number;
  end: number;
  ticks: TickEntry[];
  steps?: StepEntry[]; // a training run's steps; none for an inference pass
}

/** A write of NaN or Inf its inputs did not carry (a `birth` event of `timelineEvents`). */
export interface Birth {
  tick: number;
  node: string;
  op: string;
  source: string | null; // file:line
  value: string;
  kind: 'nan' | 'inf';
  count: number;
  reachesOutput: boolean;
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
  mark?: Birth['kind']; // the worst birth of NaN/Inf in it
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

/** The view's tree; `births` undefined while they are not known (the run has not reached its end). */
export function timelineTree(timeline: TimelineBody, checkpoints: CheckpointEntry[], births?: Birth[]): TimelineItem[] {
  const { position, end, ticks } = timeline;
  const steps = timeline.steps ?? [];
  const here = ticks.find((t) => t.tick === position);
  const inStep = steps.length ? `step ${stepAt(steps, position)}, ` : '';
  const now: TimelineItem = {
    id: 'now',
    label: position >= end ? `Now: end of program (tick ${end})` : `Now: ${inStep}tick ${position} of ${end}`,
    description: here ? describeTick(here, steps.length > 0) : undefined,
    current: true,
  };
  return [
    now,
    ...(steps.length ? [stepsItem(steps, births, position, end)] : []),
    {
      id: 'checkpoints',
      label: `Checkpoints (${checkpoints.length})`,
      children: checkpoints.map((c) => checkpointItem(c, position)),
    },
    { id: 'ticks', label: 'Ticks around now', children: ticks.map((t) => tickItem(t, position, steps.length > 0)) },
  ];
}

/** The step `tick` belongs to: the last one starting at or before it (the end belongs to the last step). */
export function stepAt(steps: StepEntry[], tick: number): number {
  let lo = 0;
  for (let hi = steps.length - 1; lo < hi; ) {
    const mid = Math.ceil((lo + hi) / 2);
    [lo, hi] = steps[mid].tick <= tick ? [mid, hi] : [lo, mid - 1];
  }
  return steps[lo].step;
}

function stepsItem(steps: StepEntry[], births: Birth[] | undefined, position: number, end: number): TimelineItem {
  const born = new Map<number, Birth[]>();
  for (const b of births ?? []) {
    const step = stepAt(steps, b.tick);
    born.set(step, [...(born.get(step) ?? []), b]);
  }
  const marked = born.size ? `${born.size} with NaN/Inf born` : 'no NaN/Inf born';
  return {
    id: 'steps',
    label: `Steps (${steps.length})`,
    description: births ? marked : 'NaN/Inf births: once the run has reached its end',
    children: steps.map((s, i) => stepItem(s, steps[i + 1]?.tick ?? end + 1, born.get(s.step) ?? [], position)),
  };
}

function stepItem(s: StepEntry, next: number, born: Birth[], position: number): TimelineItem {
  return {
    id: `step-${s.step}`,
    label: `step ${s.step}`,
    description: [`tick ${s.tick}`, ...(born.length ? [birthSummary(born)] : [])].join(' · '),
    tooltip: [`Go to the start of step ${s.step} (tick ${s.tick}); its loss is the value ${s.loss}`, ...born.map(describeBirth)].join('\n'),
    current: s.tick <= position && position < next,
    mark: born.length ? (born.some((b) => b.kind === 'nan') ? 'nan' : 'inf') : undefined,
    action: gotoTick(s.tick),
  };
}

const KIND = { nan: 'NaN', inf: 'Inf' } as const;

function birthSummary(born: Birth[]): string {
  const kinds = (['nan', 'inf'] as const).filter((k) => born.some((b) => b.kind === k)).map((k) => KIND[k]);
  const shown = born.slice(0, 2).map((b) => b.node + (b.source ? ` (${basename(b.source)})` : ''));
  const more = born.length > shown.length ? ` +${born.length - shown.length} more` : '';
  return `${kinds.join(' and ')} born: ${shown.join(', ')}${more}`;
}

function describeBirth(b: Birth): string {
  const where = b.source ? ` at ${b.source}` : '';
  const fate = b.reachesOutput ? 'reaches an output' : 'absorbed downstream';
  return `${KIND[b.kind]} born at tick ${b.tick}: ${b.count} in ${b.value}, written by ${b.node} (${b.op})${where}; ${fate}`;
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

function tickItem(t: TickEntry, position: number, training: boolean): TimelineItem {
  return {
    id: `tick-${t.tick}`,
    label: `tick ${t.tick}`,
    description: (training ? `step ${t.step} · ` : '') + describeTick(t, training) + (t.executed ? '' : ' · not run yet'),
    tooltip: `Go to tick ${t.tick} (unit ${t.unit})`,
    current: t.tick === position,
    action: gotoTick(t.tick),
  };
}

function gotoTick(tick: number): Action {
  return { request: 'goto', args: { threadId: THREAD_ID, targetId: tick + 1 } };
}

/** What a tick does; in a training run, its phase first. */
export function describeTick(t: TickEntry, training = false): string {
  if (t.edit) {
    return `edit: ${t.edit}`;
  }
  const where = t.source ? ` · ${basename(t.source.file)}:${t.source.line}` : '';
  const module = t.module ? ` · ${t.module}` : '';
  return `${training ? `${t.phase} · ` : ''}${t.node} (${t.op})${module}${where}`;
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
