/**
 * The sidebar's history section: per device, memory by model over the last
 * ten minutes as a small stacked chart (with GPU utilization as a line where
 * the server reports it), and tokens/s over the same window. Drawn as SVG
 * from `GET /api/history`; plain DOM, so Jest renders it in jsdom.
 */
import { formatBytes } from './format';
import {
  colourIndex,
  IBox,
  IStackPoint,
  linePath,
  spanLabel,
  memorySeries,
  stackAreas,
  stackOrder,
  stackPeak,
  tokenSeries,
  utilizationSeries,
  windowOf
} from './history_chart';
import { IHistory } from './types';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 44;
const COLOURS = 6; // as the bars' .jp-LLM-colour-N
const OTHER = 'other';

function el(tag: string, className: string, text?: string): HTMLElement {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function svg(tag: string, attributes: Record<string, string>): SVGElement {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) {
    node.setAttribute(k, v);
  }
  return node;
}

function rate(n: number): string {
  return n >= 100 ? n.toFixed(0) : n.toFixed(1);
}

/** What one chart shows, worked out before any DOM is touched. */
interface IChartSpec {
  key: string; // "memory:<device>" or "tokens"
  kind: 'memory' | 'tokens';
  device: string;
  title: string;
  now: string;
  scale: string;
  box: IBox;
  series: IStackPoint[];
  order: string[];
  utilization: string; // the line's path ("" without one)
}

/** Per device a memory chart (system RAM only when a model held some), then tokens/s. */
function chartSpecs(history: IHistory): IChartSpec[] {
  const samples = history.samples;
  const { t0, t1 } = windowOf(history);
  const specs: IChartSpec[] = [];
  for (const device of history.devices) {
    const series = memorySeries(samples, device.id);
    const order = stackOrder(series);
    if (device.library === 'CPU' && !order.length) {
      continue;
    }
    const util = utilizationSeries(samples, device.id);
    const peak = stackPeak(series);
    const box = { width: WIDTH, height: HEIGHT, t0, t1, max: peak * 1.15 };
    specs.push({
      key: `memory:${device.id}`,
      kind: 'memory',
      device: device.id,
      title: device.library === 'CPU' ? 'System RAM' : device.name || device.id,
      now: util.length ? `GPU ${Math.round(util[util.length - 1].value)}%` : '',
      scale: `peak ${formatBytes(peak)} of ${formatBytes(device.total_memory)}`,
      box,
      series,
      order,
      utilization: util.length ? linePath(util, { ...box, max: 100 }) : ''
    });
  }
  const series = tokenSeries(samples);
  const last = samples.length ? samples[samples.length - 1].tokens_per_second : {};
  const peak = stackPeak(series);
  specs.push({
    key: 'tokens',
    kind: 'tokens',
    device: '',
    title: 'Tokens/s',
    now: `${rate(Object.values(last).reduce((a, b) => a + b, 0))} now`,
    scale: `peak ${rate(peak)} tokens/s`,
    box: { width: WIDTH, height: HEIGHT, t0, t1, max: Math.max(1, peak * 1.15) },
    series,
    order: stackOrder(series),
    utilization: ''
  });
  return specs;
}

export class HistoryView {
  readonly node: HTMLElement;
  private empty: HTMLElement;
  private charts: HTMLElement;
  private legend: HTMLElement;
  private loaded: string[] = [];
  private shown: IHistory | undefined;

  constructor() {
    this.node = el('section', 'jp-LLM-history');
    this.empty = el('p', 'jp-LLM-empty jp-LLM-history-empty', 'Collecting the history…');
    this.charts = el('div', 'jp-LLM-history-charts');
    this.legend = el('div', 'jp-LLM-legend jp-LLM-history-legend');
    this.node.append(
      el('h3', 'jp-LLM-heading', 'History (last 10 minutes)'),
      this.empty,
      this.charts,
      this.legend
    );
    this.node.hidden = true;
  }

  /** The loaded models' names in `/api/ps` order: they keep the bars' colours. */
  setLoaded(names: string[]): void {
    this.loaded = names;
    if (this.shown) {
      this.update(this.shown);
    }
  }

