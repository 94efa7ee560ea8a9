// The Rewind commands: what each asks the adapter, from what the user pointed at, and a plain-text
// report of the answers for the Rewind output channel.

import { Comparison, describeComparison, number } from './comparison';
import { DebugClient, ValueRef } from './dap';
import {
  addPatchArguments, ORIGINAL, PatchSpec, reportBranchComparison, reportListing, reportMeasurement, reportSuggestions, reportVerdict,
} from './experiments';
import { Location } from './tensorData';
import { formatBytes, TickEntry } from './timelineModel';

export const SHOW_TENSOR = 'rewind.showTensor';
export const TIMELINE_REFRESH = 'rewind.timeline.refresh';
export const TIMELINE_GO = 'rewind.timeline.go';

export interface CommandContext {
  value?: ValueRef; // a variable or a typed name
  path?: string; // where to save a trace
  line?: { file: string; line: number }; // an editor line (1-based)
  patch?: PatchSpec; // a patch to add
  branch?: string; // an experiment branch
  branches?: string[]; // experiment branches to compare
  patchRef?: { branch: string; name: string }; // a patch to remove
  fixes?: { text: string; name: string }[]; // fix files to try (none: the knowledge base's suggestions)
}

export interface Command {
  needs?: keyof CommandContext;
  run(client: DebugClient, ctx: CommandContext): Promise<string>;
}

export const COMMANDS: Record<string, Command> = {
  'rewind.locateTensor': {
    needs: 'value',
    run: async (client, ctx) => reportPlacement(await client.customRequest('locate', ctx.value)),
  },
  'rewind.showProvenance': {
    needs: 'value',
    run: async (client, ctx) => reportProvenance(await client.customRequest('provenance', ctx.value)),
  },
  'rewind.compareWithReference': {
    run: async (client) =>
      reportComparison(await client.customRequest('compareWithReference', {}), await client.customRequest('firstDivergence', {})),
  },
  'rewind.saveTrace': {
    needs: 'path',
    run: async (client, ctx) => reportTrace(await client.customRequest('saveTrace', { path: ctx.path })),
  },
  'rewind.ablatePrecision': {
    needs: 'line',
    run: async (client, ctx) => {
      const nodes = await nodesAtLine(client, ctx.line!.file, ctx.line!.line);
      return reportAblation((await client.customRequest('ablatePrecision', { nodes })).ablation);
    },
  },
  'rewind.addPatch': {
    needs: 'patch',
    run: async (client, ctx) => reportListing(await client.customRequest('addPatch', addPatchArguments(ctx.patch!))),
  },
  'rewind.listPatches': {
    run: async (client) => reportListing(await client.customRequest('listPatches', {})),
  },
  'rewind.removePatch': {
    needs: 'patchRef',
    run: async (client, ctx) => reportListing(await client.customRequest('removePatch', ctx.patchRef)),
  },
  'rewind.installBranch': {
    needs: 'branch',
    run: async (client, ctx) => reportListing(await client.customRequest('restoreBranch', { branch: ctx.branch })),
  },
  'rewind.undoPatches': {
    run: async (client) => reportListing(await client.customRequest('restoreBranch', { branch: ORIGINAL })),
  },
  'rewind.measureBranch': {
    needs: 'branch',
    run: async (client, ctx) => reportMeasurement(await client.customRequest('measureBranch', { branch: ctx.branch })),
  },
  'rewind.compareBranches': {
    needs: 'branches',
    run: async (client, ctx) => reportBranchComparison(await client.customRequest('compareBranches', { branches: ctx.branches })),
  },
  'rewind.repair': {
    needs: 'fixes',
    run: async (client, ctx) => reportVerdict(await client.customRequest('repair', { fixes: ctx.fixes })),
  },
  'rewind.suggestFixes': {
    run: async (client) => reportSuggestions(await client.customRequest('suggestFixes', {})),
  },
};

const NEEDS: Record<keyof CommandContext, string> = {
  value: 'a tensor: run it on a variable, or type a name',
  path: 'a file to save the trace to',
  line: 'an editor line of the program',
  patch: 'a patch: a node and what it does instead',
  branch: 'an experiment branch (Rewind: Add patch… makes one)',
  branches: 'the experiment branches to compare',
  patchRef: 'a patch of a branch (see Rewind: Show experiments)',
  fixes: 'the fix files to try (none: the knowledge base\'s suggestions)',
};

/** Run a Rewind command; its report. An error names what the command is missing. */
export async function runCommand(client: DebugClient, id: string, ctx: CommandContext): Promise<string> {
  const command = COMMANDS[id];
  if (!command) {
    throw new Error(`'${id}' is not a Rewind command that calls the adapter`);
  }
  if (command.needs && ctx[command.needs] === undefined) {
    throw new Error(`${id} needs ${NEEDS[command.needs]}`);
  }
  return command.run(client, ctx);
}

/** The nodes the line's first run executes itself (its innermost frame is the line). The adapter's
 * gotoTargets says where the line runs (tick + 1, at the line it binds to) or why it never does. */
