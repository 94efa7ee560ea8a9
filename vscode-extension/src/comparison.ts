// A value compared with the reference, as the adapter's comparisons describe it, in words.

export interface Comparison {
  value: string;
  dtype: string;
  error: number | string; // the worst element's error in units of its tolerance ("inf" in JSON)
  maxAbs: number | string;
  mismatches: number;
  nonfinite?: number; // NaN/Inf elements in this pass
  within: boolean;
}

/** The comparison of a value, naming it unless `node` (its writer) has the same name. */
export function describeComparison(c: Comparison, node?: string | null): string {
  return `${c.value === node ? '' : `${c.value} `}(${c.dtype}): ` +
    `${c.within ? 'within tolerance' : `${c.mismatches} elements beyond tolerance`}, ` +
    `worst ${number(c.error)}× tolerance, max |error| ${number(c.maxAbs)}`;
}

export function number(x: number | string): string {
  return typeof x === 'number' ? x.toPrecision(3) : x;
}
