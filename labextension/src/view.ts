/**
 * The sidebar's DOM, built from a `ViewState`. Rows are keyed (devices by id,
 * models by name) and updated in place, so a poll never swaps a button out
 * from under the pointer. Plain DOM, no JupyterLab imports: Jest renders it
 * in jsdom.
 */
import {
  countdown,
  formatBytes,
  holdersText,
  ISegment,
  KIND_LABELS,
  memorySegments,
  processor,
  segmentWidths,
  threadsText
} from './format';
import { CPU_DEVICE, IDevice, ILoadedModel, INode, INotice, ISnapshot } from './types';

export type ViewState =
  | { kind: 'loading' }
  | { kind: 'missing' }
  | { kind: 'error'; message: string }
  | { kind: 'ready'; snapshot: ISnapshot };

export interface IViewActions {
  /** Unload a model now; rejects with a message the view shows. */
  unload(name: string): Promise<void>;
  /** Poll now rather than at the next tick. */
  refresh(): void;
}

/** Distinct model colours; a model keeps its colour by /api/ps position. */
export const MODEL_COLOURS = 6;

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** Keep `container`'s children keyed by their `data-<attribute>`, in `items` order. */
function reconcile<T>(
  container: HTMLElement,
  items: T[],
  attribute: 'device' | 'model',
  key: (item: T) => string,
  create: () => HTMLElement,
  update: (node: HTMLElement, item: T) => void
): void {
  const existing = new Map<string, HTMLElement>();
  for (const child of Array.from(container.children) as HTMLElement[]) {
    existing.set(child.dataset[attribute] ?? '', child);
  }
  items.forEach((item, index) => {
    const k = key(item);
    let node = existing.get(k);
    if (node) {
      existing.delete(k);
    } else {
      node = create();
      node.dataset[attribute] = k;
    }
    update(node, item);
    if (container.children[index] !== node) {
      container.insertBefore(node, container.children[index] ?? null);
    }
  });
  for (const stale of existing.values()) {
    stale.remove();
  }
}

function renderBar(bar: HTMLElement, segments: ISegment[], total: number): void {
  const widths = segmentWidths(segments, total);
  bar.replaceChildren(
    ...segments.map((segment, i) => {
      const node = el('div', `jp-LLM-segment jp-LLM-segment-${segment.kind}`);
      if (segment.model >= 0) {
        node.classList.add(`jp-LLM-colour-${segment.model % MODEL_COLOURS}`);
      }
      node.style.width = `${widths[i].toFixed(3)}%`;
      node.title = `${segment.label}: ${formatBytes(segment.bytes)}`;
      node.dataset.kind = segment.kind;
      return node;
    })
  );
}

interface IMemoryRow {
  title: string;
  subtitle: string;
  device: string;
  total: number;
  free: number;
  /** The node heading shown above the first row of each node ("": none). */
  node: string;
  gpu: boolean;
}

function gpuRow(d: IDevice): IMemoryRow {
  return {
    title: d.name || d.id,
    subtitle: [d.library, d.id, d.integrated ? 'integrated' : ''].filter(Boolean).join(' · '),
    device: d.id,
    total: d.total_memory,
    free: d.free_memory,
    node: '',
    gpu: true
  };
}

/** The nodes of a cluster, or none when every device is this server's own. */
function clusterNodes(snapshot: ISnapshot): INode[] {
  const nodes = snapshot.devices.nodes ?? [];
  return nodes.some(n => n.id !== '') ? nodes : [];
}

/** On a cluster: each node's GPUs and then its system RAM, under the node's name. */
function nodeRows(snapshot: ISnapshot, nodes: INode[]): IMemoryRow[] {
  const rows: IMemoryRow[] = [];
  for (const n of nodes) {
    const devices = snapshot.devices.devices.filter(d => d.node === n.id);
    const first = rows.length;
    rows.push(...devices.filter(d => d.library !== 'CPU').map(gpuRow));
    for (const cpu of devices.filter(d => d.library === 'CPU')) {
      rows.push({
        title: 'System RAM',
        subtitle: 'CPU',
        device: cpu.id,
        total: cpu.total_memory,
        free: cpu.free_memory,
        node: '',
        gpu: false
      });
    }
    if (rows.length > first) {
      rows[first].node = n.name && n.name !== n.id ? `${n.name} · ${n.id}` : n.id;
    }
  }
  return rows;
}

