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
    const { t0, t1 } = windowOf(history);
    const seen: string[] = [];
    const charts: HTMLElement[] = [];
    for (const device of history.devices) {
      const series = memorySeries(samples, device.id);
      const order = stackOrder(series);
      const util = utilizationSeries(samples, device.id);
      if (device.library === 'CPU' && !order.length) {
        continue; // system RAM only when a model held some
      }
      seen.push(...order);
      const peak = stackPeak(series);
      const box = { width: WIDTH, height: HEIGHT, t0, t1, max: peak * 1.15 };
      const title = device.library === 'CPU' ? 'System RAM' : device.name || device.id;
      const now = util.length ? `GPU ${Math.round(util[util.length - 1].value)}%` : '';
      const chart = this.chart('memory', device.id, title, now, box, series, order);
      if (util.length) {
        chart.querySelector('svg')!.append(
          svg('path', {
            class: 'jp-LLM-history-utilization',
            d: linePath(util, { ...box, max: 100 })
          })
        );
      }
      const foot = `peak ${formatBytes(peak)} of ${formatBytes(device.total_memory)}`;
      chart.querySelector('.jp-LLM-history-scale')!.textContent = foot;
      charts.push(chart);
    }
    const tokens = tokenSeries(samples);
    const tokenOrder = stackOrder(tokens);
    seen.push(...tokenOrder);
    const last = samples.length ? samples[samples.length - 1].tokens_per_second : {};
    const current = Object.values(last).reduce((a, b) => a + b, 0);
    const peak = stackPeak(tokens);
    const box = { width: WIDTH, height: HEIGHT, t0, t1, max: Math.max(1, peak * 1.15) };
    const chart = this.chart(
      'tokens',
      '',
      'Tokens/s',
      `${rate(current)} now`,
      box,
      tokens,
      tokenOrder
    );
    chart.querySelector('.jp-LLM-history-scale')!.textContent = `peak ${rate(peak)} tokens/s`;
    charts.push(chart);
    this.colour(charts, colourIndex(this.loaded, seen));
    this.charts.replaceChildren(...charts);
  }

  private chart(
    kind: string,
    device: string,
    title: string,
    now: string,
    box: IBox,
    series: ReturnType<typeof memorySeries>,
    order: string[]
  ): HTMLElement {
    const node = el('div', `jp-LLM-history-chart jp-LLM-history-${kind}`);
    if (device) {
      node.dataset.device = device;
    }
    const head = el('div', 'jp-LLM-row-head');
    head.append(el('span', 'jp-LLM-device-name', title), el('span', 'jp-LLM-history-now', now));
    const chart = svg('svg', {
      class: 'jp-LLM-chart',
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
      preserveAspectRatio: 'none',
      role: 'img',
      'aria-label': `${title}, from ${spanLabel(box.t1 - box.t0)} to now`
    });
    for (const area of stackAreas(series, order, box)) {
      const path = svg('path', { class: 'jp-LLM-history-area', d: area.d });
      path.dataset.model = area.model;
      const title = svg('title', {});
      title.textContent = area.model;
      path.append(title);
      chart.append(path);
    }
    const foot = el('div', 'jp-LLM-row-foot');
    const span = spanLabel(box.t1 - box.t0);
    foot.append(el('span', 'jp-LLM-subtitle', span), el('span', 'jp-LLM-history-scale'));
    node.append(head, chart, foot);
    return node;
  }

  /** Each area, and the legend, in its model's colour. */
  private colour(charts: HTMLElement[], index: Map<string, number>): void {
    const used = new Set<string>();
    for (const chart of charts) {
      for (const path of Array.from(chart.querySelectorAll('path.jp-LLM-history-area'))) {
        const model = (path as SVGElement).dataset.model ?? '';
        used.add(model);
        path.classList.add(this.colourClass(model, index));
      }
    }
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

  private colourClass(model: string, index: Map<string, number>): string {
    return model === OTHER
      ? 'jp-LLM-history-other'
      : `jp-LLM-colour-${(index.get(model) ?? 0) % COLOURS}`;
  }
}
