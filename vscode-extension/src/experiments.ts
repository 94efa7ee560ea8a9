// Experiments through the adapter (docs/protocol.md, "Experiments and the repair loop"): the addPatch
// arguments a user's choices make, what there is to choose from, and plain-text reports of the
// experiment and repair requests' answers for the Rewind output channel.

import { Comparison, number } from './comparison';
import { DebugClient } from './dap';
import { TickEntry } from './timelineModel';

export const PATCH_KINDS = {
  precision: 'run the node at another dtype',
  function: 'a Python function in place of the op',
  attributes: 'the op with other attributes (eps=1e-3)',
  edit: 'one element of a node\'s output set to a number',
} as const;
export type PatchKind = keyof typeof PATCH_KINDS;
export const DTYPES = ['float64', 'float32', 'float16', 'bfloat16'];
export const ORIGINAL = 'original'; // the recorded pass
export const DEFAULT_BRANCH = 'experiment'; // the adapter's default

/** A patch as the user chose it; `node` names a node, an op or a module path. */
export interface PatchSpec {
  kind: PatchKind;
  node?: string; // precision, function, attributes
  dtype?: string; // precision
  source?: { text: string; file: string }; // function: Python defining it
  entry?: string; // function: which one, when the text defines several
  attributes?: string; // attributes: "eps=1e-3, elementwise_affine=false"
  edit?: string; // edit: "div[0, 1, 2] = 0"
  name?: string; // default: defaultPatchName
  branch?: string; // default: the adapter's
}

/** The addPatch arguments for `spec`; an Error names what is missing or malformed. */
export function addPatchArguments(spec: PatchSpec): Record<string, unknown> {
  const name = spec.name || defaultPatchName(spec);
  return { name, ...(spec.branch ? { branch: spec.branch } : {}), ...change(spec) };
}

function change(spec: PatchSpec): Record<string, unknown> {
  if (spec.kind === 'edit') {
    return { edit: parseEdit(spec.edit ?? '') };
  }
  if (!spec.node) {
    throw new Error(`a ${spec.kind} patch needs the node to patch (a node name, an op or a module path)`);
  }
  if (spec.kind === 'precision') {
    if (!DTYPES.includes(spec.dtype ?? '')) {
      throw new Error(`a precision patch runs the node at one of ${DTYPES.join(', ')}, got '${spec.dtype ?? ''}'`);
    }
    return { node: spec.node, precision: spec.dtype };
  }
  if (spec.kind === 'function') {
    if (!spec.source) {
      throw new Error('a function patch needs the Python file that defines the function');
    }
    return { node: spec.node, function: spec.source.text, ...(spec.entry ? { entry: spec.entry } : {}) };
  }
  return { node: spec.node, attributes: parseAttributes(spec.attributes ?? '') };
}

/** The name a patch gets unless the user gives one: what it patches and how (as the console names it). */
export function defaultPatchName(spec: PatchSpec): string {
  switch (spec.kind) {
    case 'precision':
      return `${spec.node}-${spec.dtype}`;
    case 'function':
      return `${spec.node}-${spec.entry || fileName(spec.source?.file ?? 'function').replace(/\.py$/, '')}`;
    case 'attributes':
      return `${spec.node}-${Object.keys(parseAttributes(spec.attributes ?? '')).join('-')}`;
    case 'edit': {
      const edit = parseEdit(spec.edit ?? '');
      return `${edit.value}[${edit.index.join(',')}]`;
    }
  }
}

/** `eps=1e-3, elementwise_affine=false` as attributes; each value is JSON (numbers, true, "text", [1, 2]). */
export function parseAttributes(text: string): Record<string, unknown> {
  const pairs = text.split(/[,\s]+(?=[A-Za-z_]\w*\s*=)/).map((p) => p.trim()).filter(Boolean);
  if (!pairs.length) {
    throw new Error('give the attributes to change as NAME=VALUE, e.g. eps=1e-3');
  }
  return Object.fromEntries(pairs.map((pair) => {
    const match = /^([A-Za-z_]\w*)\s*=\s*(.+)$/.exec(pair.replace(/,$/, ''));
    if (!match) {
      throw new Error(`'${pair}' is not NAME=VALUE`);
    }
    try {
      return [match[1], JSON.parse(match[2])];
    } catch {
      throw new Error(`${match[1]}=${match[2]}: the value is not JSON (a number, true, "text", [1, 2])`);
    }
  }));
}

/** `div[0, 1, 2] = 0` as an edit: the value, the element's index and the number it is set to. */
export function parseEdit(text: string): { value: string; index: number[]; set: number } {
  const match = /^\s*([\w.]+)\[([\d,\s]*)\]\s*=\s*(\S+)\s*$/.exec(text);
  if (!match) {
    throw new Error(`'${text}' is not VALUE[I, J, ...] = NUMBER, e.g. div[0, 1, 2] = 0`);
  }
  const set = Number(match[3]);
  if (!Number.isFinite(set)) {
    throw new Error(`an edit sets a finite number (DAP's JSON has none for NaN or Infinity), got '${match[3]}'`);
  }
  return { value: match[1], index: match[2].split(',').filter((i) => i.trim()).map(Number), set };
}