function deviceRows(snapshot: ISnapshot): IMemoryRow[] {
  const nodes = clusterNodes(snapshot);
  if (nodes.length) {
    return nodeRows(snapshot, nodes);
  }
  const gpus = snapshot.devices.devices.filter(d => d.library !== 'CPU');
  const rows: IMemoryRow[] = gpus.map(gpuRow);
  const system = snapshot.devices.system;
  const threads = system.threads ? `CPU · ${system.threads} threads` : 'CPU';
  rows.push({
    title: 'System RAM',
    subtitle: threads,
    device: CPU_DEVICE,
    total: system.total_memory,
    free: system.free_memory,
    node: '',
    gpu: false
  });
  return rows;
}

export class SidebarView {
  readonly node: HTMLElement;
  private notice: HTMLElement;
  private badge: HTMLElement;
  private devices: HTMLElement;
  private deviceList: HTMLElement;
  private gpuNote: HTMLElement;
  private gpuNotices: HTMLElement;
  private models: HTMLElement;
  private modelHeading: HTMLElement;
  private modelList: HTMLElement;
  private modelEmpty: HTMLElement;
  /** Models whose Unload is in flight (button disabled). */
  private pending = new Set<string>();
  /** Unloads the server has answered: released at the next poll's snapshot. */
  private settled = new Set<string>();
  private errors = new Map<string, string>();
  private state: ViewState = { kind: 'loading' };
  /** What the bars and rows show: the last snapshot, kept through errors. */
  private shown: ISnapshot | undefined;

  constructor(private actions: IViewActions) {
    this.node = el('div', 'jp-LLM-sidebar');
    const header = el('header', 'jp-LLM-header');
    header.append(el('h2', 'jp-LLM-title', 'LLM devices'));
    this.badge = el('span', 'jp-LLM-badge', 'simulated');
    this.badge.title = 'Devices come from JUPYTER_LLM_SIMULATED_DEVICES';
    const refresh = el('button', 'jp-LLM-refresh jp-Button', '⟳');
    refresh.title = 'Refresh now';
    refresh.setAttribute('aria-label', 'Refresh now');
    refresh.addEventListener('click', () => this.actions.refresh());
    header.append(this.badge, refresh);

    this.notice = el('div', 'jp-LLM-notice');
    this.notice.setAttribute('role', 'status');

    this.devices = el('section', 'jp-LLM-devices');
    this.gpuNote = el(
      'p',
      'jp-LLM-empty jp-LLM-no-gpu',
      'No GPU found: models run on the CPU, in system RAM.'
    );
    this.gpuNotices = el('div', 'jp-LLM-gpu-notices');
    this.deviceList = el('div', 'jp-LLM-device-list');
    this.devices.append(
      el('h3', 'jp-LLM-heading', 'Memory'),
      this.gpuNotices,
      this.gpuNote,
      this.deviceList
    );
    this.devices.append(this.legend());

    this.models = el('section', 'jp-LLM-models');
    this.modelHeading = el('h3', 'jp-LLM-heading', 'Loaded models');
    this.modelEmpty = el('p', 'jp-LLM-empty jp-LLM-no-models');
    this.modelEmpty.append(
      'No model is loaded. Run a ',
      el('code', '', '%%llm'),
      ' cell or ',
      el('code', '', 'jupyter llm run MODEL'),
      ' to load one.'
    );
    this.modelList = el('div', 'jp-LLM-model-list');
    this.models.append(this.modelHeading, this.modelEmpty, this.modelList);

    this.node.append(header, this.notice, this.devices, this.models);
    this.render(Date.now());
  }