export async function nodesAtLine(client: DebugClient, file: string, line: number): Promise<string[]> {
  const { targets } = await client.customRequest('gotoTargets', { source: { path: file }, line });
  const [first] = targets as { id: number; line: number }[];
  const { ticks }: { ticks: TickEntry[] } = await client.customRequest('timeline', { start: first.id - 1, count: 1000 });
  const here = (t: TickEntry) => t.node !== null && t.source?.file === file && t.source.line === first.line;
  const end = ticks.findIndex((t) => !here(t));
  const run = end < 0 ? ticks : ticks.slice(0, end);
  if (!run.length) {
    throw new Error(`${file}:${first.line} runs no node itself (it calls others): ablate a line inside the callee`);
  }
  return run.map((t) => t.node as string);
}

export function describeLocation(loc: Location): string {
  const strides = loc.strides.length ? ` strides [${loc.strides.join(', ')}]` : '';
  return `${loc.chip} · ${loc.space} · 0x${loc.address.toString(16)} · ${formatBytes(loc.nbytes)} · ` +
    `${loc.dtype}[${loc.shape.join(', ')}]${strides} · unit ${loc.unit}`;
}

function reportPlacement(body: { value: string; shards: Location[] }): string {
  const shards = body.shards.map((s, i) => `  ${body.shards.length > 1 ? `shard ${i}: ` : ''}${describeLocation(s)}`);
  return [`${body.value} lives at`, ...shards].join('\n');
}

interface Write {
  tick: number;
  unit: string;
  node: string | null;
  op: string | null;
  kind: string;
  source: { file: string; line: number } | null;
  stats: { min: number; max: number; mean: number; nan: number; inf: number } | null;  // null: a view's, see statsReason
  statsReason?: string;
}

function describeWrite(w: Write): string {
  const where = w.source ? ` at ${w.source.file}:${w.source.line}` : '';
  const s = w.stats;
  const bad = s && (s.nan || s.inf) ? ` · ${s.nan} NaN · ${s.inf} Inf` : '';
  return `tick ${w.tick}: ${w.op ?? 'user edit'} '${w.node ?? '-'}' (${w.kind}, unit ${w.unit})${where} · ` +
    (s ? `min ${s.min} · max ${s.max}${bad}` : `${w.statsReason}`);
}

function reportProvenance(body: any): string {
  const lines = [`${body.value}: ${body.kind} ${body.dtype}[${body.shape.join(', ')}]`];
  lines.push(body.lastWriter ? `  last written ${describeWrite(body.lastWriter)}` : '  not written before this tick');
  lines.push(`  writes (${body.history.length}):`, ...body.history.map((w: Write) => `    ${describeWrite(w)}`));
  const nodes = body.lineage.nodes.map((n: { name: string; op: string }) => `${n.name} (${n.op})`);
  lines.push(`  computed from ${nodes.length} nodes: ${nodes.join(' ← ')}`, `  roots: ${body.lineage.roots.join(', ')}`);
  return lines.join('\n');
}

const MAX_ROWS_REPORTED = 10;

function reportComparison(table: { reference: string; rows: (Comparison & TickEntry)[]; outputs: Comparison[] },
  first: { divergence: any }): string {
  const beyond = table.rows.filter((r) => !r.within).sort((a, b) => Number(b.error) - Number(a.error));
  const lines = [`against the reference ${table.reference}:`, '  outputs:', ...table.outputs.map((c) => `    ${describeComparison(c)}`)];
  lines.push(`  ${beyond.length} of ${table.rows.length} node outputs beyond tolerance${beyond.length ? ', worst first:' : ''}`);
  lines.push(...beyond.slice(0, MAX_ROWS_REPORTED).map((r) => `    tick ${r.tick} ${r.node} (${r.op}) at ${r.source} ${describeComparison(r, r.node)}`));
  const d = first.divergence;
  if (d) {
    lines.push(`  first divergence: tick ${d.tick} ${d.node} (${d.op}) at ${d.source.file}:${d.source.line} ${describeComparison(d.observed, d.node)}`);
    if (d.pattern) {
      lines.push(`    ${d.pattern.title}: ${d.pattern.reason}`, `    fix: ${d.pattern.fix}`);
    }
  }
  return lines.join('\n');
}

function reportTrace(body: { path: string; bytes: number; ticks: number }): string {
  return `saved ${body.ticks} ticks to ${body.path} (${formatBytes(body.bytes)})`;
}

function reportAblation(a: { nodes: { node: string; dtype: string }[]; before: Comparison[]; after: Comparison[]; fixed: boolean }): string {
  const nodes = a.nodes.map((n) => `${n.node} in ${n.dtype}`).join(', ');
  const lines = [`ran ${nodes}: the outputs are ${a.fixed ? 'within tolerance' : 'still beyond tolerance'}`];
  a.before.forEach((b, i) => lines.push(`  ${b.value}: ${number(b.error)}× tolerance before, ${number(a.after[i].error)}× after`));
  return lines.join('\n');
}
