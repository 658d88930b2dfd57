import { ILoadedModel, ISnapshot } from '../src/types';
import { SidebarView } from '../src/view';

const GiB = 1024 ** 3;
const NOW = Date.parse('2026-12-02T12:00:00Z');

function snapshot(models: ILoadedModel[], gpus = true): ISnapshot {
  return {
    devices: {
      devices: [
        ...(gpus
          ? [
              {
                id: 'GPU-0',
                library: 'CUDA',
                name: 'Simulated A',
                total_memory: 16 * GiB,
                free_memory: 10 * GiB
              }
            ]
          : []),
        { id: 'cpu', library: 'CPU', name: 'CPU', total_memory: 32 * GiB, free_memory: 20 * GiB }
      ],
      system: { total_memory: 32 * GiB, free_memory: 20 * GiB, threads: 8 },
      simulated: true
    },
    models
  };
}

const tiny: ILoadedModel = {
  name: 'tiny:latest',
  model: 'tiny:latest',
  size: 4 * GiB,
  size_vram: 3 * GiB,
  expires_at: '2026-12-02T12:05:00Z',
  context_length: 4096,
  threads: { now: 1, loaded: 2, adaptive: true },
  allocations: [
    { device: 'GPU-0', weights: 2 * GiB, kv_cache: 0.75 * GiB, graph: 0.25 * GiB },
    { device: 'cpu', weights: 1 * GiB, kv_cache: 0, graph: 0 }
  ]
};

function makeView(unload = jest.fn(() => Promise.resolve())) {
  const refresh = jest.fn();
  const view = new SidebarView({ unload, refresh });
  document.body.replaceChildren(view.node);
  return { view, unload, refresh };
}

const q = (selector: string) => document.querySelector(selector) as HTMLElement;
const qa = (selector: string) => Array.from(document.querySelectorAll(selector)) as HTMLElement[];

