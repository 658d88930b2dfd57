import {
  countdown,
  formatBytes,
  holdersText,
  memorySegments,
  processor,
  secondsLeft,
  segmentWidths,
  threadsText
} from '../src/format';
import { ILoadedModel, toSnapshot } from '../src/types';

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

describe('formatBytes', () => {
  it.each([
    [0, '0 B'],
    [-5, '0 B'],
    [NaN, '0 B'],
    [512, '512 B'],
    [4096, '4 KiB'],
    [300 * MiB, '300 MiB'],
    [1.5 * GiB, '1.5 GiB'],
    [80 * GiB, '80.0 GiB'],
    [512 * GiB, '512 GiB']
  ])('%p bytes is %p', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });
});

describe('processor (Ollama ps PROCESSOR column)', () => {
  it.each([
    [1000, 0, '100% CPU'],
    [1000, 1000, '100% GPU'],
    [1000, 520, '48%/52% CPU/GPU'],
    [1000, 996, '100% GPU'],
    [1000, 4, '100% CPU'],
    [1000, 2000, '100% GPU'],
    [0, 5, '100% CPU']
  ])('size %p, size_vram %p is %p', (size, vram, text) => {
    expect(processor({ size, size_vram: vram })).toBe(text);
  });

  it.each([
    [1000, 960, 9, 9, '100% GPU'], // every layer: the host's buffers do not count
    [1000, 520, 9, 4, '48%/52% CPU/GPU'],
    [1000, 0, 9, 0, '100% CPU'],
    [1000, 960, 0, 0, '4%/96% CPU/GPU'] // no layer counts: the memory split
  ])('size %p, size_vram %p, %p layers with %p on GPUs is %p', (size, vram, n, gpu, text) => {
    expect(processor({ size, size_vram: vram, num_layers: n, num_gpu_layers: gpu })).toBe(text);
  });
});

describe('threadsText (the CPU threads a model decodes with)', () => {
  const cpu = { size: 1000, size_vram: 0 };
  it.each([
    [{ now: 2, loaded: 2, adaptive: true }, '2 threads'],
    [{ now: 1, loaded: 2, adaptive: true }, '1 of 2 threads'], // other work holds a core
    [{ now: 1, loaded: 1, adaptive: false }, '1 thread'],
    [{ now: 0, loaded: 4, adaptive: false }, '4 threads'], // no request yet said
    [{ now: 9, loaded: 4, adaptive: true }, '4 threads'], // more than loaded: not believed
    [{ now: 2, loaded: 0, adaptive: false }, ''] // the runner did not say
  ])('%p reads %p', (threads, text) => {
    expect(threadsText({ ...cpu, threads })).toBe(text);
  });

  it('says nothing of a model wholly on GPUs, or of a server that does not say', () => {
    const threads = { now: 1, loaded: 2, adaptive: true };
    expect(threadsText({ size: 1000, size_vram: 1000, threads })).toBe('');
    expect(threadsText({ size: 1000, size_vram: 520, threads })).toBe('1 of 2 threads');
    expect(threadsText(cpu)).toBe('');
  });
});

describe('countdown (Ollama ps UNTIL column)', () => {
  const now = Date.parse('2026-12-02T12:00:00Z');
  it.each([
    ['2026-12-02T12:04:05Z', 'unloads in 4:05'],
    ['2026-12-02T12:00:09Z', 'unloads in 0:09'],
    ['2026-12-02T14:03:04Z', 'unloads in 2:03:04'],
    ['2026-12-02T11:59:00Z', 'unloading…'],
    ['2318-01-01T00:00:00Z', 'kept loaded'],
    ['not a date', '']
  ])('expires_at %p reads %p', (expires, text) => {
    expect(countdown(expires, now)).toBe(text);
  });

  it('counts seconds and never goes below zero', () => {
    expect(secondsLeft('2026-12-02T12:00:30Z', now)).toBe(30);
    expect(secondsLeft('2026-12-02T11:00:00Z', now)).toBe(0);
    expect(secondsLeft('2318-01-01T00:00:00Z', now)).toBe(Infinity);
  });
});

