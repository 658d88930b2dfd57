/**
 * Pure geometry of the history charts: stacked areas of memory (or tokens/s)
 * by model over the window, and a line for GPU utilization. SVG path strings
 * in a `width` x `height` box, y down. No DOM: Jest tests them as functions.
 */
import { IHistory, IHistorySample } from './types';

/** One point of a stacked series: its time and a value per model. */
export interface IStackPoint {
  t: number;
  values: Record<string, number>;
}

export interface IArea {
  model: string;
  d: string;
}

export interface IBox {
  width: number;
  height: number;
  /** The window's start and end (unix seconds): x = 0 and x = width. */
  t0: number;
  t1: number;
  /** The value at the top of the box. */
  max: number;
}

function x(box: IBox, t: number): number {
  const span = box.t1 - box.t0;
  const at = span > 0 ? ((t - box.t0) / span) * box.width : box.width;
  return Math.min(box.width, Math.max(0, at));
}

function y(box: IBox, value: number): number {
  const at = box.max > 0 ? box.height - (value / box.max) * box.height : box.height;
  return Math.min(box.height, Math.max(0, at));
}

function fmt(n: number): string {
  return (Math.round(n * 10) / 10).toString();
}

/** Models in the order they stack (bottom first): by total over the series, largest first. */
export function stackOrder(points: IStackPoint[]): string[] {
  const totals = new Map<string, number>();
  for (const p of points) {
    for (const [model, v] of Object.entries(p.values)) {
      totals.set(model, (totals.get(model) ?? 0) + v);
    }
  }
  return Array.from(totals.entries())
    .filter(([, v]) => v > 0)
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .map(([model]) => model);
}

/** The largest stacked total of any point (the chart's natural top). */
export function stackPeak(points: IStackPoint[]): number {
  return points.reduce(
    (peak, p) =>
      Math.max(
        peak,
        Object.values(p.values).reduce((a, b) => a + b, 0)
      ),
    0
  );
}

/** One closed area per model in `order`, stacked bottom-up; empty with no points. */
export function stackAreas(points: IStackPoint[], order: string[], box: IBox): IArea[] {
  if (!points.length) {
    return [];
  }
  const below = points.map(() => 0);
  return order.map(model => {
    const lower = below.slice();
    const upper = points.map((p, i) => (below[i] += p.values[model] ?? 0));
    const top = points.map((p, i) => `${fmt(x(box, p.t))},${fmt(y(box, upper[i]))}`);
    const bottom = points.map((p, i) => `${fmt(x(box, p.t))},${fmt(y(box, lower[i]))}`).reverse();
    return { model, d: `M${top.join('L')}L${bottom.join('L')}Z` };
  });
}

/** A polyline through (t, value) points; "" with none. */
export function linePath(points: { t: number; value: number }[], box: IBox): string {
  return points.length
    ? `M${points.map(p => `${fmt(x(box, p.t))},${fmt(y(box, p.value))}`).join('L')}`
    : '';
}

/** A device's memory by model over the samples. */
export function memorySeries(samples: IHistorySample[], device: string): IStackPoint[] {
  return samples.map(s => ({ t: s.t, values: s.memory[device] ?? {} }));
}

export function tokenSeries(samples: IHistorySample[]): IStackPoint[] {
  return samples.map(s => ({ t: s.t, values: s.tokens_per_second }));
}

/** The device's utilization where samples report it. */
export function utilizationSeries(
  samples: IHistorySample[],
  device: string
): { t: number; value: number }[] {
  return samples
    .filter(s => typeof s.utilization[device] === 'number')
    .map(s => ({ t: s.t, value: s.utilization[device] }));
}

/** The shortest span a chart shows, so a young history is not a sliver at the right. */
export const MIN_SPAN = 60;

/**
 * The span the charts show, up to the newest sample: the whole window once
 * the server has sampled that long, else from the oldest sample (at least
 * `MIN_SPAN` seconds).
 */
export function windowOf(history: IHistory): { t0: number; t1: number } {
  const samples = history.samples;
  if (!samples.length) {
    return { t0: -history.window, t1: 0 };
  }
  const last = samples[samples.length - 1].t;
  const t0 = Math.max(samples[0].t, last - history.window);
  return { t0: Math.min(t0, last - MIN_SPAN), t1: last };
}

/** "−10 min", "−90 s": how far back a chart's left edge is. */
export function spanLabel(seconds: number): string {
  return seconds >= 120 ? `−${Math.round(seconds / 60)} min` : `−${Math.round(seconds)} s`;
}

/**
 * Each model's colour index: its position in `/api/ps` (as the bars colour
 * it), then models no longer loaded in the order they first appear.
 */
export function colourIndex(loaded: string[], seen: string[]): Map<string, number> {
  const index = new Map<string, number>();
  loaded.forEach((name, i) => index.set(name, i));
  for (const name of seen) {
    if (!index.has(name)) {
      index.set(name, index.size);
    }
  }
  return index;
}