describe('SidebarView', () => {
  it('says so while loading, and when the server extension is missing', () => {
    const { view } = makeView();
    expect(q('.jp-LLM-notice').textContent).toContain('Looking for devices');
    expect(q('.jp-LLM-devices').hidden).toBe(true);
    view.update({ kind: 'missing' }, NOW);
    expect(q('.jp-LLM-notice').textContent).toContain(
      'jupyter server extension enable jupyter_llm'
    );
    expect(q('.jp-LLM-models').hidden).toBe(true);
  });

  it('without a GPU shows the no-GPU note and still shows system RAM', () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([], false) }, NOW);
    expect(q('.jp-LLM-notice').hidden).toBe(true);
    expect(q('.jp-LLM-no-gpu').hidden).toBe(false);
    const rows = qa('.jp-LLM-device');
    expect(rows.map(r => r.dataset.device)).toEqual(['cpu']);
    expect(rows[0].textContent).toContain('System RAM');
    expect(rows[0].textContent).toContain('12.0 GiB / 32.0 GiB');
    expect(rows[0].textContent).toContain('8 threads');
    expect(q('.jp-LLM-no-models').hidden).toBe(false);
  });

  it('draws each device bar from the allocations of the loaded models', () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    expect(q('.jp-LLM-no-gpu').hidden).toBe(true);
    expect(q('.jp-LLM-badge').hidden).toBe(false);
    const gpu = q('.jp-LLM-device[data-device="GPU-0"]');
    const segments = Array.from(gpu.querySelectorAll('.jp-LLM-segment')) as HTMLElement[];
    expect(segments.map(s => s.dataset.kind)).toEqual([
      'weights',
      'kv_cache',
      'graph',
      'other',
      'free'
    ]);
    expect(segments.map(s => s.style.width)).toEqual([
      '12.500%',
      '4.688%',
      '1.563%',
      '18.750%',
      '62.500%'
    ]);
    expect(segments[1].title).toBe('tiny:latest KV cache: 768 MiB');
    expect(gpu.textContent).toContain('Simulated A');
    expect(gpu.textContent).toContain('6.0 GiB / 16.0 GiB');
    const ram = q('.jp-LLM-device[data-device="cpu"]');
    expect(ram.querySelectorAll('.jp-LLM-segment-weights')).toHaveLength(1);
  });

  it('lists loaded models with size, processor, context, threads and countdown', () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    const row = q('.jp-LLM-model[data-model="tiny:latest"]');
    expect(q('.jp-LLM-models h3').textContent).toBe('Loaded models (1)');
    expect(row.querySelector('.jp-LLM-model-label')!.textContent).toBe('tiny:latest');
    const meta = Array.from(row.querySelectorAll('.jp-LLM-model-meta span')).map(
      s => s.textContent
    );
    expect(meta).toEqual(['4.0 GiB', '25%/75% CPU/GPU', 'ctx 4096', '1 of 2 threads']);
    const countdown = row.querySelector('.jp-LLM-countdown')!;
    expect(countdown.textContent).toBe('unloads in 5:00');
    view.tick(NOW + 61_000);
    expect(countdown.textContent).toBe('unloads in 3:59');
  });

  it('shows which users hold each model on a shared engine, and hides the line when none do', () => {
    const { view } = makeView();
    const shared = {
      ...tiny,
      users: [
        { name: 'alice', running: 1, queued: 0 },
        { name: 'bob', running: 1, queued: 2 }
      ]
    };
    view.update({ kind: 'ready', snapshot: snapshot([shared]) }, NOW);
    const users = q('.jp-LLM-model[data-model="tiny:latest"] .jp-LLM-model-users');
    expect(users.hidden).toBe(false);
    expect(users.textContent).toBe('In use by alice (1 running), bob (1 running, 2 queued)');
    view.update({ kind: 'ready', snapshot: snapshot([{ ...tiny, users: [] }]) }, NOW + 2000);
    expect(users.hidden).toBe(true);
    expect(q('.jp-LLM-model-users')).toBe(users); // the same row, updated in place
  });

  it('keeps the same Unload button across polls, and removes the row when the model goes', () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    const button = q('.jp-LLM-unload');
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW + 2000);
    expect(q('.jp-LLM-unload')).toBe(button);
    view.update({ kind: 'ready', snapshot: snapshot([]) }, NOW + 4000);
    expect(qa('.jp-LLM-model')).toHaveLength(0);
    expect(q('.jp-LLM-no-models').hidden).toBe(false);
  });

  it('Unload calls the API once, shows progress, then asks for a refresh', async () => {
    const { view, unload, refresh } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    const button = q('.jp-LLM-unload') as HTMLButtonElement;
    button.click();
    button.click();
    expect(unload).toHaveBeenCalledTimes(1);
    expect(unload).toHaveBeenCalledWith('tiny:latest');
    expect(button.disabled).toBe(true);
    expect(button.textContent).toBe('Unloading…');
    await Promise.resolve();
    await Promise.resolve();
    expect(refresh).toHaveBeenCalled();
  });

  it('a busy model the server keeps gets its button back at the next poll', async () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    const button = q('.jp-LLM-unload') as HTMLButtonElement;
    button.click();
    await Promise.resolve();
    await Promise.resolve();
    view.tick(NOW + 1000);
    expect(button.disabled).toBe(true); // answered, but no new snapshot yet
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW + 2000);
    expect(button.disabled).toBe(false);
    expect(button.textContent).toBe('Unload');
  });

  it('the countdown tick leaves the bars (and their tooltips) alone', () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    const segment = q('.jp-LLM-segment-weights');
    view.tick(NOW + 1000);
    expect(q('.jp-LLM-segment-weights')).toBe(segment);
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW + 2000);
    expect(q('.jp-LLM-segment-weights')).not.toBe(segment); // a poll redraws them
  });

  it('an unload error is forgotten once the model is gone', async () => {
    const { view } = makeView(jest.fn(() => Promise.reject(new Error('model is busy'))));
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    (q('.jp-LLM-unload') as HTMLButtonElement).click();
    await Promise.resolve();
    await Promise.resolve();
    expect(q('.jp-LLM-model-error').hidden).toBe(false);
    view.update({ kind: 'ready', snapshot: snapshot([]) }, NOW + 2000);
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW + 4000);
    expect(q('.jp-LLM-model-error').hidden).toBe(true);
  });

  it('a failed unload shows its message under the model and enables the button again', async () => {
    const unload = jest.fn(() => Promise.reject(new Error('model is busy')));
    const { view } = makeView(unload);
    view.update({ kind: 'ready', snapshot: snapshot([tiny]) }, NOW);
    const button = q('.jp-LLM-unload') as HTMLButtonElement;
    button.click();
    await Promise.resolve();
    await Promise.resolve();
    expect(button.disabled).toBe(false);
    const error = q('.jp-LLM-model-error');
    expect(error.hidden).toBe(false);
    expect(error.textContent).toBe('model is busy');
  });

  it('on a failed poll keeps the last devices and says it is retrying', () => {
    const { view } = makeView();
    const last = snapshot([tiny]);
    view.update({ kind: 'ready', snapshot: last }, NOW);
    view.update({ kind: 'error', message: 'Failed to fetch' }, NOW);
    expect(q('.jp-LLM-notice').textContent).toBe(
      'Cannot reach jupyter-llm: Failed to fetch. Retrying…'
    );
    expect(qa('.jp-LLM-device')).toHaveLength(2);
  });

  it('escapes model names (textContent, never HTML)', () => {
    const { view } = makeView();
    const evil = { ...tiny, name: '<img src=x onerror=alert(1)>' };
    view.update({ kind: 'ready', snapshot: snapshot([evil]) }, NOW);
    expect(document.querySelector('img')).toBeNull();
    expect(q('.jp-LLM-model-label').textContent).toBe(evil.name);
  });

  it('explains an idle GPU with the command that fixes it, as text', () => {
    const { view } = makeView();
    const idle = snapshot([], false);
    view.update({ kind: 'ready', snapshot: idle }, NOW);
    expect(q('.jp-LLM-gpu-notices').hidden).toBe(true);
    idle.devices.notices = [
      {
        kind: 'idle_gpu',
        message: '1 GPU(s) seen (<img src=x onerror=alert(1)>) but the build has only CPU',
        fix: 'make lab GPU=cuda'
      }
    ];
    view.update({ kind: 'ready', snapshot: idle }, NOW);
    expect(q('.jp-LLM-gpu-notices').hidden).toBe(false);
    expect(q('.jp-LLM-gpu-notice-idle_gpu').textContent).toContain('1 GPU(s) seen');
    expect(q('.jp-LLM-fix').textContent).toBe('make lab GPU=cuda');
    expect(document.querySelector('img')).toBeNull();
    idle.devices.notices = [];
    view.update({ kind: 'ready', snapshot: idle }, NOW);
    expect(q('.jp-LLM-gpu-notices').hidden).toBe(true);
  });
});