  /** Show a new state (from a poll). */
  update(state: ViewState, now: number = Date.now()): void {
    this.state = state;
    if (state.kind !== 'error') {
      this.shown = state.kind === 'ready' ? state.snapshot : undefined;
    }
    if (state.kind === 'ready') {
      // a model the server was asked to unload but still lists (it is busy
      // and goes when its requests end) gets its button back
      for (const name of this.settled) {
        this.pending.delete(name);
      }
      this.settled.clear();
    }
    this.render(now);
  }

  /** Move the countdowns (and Unload buttons) on, without new data; the
   * bars are left alone so their tooltips stay put. */
  tick(now: number = Date.now()): void {
    if (this.shown) {
      this.renderModels(this.shown.models, now);
    }
  }

  private legend(): HTMLElement {
    const legend = el('div', 'jp-LLM-legend');
    for (const [kind, label] of Object.entries(KIND_LABELS)) {
      const item = el('span', 'jp-LLM-legend-item');
      item.append(el('span', `jp-LLM-swatch jp-LLM-segment-${kind} jp-LLM-colour-0`), label);
      legend.append(item);
    }
    return legend;
  }

  private setNotice(kind: string, content: (string | Node)[]): void {
    this.notice.className = `jp-LLM-notice jp-LLM-notice-${kind}`;
    this.notice.replaceChildren(...content);
    this.notice.hidden = content.length === 0;
  }

  private render(now: number): void {
    const state = this.state;
    const snapshot = this.shown;
    switch (state.kind) {
      case 'loading':
        this.setNotice('info', ['Looking for devices…']);
        break;
      case 'missing':
        this.setNotice('warning', [
          el('strong', '', 'The jupyter-llm server extension is not running.'),
          el('br'),
          'Enable it with ',
          el('code', '', 'jupyter server extension enable jupyter_llm'),
          ' and restart Jupyter.'
        ]);
        break;
      case 'error':
        this.setNotice('error', [`Cannot reach jupyter-llm: ${state.message}. Retrying…`]);
        break;
      case 'ready':
        this.setNotice('none', []);
        break;
    }
    this.badge.hidden = !snapshot?.devices.simulated;
    this.devices.hidden = !snapshot;
    this.models.hidden = !snapshot;
    if (!snapshot) {
      return;
    }
    const models = snapshot.models;
    const rows = deviceRows(snapshot);
    this.gpuNote.hidden = rows.some(row => row.gpu);
    this.renderGpuNotices(snapshot.devices.notices ?? []);
    reconcile(
      this.deviceList,
      rows,
      'device',
      row => row.device,
      () => {
        const node = el('div', 'jp-LLM-device');
        const foot = el('div', 'jp-LLM-row-foot');
        foot.append(el('span', 'jp-LLM-subtitle'), el('span', 'jp-LLM-usage'));
        node.append(
          el('h4', 'jp-LLM-node-name'),
          el('div', 'jp-LLM-device-name'),
          el('div', 'jp-LLM-bar'),
          foot
        );
        return node;
      },
      (node, row) => {
        const heading = node.querySelector('.jp-LLM-node-name') as HTMLElement;
        heading.textContent = row.node;
        heading.hidden = !row.node;
        const name = node.querySelector('.jp-LLM-device-name') as HTMLElement;
        name.textContent = row.title;
        name.title = row.title;
        const used = Math.max(0, row.total - row.free);
        node.querySelector('.jp-LLM-usage')!.textContent =
          `${formatBytes(used)} / ${formatBytes(row.total)}`;
        node.querySelector('.jp-LLM-subtitle')!.textContent = row.subtitle;
        const bar = node.querySelector('.jp-LLM-bar') as HTMLElement;
        bar.setAttribute('role', 'img');
        bar.setAttribute(
          'aria-label',
          `${row.title}: ${formatBytes(used)} used of ${formatBytes(row.total)}`
        );
        renderBar(bar, memorySegments(row.device, row.total, row.free, models), row.total);
      }
    );

    this.renderModels(models, now);
  }

