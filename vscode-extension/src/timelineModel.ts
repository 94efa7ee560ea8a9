// The Rewind Timeline view as data: the current tick, a training run's steps (click: go to the step's start; marked
// where a NaN or Inf was born), each birth of NaN/Inf (click: go to its tick), where the pass started to diverge from
// its reference once forensics found it (click: go there), the checkpoints (click: restore) and the ticks around now
// (click: go there; marked as births and the divergence are), built from the adapter's `timeline`, `timelineEvents`,
// `checkpoints` and `firstDivergence` answers. An inference pass has no steps: its view shows nothing of them.

import { Divergence, FirstDivergence } from './divergenceWatch';

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

/** What an item is marked with: a NaN or an Inf born there (the worst of them), or the divergence starting there. */
export type Mark = Birth['kind'] | 'divergence';

export interface TimelineItem {
  id: string;
  label: string;
  description?: string;
  tooltip?: string;
  current?: boolean;
  mark?: Mark;
  action?: Action;
  children?: TimelineItem[];
}

export const TICKS_AROUND = 8;
export const MAX_BIRTHS_SHOWN = 100;
const THREAD_ID = 1;

/** The window of ticks the view shows around `position`: the `timeline` request's arguments. */
export function tickWindow(position: number): { start: number; count: number } {
  const start = Math.max(0, position - TICKS_AROUND);
  return { start, count: position - start + TICKS_AROUND + 1 };
}

/** The view's tree; `births` undefined while they are not known (the run has not reached its end), `divergence`
 * while forensics has not looked for it. */
export function timelineTree(timeline: TimelineBody, checkpoints: CheckpointEntry[], births?: Birth[],
  divergence?: FirstDivergence): TimelineItem[] {
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
  const marks = marksByTick(births ?? [], divergence?.divergence ?? null);
  return [
    now,
    ...(steps.length ? [stepsItem(steps, births, position, end)] : []),
    birthsItem(births, position),
    divergenceItem(divergence, position),
    {
      id: 'checkpoints',
      label: `Checkpoints (${checkpoints.length})`,
      children: checkpoints.map((c) => checkpointItem(c, position)),
    },
    { id: 'ticks', label: 'Ticks around now', children: ticks.map((t) => tickItem(t, position, steps.length > 0, marks.get(t.tick))) },
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

function birthsItem(births: Birth[] | undefined, position: number): TimelineItem {
  if (!births) {
    return { id: 'births', label: 'NaN/Inf born', description: 'known once the run has reached its end' };
  }
  const more = births.length - MAX_BIRTHS_SHOWN;
  return {
    id: 'births',
    label: `NaN/Inf born (${births.length})`,
    description: births.length ? undefined : 'none in this run',
    children: [
      ...births.slice(0, MAX_BIRTHS_SHOWN).map((b) => birthItem(b, position)),
      ...(more > 0 ? [{ id: 'births-more', label: `+${more} more`, description: 'the debug console\'s timeline command lists them all' }] : []),
    ],
  };
}

function birthItem(b: Birth, position: number): TimelineItem {
  return {
    id: `birth-${b.tick}-${b.value}`,
    label: `tick ${b.tick}`,
    description: `${KIND[b.kind]} in ${b.value}${b.source ? ` · ${basename(b.source)}` : ''}`,
    tooltip: `${describeBirth(b)}\nGo to tick ${b.tick}, where ${b.node} is about to write it`,
    current: b.tick === position,
    mark: b.kind,
    action: gotoTick(b.tick),
  };
}

function divergenceItem(answer: FirstDivergence | undefined, position: number): TimelineItem {
  if (!answer) {
    return { id: 'divergence', label: 'Divergence: not looked for', description: 'Rewind: Compare with reference finds where it started' };
  }
  const d = answer.divergence;
  if (!d) {
    return { id: 'divergence', label: 'No divergence', description: `from ${answer.reference}`, tooltip: answer.divergenceReason };
  }
  const origin = d.origin && d.origin.tick !== d.tick ? [originItem(d.origin, position)] : [];
  return {
    id: 'divergence',
    label: `Divergence started: tick ${d.tick}`,
    description: `${d.node}${d.source ? ` · ${basename(d.source.file)}:${d.source.line}` : ''}`,
    tooltip: [...(d.headline ? [d.headline] : []), describeDivergence(d, answer.reference),
      ...(d.pattern ? [`${d.pattern.title}; fix: ${d.pattern.fix}`] : []), `Go to tick ${d.tick}, where ${d.node} is about to run`].join('\n'),
    current: d.tick === position,
    mark: 'divergence',
    action: gotoTick(d.tick),
    ...(origin.length ? { children: origin } : {}),
  };
}

function originItem(o: NonNullable<Divergence['origin']>, position: number): TimelineItem {
  return {
    id: 'divergence-origin',
    label: `error introduced: tick ${o.tick}`,
    description: `${o.node}${o.source ? ` · ${basename(o.source)}` : ''}`,
    tooltip: `${o.node} (${o.op})${o.source ? ` at ${o.source}` : ''} introduced the error the divergence grew from\nGo to tick ${o.tick}`,
    current: o.tick === position,
    action: gotoTick(o.tick),
  };
}

function describeDivergence(d: Divergence, reference: string): string {
  const where = d.source ? ` at ${d.source.file}:${d.source.line}` : '';
  return `${d.count} elements of ${d.value} beyond tolerance of ${reference}, written by ${d.node} (${d.op})${where}`;
}

/** Each tick's mark: a NaN born there, else an Inf, else the divergence starting there. */
function marksByTick(births: Birth[], divergence: Divergence | null): Map<number, { mark: Mark; why: string }> {
  const marks = new Map<number, { mark: Mark; why: string }>();
  if (divergence) {
    marks.set(divergence.tick, { mark: 'divergence', why: `the divergence from the reference starts here (${divergence.node})` });
  }
  for (const kind of ['inf', 'nan'] as const) {
    births.filter((b) => b.kind === kind).forEach((b) => marks.set(b.tick, { mark: kind, why: describeBirth(b) }));
  }
  return marks;
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

function tickItem(t: TickEntry, position: number, training: boolean, marked?: { mark: Mark; why: string }): TimelineItem {
  return {
    id: `tick-${t.tick}`,
    label: `tick ${t.tick}`,
    description: (training ? `step ${t.step} · ` : '') + describeTick(t, training) + (t.executed ? '' : ' · not run yet'),
    tooltip: `Go to tick ${t.tick} (unit ${t.unit})${marked ? `\n${marked.why}` : ''}`,
    current: t.tick === position,
    mark: marked?.mark,
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