function fileName(path: string): string {
  return path.split(/[\\/]/).pop()!;
}

// -- what there is to choose from ---------------------------------------------------------------------------

export interface PatchTarget {
  name: string; // what addPatch's `node` gets
  detail: string; // op and source line, or how many nodes a module path names
}

const MAX_TIMELINE_TICKS = 10_000; // the adapter's limit per timeline request

/** The nodes the pass runs (in order) and then the module paths that name several of them. */
export async function patchTargets(client: DebugClient): Promise<PatchTarget[]> {
  const nodes = new Map<string, TickEntry>();
  const modules = new Map<string, number>();
  for (let start = 0, end = 1; start < end; start += MAX_TIMELINE_TICKS) {
    const window: { end: number; ticks: TickEntry[] } = await client.customRequest('timeline', { start, count: MAX_TIMELINE_TICKS });
    end = window.end;
    for (const t of window.ticks.filter((t) => t.node !== null && !nodes.has(t.node))) {
      nodes.set(t.node as string, t);
      for (const path of modulePaths(t.module)) {
        modules.set(path, (modules.get(path) ?? 0) + 1);
      }
    }
  }
  const where = (t: TickEntry) => (t.source ? ` at ${fileName(t.source.file)}:${t.source.line}` : '');
  return [...[...nodes].map(([name, t]) => ({ name, detail: `${t.op}${where(t)}, tick ${t.tick}` })),
    ...[...modules].filter(([, n]) => n > 1).map(([name, n]) => ({ name, detail: `module: ${n} nodes` }))];
}

/** `blocks.0.attn` and the modules it is inside: `blocks.0`, `blocks` (not the root). */
function modulePaths(module: string | null | undefined): string[] {
  const parts = module && module !== '<root>' ? module.split('.') : [];
  return parts.map((_, i) => parts.slice(0, i + 1).join('.'));
}

export interface Listing {
  active: string;
  branches: { name: string; tick: number; patches: PatchEntry[] }[];
}

interface PatchEntry {
  name: string;
  kind: string;
  description: string;
  nodes: { node: string; op: string; tick: number; source: string | null }[];
}

export function branchNames(listing: Listing): string[] {
  return listing.branches.map((b) => b.name);
}

export function patchRefs(listing: Listing): { branch: string; name: string; description: string }[] {
  return listing.branches.flatMap((b) => b.patches.map((p) => ({ branch: b.name, name: p.name, description: describePatch(p) })));
}

// -- reports ------------------------------------------------------------------------------------------------

/** The branches and their patches, `*` marking the installed one. */
export function reportListing(listing: Listing): string {
  const mark = (name: string) => (name === listing.active ? '*' : ' ');
  const lines = [`${mark(ORIGINAL)} ${ORIGINAL} (the recorded pass)`];
  for (const b of listing.branches) {
    lines.push(`${mark(b.name)} ${b.name}, patched from tick ${b.tick}`, ...b.patches.map((p) => `    ${p.name}: ${describePatch(p)}`));
  }
  return lines.join('\n');
}

function describePatch(p: PatchEntry): string {
  const nodes = p.nodes.map((n) => `${n.node} (tick ${n.tick}${n.source ? `, ${fileName(n.source)}` : ''})`);
  const more = nodes.length > 3 ? ` and ${nodes.length - 3} more` : '';
  return `${nodes.slice(0, 3).join(', ')}${more} ${p.description}`;
}

interface Measurement {
  branch: string;
  tick: number;
  outputs: { value: string; reference: Comparison; original: Comparison; originalReference: Comparison }[];
  nodes: { tick: number; node: string; op: string; patch: string | null; error: number | string; originalError: number | string;
    seconds: number | null; originalSeconds: number | null }[];
  seconds: number;
  originalSeconds: number;
}

export function reportMeasurement(m: Measurement): string {
  const lines = [`branch ${m.branch}, patched from tick ${m.tick} (errors in units of tolerance)`,
    ...table(['output', 'vs reference', 'original vs reference', 'vs original'],
      m.outputs.map((o) => [o.value, verdict(o.reference), verdict(o.originalReference), verdict(o.original)]))];
  if (m.nodes.length) {
    lines.push(`nodes from tick ${m.tick} against the reference (* patched):`, ...table(
      ['tick', 'node', 'op', 'error', 'original', 'time', 'original'],
      m.nodes.map((n) => [String(n.tick), n.node + (n.patch ? '*' : ''), n.op, number(n.error), number(n.originalError),
        time(n.seconds), time(n.originalSeconds)])));
  }
  lines.push(`time from tick ${m.tick}: ${time(m.seconds)} (original ${time(m.originalSeconds)})`);
  return lines.join('\n');
}