  /** An idle GPU (or a runner interpreter that failed) and its fix; text only. */
  private renderGpuNotices(notices: INotice[]): void {
    this.gpuNotices.hidden = notices.length === 0;
    this.gpuNotices.replaceChildren(
      ...notices.map(n => {
        const node = el('p', `jp-LLM-gpu-notice jp-LLM-gpu-notice-${n.kind}`);
        node.append(n.message, el('br'), 'Fix: ', el('code', 'jp-LLM-fix', n.fix));
        return node;
      })
    );
  }

  private renderModels(models: ILoadedModel[], now: number): void {
    this.modelHeading.textContent = models.length
      ? `Loaded models (${models.length})`
      : 'Loaded models';
    this.modelEmpty.hidden = models.length > 0;
    const names = new Set(models.map(m => m.name));
    for (const keyed of [this.pending, this.settled, this.errors]) {
      for (const name of Array.from(keyed.keys())) {
        if (!names.has(name)) {
          keyed.delete(name);
        }
      }
    }
    reconcile(
      this.modelList,
      models.map((model, index) => ({ model, index })),
      'model',
      item => item.model.name,
      () => this.createModelRow(),
      (node, item) => this.updateModelRow(node, item.model, item.index, now)
    );
  }

  private createModelRow(): HTMLElement {
    const node = el('div', 'jp-LLM-model');
    const head = el('div', 'jp-LLM-row-head');
    const name = el('span', 'jp-LLM-model-name');
    name.prepend(el('span', 'jp-LLM-swatch jp-LLM-segment-weights'));
    name.append(el('span', 'jp-LLM-model-label'));
    const unload = el('button', 'jp-LLM-unload', 'Unload');
    unload.addEventListener('click', () => {
      const model = node.dataset.model ?? '';
      if (this.pending.has(model)) {
        return;
      }
      this.pending.add(model);
      this.errors.delete(model);
      this.tick();
      this.actions.unload(model).then(
        () => {
          this.settled.add(model);
          this.actions.refresh();
        },
        (reason: unknown) => {
          this.pending.delete(model);
          this.errors.set(model, reason instanceof Error ? reason.message : String(reason));
          this.tick();
        }
      );
    });
    head.append(name, unload);
    node.append(
      head,
      el('div', 'jp-LLM-model-meta'),
      el('div', 'jp-LLM-model-users'),
      el('div', 'jp-LLM-countdown'),
      el('div', 'jp-LLM-model-error')
    );
    return node;
  }

  private updateModelRow(node: HTMLElement, model: ILoadedModel, index: number, now: number) {
    const swatch = node.querySelector('.jp-LLM-swatch') as HTMLElement;
    swatch.className = `jp-LLM-swatch jp-LLM-segment-weights jp-LLM-colour-${index % MODEL_COLOURS}`;
    node.querySelector('.jp-LLM-model-label')!.textContent = model.name;
    const meta = [
      formatBytes(model.size),
      processor(model),
      model.context_length ? `ctx ${model.context_length}` : '',
      threadsText(model)
    ].filter(Boolean);
    const metaNode = node.querySelector('.jp-LLM-model-meta') as HTMLElement;
    if (metaNode.dataset.text !== meta.join('\n')) {
      metaNode.dataset.text = meta.join('\n');
      metaNode.replaceChildren(...meta.map((text, i) => el('span', `jp-LLM-meta-${i}`, text)));
    }
    const users = node.querySelector('.jp-LLM-model-users') as HTMLElement;
    users.textContent = holdersText(model.users);
    users.hidden = !users.textContent;
    node.querySelector('.jp-LLM-countdown')!.textContent = countdown(model.expires_at, now);
    const unload = node.querySelector('.jp-LLM-unload') as HTMLButtonElement;
    const busy = this.pending.has(model.name);
    unload.disabled = busy;
    unload.textContent = busy ? 'Unloading…' : 'Unload';
    unload.title = `Unload ${model.name} now and free its memory`;
    const error = node.querySelector('.jp-LLM-model-error') as HTMLElement;
    error.textContent = this.errors.get(model.name) ?? '';
    error.hidden = !this.errors.has(model.name);
  }
}