function model(name: string, allocations: ILoadedModel['allocations']): ILoadedModel {
  const size = (allocations ?? []).reduce((a, x) => a + x.weights + x.kv_cache + x.graph, 0);
  return { name, model: name, size, size_vram: 0, expires_at: '', allocations };
}

describe('memorySegments', () => {
  const models = [
    model('a:latest', [
      { device: 'GPU-0', weights: 3 * GiB, kv_cache: 1 * GiB, graph: 0.5 * GiB },
      { device: 'cpu', weights: 1 * GiB, kv_cache: 0, graph: 0.25 * GiB }
    ]),
    model('b:latest', [{ device: 'GPU-0', weights: 2 * GiB, kv_cache: 0.5 * GiB, graph: 0 }])
  ];

  it('splits a GPU into each model, then other use, then free', () => {
    // 16 GiB card, 8 GiB free: models hold 7 GiB, something else 1 GiB
    const segments = memorySegments('GPU-0', 16 * GiB, 8 * GiB, models);
    expect(segments.map(s => [s.kind, s.model, s.bytes])).toEqual([
      ['weights', 0, 3 * GiB],
      ['kv_cache', 0, 1 * GiB],
      ['graph', 0, 0.5 * GiB],
      ['weights', 1, 2 * GiB],
      ['kv_cache', 1, 0.5 * GiB],
      ['other', -1, 1 * GiB],
      ['free', -1, 8 * GiB]
    ]);
    expect(segments[1].label).toBe('a:latest KV cache');
  });

  it('shows only the models on that device, and no other use when there is none', () => {
    const segments = memorySegments('cpu', 4 * GiB, 2.75 * GiB, models);
    expect(segments.map(s => [s.kind, s.bytes])).toEqual([
      ['weights', 1 * GiB],
      ['graph', 0.25 * GiB],
      ['free', 2.75 * GiB]
    ]);
  });

  it('never shows negative free when the estimate exceeds what the driver reports', () => {
    const segments = memorySegments('GPU-0', 6 * GiB, 1 * GiB, models);
    const free = segments.find(s => s.kind === 'free')!;
    expect(free.bytes).toBe(0);
    expect(segments.some(s => s.kind === 'other')).toBe(false);
    const widths = segmentWidths(segments, 6 * GiB);
    expect(widths.reduce((a, b) => a + b, 0)).toBeCloseTo(100);
  });

  it('an idle device is all free', () => {
    const segments = memorySegments('GPU-1', 8 * GiB, 8 * GiB, models);
    expect(segments).toEqual([{ kind: 'free', model: -1, label: 'free', bytes: 8 * GiB }]);
    expect(segmentWidths(segments, 8 * GiB)).toEqual([100]);
  });
});

describe('toSnapshot', () => {
  const devices = { devices: [], system: { total_memory: 1, free_memory: 1 } };

  it('joins the two replies', () => {
    expect(toSnapshot(devices, { models: [] })).toEqual({ devices, models: [] });
  });

  it.each([
    [null, { models: [] }],
    ['<html>login</html>', { models: [] }],
    [{ devices: 'x', system: devices.system }, { models: [] }],
    [{ devices: [] }, { models: [] }],
    [devices, null],
    [devices, { models: {} }]
  ])('refuses a reply that is not jupyter-llm JSON (%p, %p)', (d, p) => {
    expect(() => toSnapshot(d, p)).toThrow('not from jupyter-llm');
  });
});

describe('holdersText (who holds a model on a shared engine)', () => {
  it.each([
    [undefined, ''],
    [[], ''],
    [[{ name: 'local', running: 1, queued: 0 }], ''],
    [[{ name: 'alice', running: 0, queued: 0 }], ''],
    [[{ name: 'alice', running: 1, queued: 0 }], 'In use by alice (1 running)'],
    [
      [
        { name: 'alice', running: 2, queued: 0 },
        { name: 'bob', running: 1, queued: 3 },
        { name: 'carol', running: 0, queued: 1 }
      ],
      'In use by alice (2 running), bob (1 running, 3 queued), carol (1 queued)'
    ]
  ])('%j reads %p', (users, text) => {
    expect(holdersText(users)).toBe(text);
  });
});