describe('SidebarView on a Ray cluster', () => {
  const gpu = (node: string, free: number) => ({
    id: `${node}/gpu0`,
    library: 'CUDA',
    name: 'Simulated 1 GiB',
    total_memory: GiB,
    free_memory: free,
    node
  });
  const ram = (node: string) => ({
    id: `${node}/cpu`,
    library: 'CPU',
    name: 'CPU',
    total_memory: 8 * GiB,
    free_memory: 6 * GiB,
    node
  });
  const onB: ILoadedModel = {
    ...tiny,
    allocations: [
      { device: 'nodeb/gpu0', weights: 0.25 * GiB, kv_cache: 0.25 * GiB, graph: 0 },
      { device: 'nodeb/cpu', weights: 0, kv_cache: 0, graph: 0 }
    ]
  };
  const cluster: ISnapshot = {
    devices: {
      devices: [gpu('nodea', GiB), gpu('nodeb', 0.5 * GiB), ram('nodea'), ram('nodeb')],
      system: { total_memory: 32 * GiB, free_memory: 20 * GiB, threads: 8 },
      nodes: [
        { id: 'nodea', name: '10.0.0.1', devices: ['nodea/gpu0', 'nodea/cpu'] },
        { id: 'nodeb', name: '10.0.0.2', devices: ['nodeb/gpu0', 'nodeb/cpu'] }
      ]
    },
    models: [onB]
  };

  it('groups the devices by node, each node with its own RAM', () => {
    const { view } = makeView();
    view.update({ kind: 'ready', snapshot: cluster }, NOW);
    const rows = qa('.jp-LLM-device');
    expect(rows.map(r => r.dataset.device)).toEqual([
      'nodea/gpu0',
      'nodea/cpu',
      'nodeb/gpu0',
      'nodeb/cpu'
    ]);
    const headings = rows.map(r => r.querySelector('.jp-LLM-node-name') as HTMLElement);
    expect(headings.map(h => (h.hidden ? '' : h.textContent))).toEqual([
      '10.0.0.1 · nodea',
      '',
      '10.0.0.2 · nodeb',
      ''
    ]);
    expect(q('.jp-LLM-no-gpu').hidden).toBe(true);
    // the model's memory shows on its own node's GPU only
    const segments = (device: string) =>
      qa(`[data-device="${device}"] .jp-LLM-segment`).map(s => s.dataset.kind);
    expect(segments('nodeb/gpu0')).toContain('weights');
    expect(segments('nodea/gpu0')).not.toContain('weights');
  });

  it('without a cluster shows no node headings', () => {
    const { view } = makeView();
    const local = snapshot([tiny]);
    local.devices.nodes = [{ id: '', name: 'laptop', devices: ['GPU-0', 'cpu'] }];
    view.update({ kind: 'ready', snapshot: local }, NOW);
    expect(qa('.jp-LLM-device').map(r => r.dataset.device)).toEqual(['GPU-0', 'cpu']);
    expect(qa('.jp-LLM-node-name').every(h => h.hidden)).toBe(true);
  });
});
