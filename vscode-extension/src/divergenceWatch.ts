// Where the pass first left its reference, as the Timeline view knows it: the last `firstDivergence` answer the
// adapter gave this session (Rewind: Compare with reference asks for it), heard in the adapter's messages, since
// asking again on every stop would run the reference pass the user did not ask for. A request that changes what the
// pass computes makes that answer stale: it is forgotten until the next one.

/** A divergence as `firstDivergence` finds it (docs/protocol.md), the fields the view shows. */
export interface Divergence {
  tick: number;
  node: string;
  op: string;
  source: { file: string; line: number } | null;
  value: string;
  count: number;
  pattern: { title: string; fix: string } | null;
  headline?: string; // with an origin
  origin: { node: string; op: string; source: string | null; tick: number } | null;
  originReason?: string;
}

/** The body of a `firstDivergence` response. */
export interface FirstDivergence {
  reference: string;
  divergence: Divergence | null;
  divergenceReason?: string; // why there is none
}

/** Requests after which the pass computes something else: patches, branches, edits of values, a restart. */
const CHANGES_THE_PASS = new Set([
  'addPatch', 'removePatch', 'restoreBranch', 'measureBranch', 'compareBranches', 'repair', 'setVariable', 'writeMemory',
  'restart',
]);

interface Message {
  type: string;
  command?: string;
  success?: boolean;
  body?: unknown;
}

export class DivergenceWatch {
  known: FirstDivergence | undefined;

  /** Follow a message the adapter sent; true when what is known changed. */
  heard(m: Message): boolean {
    if (m.type !== 'response' || !m.success) {
      return false;
    }
    if (m.command === 'firstDivergence') {
      this.known = m.body as FirstDivergence;
      return true;
    }
    if (this.known && CHANGES_THE_PASS.has(m.command ?? '')) {
      this.known = undefined;
      return true;
    }
    return false;
  }
}