interface BranchComparison {
  branches: string[];
  outputs: { value: string; original: Comparison; branches: Record<string, { reference: Comparison }> }[];
  nodes: { tick: number; node: string; op: string; original: { error: number | string };
    branches: Record<string, { error: number | string; patch: string | null }> }[];
  seconds: Record<string, number>;
}

export function reportBranchComparison(c: BranchComparison): string {
  const cell = (row?: { error: number | string; patch: string | null }) => (row ? number(row.error) + (row.patch ? '*' : '') : '-');
  return ['outputs against the reference (errors in units of tolerance):',
    ...table(['output', ORIGINAL, ...c.branches],
      c.outputs.map((o) => [o.value, verdict(o.original), ...c.branches.map((b) => verdict(o.branches[b].reference))])),
    'nodes against the reference (* the branch patches it):',
    ...table(['tick', 'node', 'op', ORIGINAL, ...c.branches],
      c.nodes.map((n) => [String(n.tick), n.node, n.op, number(n.original.error), ...c.branches.map((b) => cell(n.branches[b]))])),
    `time from the patch point: ${c.branches.map((b) => `${b} ${time(c.seconds[b])}`).join(', ')}`].join('\n');
}

interface Finding {
  kind: string;
  node: string;
  op: string;
  source: { file: string; line: number } | null;
  pattern: { pattern: string } | null;
}

function describeFinding(f: Finding): string {
  const where = f.source ? `${fileName(f.source.file)}:${f.source.line}` : 'no source line';
  return `${f.kind} at ${where}, node ${f.node} (${f.op}): ${f.pattern?.pattern ?? 'no known pattern'}`;
}

interface Verdict {
  verdict: string;
  reason: string;
  findings: Finding[];
  attempts: { candidate: { name: string }; verdict: string; reason: string; integrity: { violations: { what: string; line: number }[] };
    validation: { checks: { inputs: { name: string }; within: boolean; error: string | null; outputs: Comparison[] }[] } | null }[];
  knowledge: { path: string; recorded: { pattern: string; name: string; validations: number } | null };
}

/** The repair loop's verdict and its evidence, as `rewind repair` prints it. */
export function reportVerdict(v: Verdict): string {
  const lines = v.findings.map((f) => `finding: ${describeFinding(f)}`);
  v.attempts.forEach((a, i) => {
    lines.push(`attempt ${i + 1}: ${a.candidate.name}: ${a.verdict.toUpperCase()}: ${a.reason}`,
      ...a.integrity.violations.map((x) => `  refused: ${x.what} (line ${x.line})`),
      ...(a.validation?.checks ?? []).map((c) => `  ${c.inputs.name}: ${c.within ? 'ok' : 'FAILED'} (${c.error ??
        `worst output error ${number(worst(c.outputs))}× tolerance`})`));
  });
  const r = v.knowledge.recorded;
  if (r) {
    lines.push(`recorded in the knowledge base (${v.knowledge.path}): ${r.pattern} → ${r.name} (validated ${r.validations} time(s))`);
  }
  lines.push(`verdict: ${v.verdict}: ${v.reason}`);
  return lines.join('\n');
}

function worst(outputs: Comparison[]): number | string {
  const size = (x: number | string) => (typeof x === 'number' ? x : Infinity); // "inf" or "nan" in JSON
  return outputs.map((o) => o.error).reduce((a, b) => (size(b) > size(a) ? b : a), 0);
}

interface Suggestions {
  findings: Finding[];
  suggestions: { finding: string; name: string; origin: string; note: string; patches: { node: string; description: string }[] }[];
}

export function reportSuggestions(s: Suggestions): string {
  if (!s.findings.length) {
    return 'no findings: no NaN/Inf, no divergence from the reference';
  }
  const lines = s.findings.map((f) => `finding: ${describeFinding(f)}`);
  lines.push(...s.suggestions.map((x) => `suggested for ${x.finding}: ${x.name} (${x.origin}${x.note ? `, ${x.note}` : ''}): ` +
    x.patches.map((p) => `${p.node} ${p.description}`).join('; ')));
  if (!s.suggestions.length) {
    lines.push('no suggestions for these findings (Rewind: Repair… tries a fix file of yours)');
  }
  return lines.join('\n');
}

function verdict(c: Comparison): string {
  return `${c.within ? 'within' : `${c.mismatches} beyond`} (${number(c.error)})${c.nonfinite ? `, ${c.nonfinite} NaN/Inf` : ''}`;
}

function time(seconds: number | null): string {
  if (seconds === null) {
    return '-';
  }
  return seconds < 1e-3 ? `${Math.round(seconds * 1e6)} µs` : seconds < 1 ? `${(seconds * 1e3).toPrecision(3)} ms` : `${seconds.toPrecision(3)} s`;
}

/** Lines of `rows` under `header`, each column as wide as its widest cell. */
export function table(header: string[], rows: string[][]): string[] {
  const widths = header.map((_, i) => Math.max(...[header, ...rows].map((r) => r[i].length)));
  return [header, ...rows].map((r) => `  ${r.map((cell, i) => cell.padEnd(widths[i])).join('  ')}`.trimEnd());
}
