// Colour scales of the Tensor view. Cells are coloured here, not in the webview, so the scale
// a test checks is the one the user sees.

export type RGB = [number, number, number];

// viridis, sampled at nine points: dark purple (low) to yellow (high), readable in grey.
export const SEQUENTIAL: RGB[] = [
  [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
];
// blue (reference higher) through grey (equal) to red (run higher).
export const DIVERGING: RGB[] = [[59, 76, 192], [221, 221, 221], [180, 4, 38]];
export const NAN_COLOUR: RGB = [255, 0, 255];
export const POS_INF_COLOUR: RGB = [255, 255, 255];
export const NEG_INF_COLOUR: RGB = [0, 0, 0];

/** The colour at t in [0, 1] (clamped) along `stops`, interpolated linearly. */
export function colourAt(stops: RGB[], t: number): RGB {
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  return stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f)) as RGB;
}

export interface Scale {
  stops: RGB[];
  lo: number;
  hi: number;
}

/** Sequential over the finite range of values; diverging and symmetric around 0 for differences. */
export function scaleFor(values: number[], diverging: boolean): Scale {
  const finite = values.filter(Number.isFinite);
  if (diverging) {
    const m = finite.reduce((a, v) => Math.max(a, Math.abs(v)), 0);
    return { stops: DIVERGING, lo: -m, hi: m };
  }
  const lo = finite.reduce((a, v) => Math.min(a, v), finite[0] ?? 0);
  const hi = finite.reduce((a, v) => Math.max(a, v), finite[0] ?? 0);
  return { stops: SEQUENTIAL, lo, hi };
}

export function colourOf(value: number, scale: Scale): RGB {
  if (Number.isNaN(value)) {
    return NAN_COLOUR;
  }
  if (!Number.isFinite(value)) {
    return value > 0 ? POS_INF_COLOUR : NEG_INF_COLOUR;
  }
  return colourAt(scale.stops, scale.hi > scale.lo ? (value - scale.lo) / (scale.hi - scale.lo) : 0.5);
}