  update(history: IHistory): void {
    this.shown = history;
    this.node.hidden = false;
    const minutes = Math.round(history.window / 60);
    this.node.querySelector('h3')!.textContent = `History (last ${minutes} minutes)`;
    const samples = history.samples;
    this.empty.hidden = samples.length > 1;
    this.empty.textContent = history.sampling
      ? 'Collecting the history…'
      : 'The server is not sampling a history.';
    const specs = chartSpecs(history);
    const index = colourIndex(
      this.loaded,
      specs.flatMap(spec => spec.order)
    );
    const nodes = specs.map(spec => this.draw(spec, index));
    const current = Array.from(this.charts.children);
    if (nodes.length !== current.length || nodes.some((n, i) => n !== current[i])) {
      this.charts.replaceChildren(...nodes); // only when charts come or go: hovers stay put
    }
    const used = new Set(specs.flatMap(spec => spec.order));
    this.legend.replaceChildren(
      ...Array.from(index.keys())
        .filter(name => used.has(name))
        .map(name => {
          const item = el('span', 'jp-LLM-legend-item');
          item.append(el('span', `jp-LLM-swatch ${this.colourClass(name, index)}`), name);
          return item;
        })
    );
  }

  /** The chart for `spec`, kept from the last poll when there was one (keyed by `spec.key`). */
  private draw(spec: IChartSpec, index: Map<string, number>): HTMLElement {
    let node = Array.from(this.charts.children).find(
      c => (c as HTMLElement).dataset.key === spec.key
    ) as HTMLElement | undefined;
    if (!node) {
      node = el('div', `jp-LLM-history-chart jp-LLM-history-${spec.kind}`);
      node.dataset.key = spec.key;
      if (spec.device) {
        node.dataset.device = spec.device;
      }
      const head = el('div', 'jp-LLM-row-head');
      head.append(el('span', 'jp-LLM-device-name'), el('span', 'jp-LLM-history-now'));
      const chart = svg('svg', {
        class: 'jp-LLM-chart',
        viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
        preserveAspectRatio: 'none',
        role: 'img'
      });
      const foot = el('div', 'jp-LLM-row-foot');
      foot.append(el('span', 'jp-LLM-subtitle'), el('span', 'jp-LLM-history-scale'));
      node.append(head, chart, foot);
    }
    const span = spanLabel(spec.box.t1 - spec.box.t0);
    node.querySelector('.jp-LLM-device-name')!.textContent = spec.title;
    node.querySelector('.jp-LLM-history-now')!.textContent = spec.now;
    node.querySelector('.jp-LLM-subtitle')!.textContent = span;
    node.querySelector('.jp-LLM-history-scale')!.textContent = spec.scale;
    const chart = node.querySelector('svg')!;
    chart.setAttribute('aria-label', `${spec.title}, from ${span} to now`);
    this.drawAreas(chart, spec, index);
    let line = chart.querySelector('.jp-LLM-history-utilization');
    if (spec.utilization && !line) {
      line = svg('path', { class: 'jp-LLM-history-utilization' });
    }
    if (line && spec.utilization) {
      line.setAttribute('d', spec.utilization);
      chart.append(line); // drawn over the areas
    } else {
      line?.remove();
    }
    return node;
  }

  /** One path per model, updated in place (a tooltip under the pointer stays). */
  private drawAreas(chart: Element, spec: IChartSpec, index: Map<string, number>): void {
    const stale = new Map<string, SVGElement>();
    for (const path of Array.from(chart.querySelectorAll('path.jp-LLM-history-area'))) {
      stale.set((path as SVGElement).dataset.model ?? '', path as SVGElement);
    }
    for (const area of stackAreas(spec.series, spec.order, spec.box)) {
      let path = stale.get(area.model);
      stale.delete(area.model);
      if (!path) {
        path = svg('path', {});
        path.dataset.model = area.model;
        const title = svg('title', {});
        title.textContent = area.model;
        path.append(title);
      }
      path.setAttribute('class', `jp-LLM-history-area ${this.colourClass(area.model, index)}`);
      path.setAttribute('d', area.d);
      chart.append(path); // in stack order
    }
    stale.forEach(path => path.remove());
  }

  private colourClass(model: string, index: Map<string, number>): string {
    return model === OTHER
      ? 'jp-LLM-history-other'
      : `jp-LLM-colour-${(index.get(model) ?? 0) % COLOURS}`;
  }
}
