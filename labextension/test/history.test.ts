import { HistoryView } from '../src/history';
import {
  colourIndex,
  IStackPoint,
  linePath,
  spanLabel,
  stackAreas,
  stackOrder,
  stackPeak,
  windowOf
} from '../src/history_chart';
import { nextDelay, VisibilityPoll } from '../src/history_poll';
import { IHistory, IHistorySample } from '../src/types';

const GiB = 1024 ** 3;
const BOX = { width: 100, height: 10, t0: 0, t1: 10, max: 10 };

describe('stacked areas', () => {
  const points: IStackPoint[] = [
    { t: 0, values: { a: 2, b: 4 } },
    { t: 10, values: { a: 6 } }
  ];

  it('orders by total, largest at the bottom', () => {
    expect(stackOrder(points)).toEqual(['a', 'b']);
    expect(stackOrder([{ t: 0, values: { z: 0 } }])).toEqual([]);
  });

  it('peaks at the largest stacked total', () => {
    expect(stackPeak(points)).toBe(6);
    expect(stackPeak([])).toBe(0);
  });

  it('stacks each model on the ones below it', () => {
    const [a, b] = stackAreas(points, ['a', 'b'], BOX);
    // a: from 0 up to 2 then 6; closed back along the bottom
    expect(a).toEqual({ model: 'a', d: 'M0,8L100,4L100,10L0,10Z' });
    // b sits on a: from 2 to 6 at t=0, nothing (6 to 6) at t=10
    expect(b).toEqual({ model: 'b', d: 'M0,4L100,4L100,4L0,8Z' });
    expect(stackAreas([], ['a'], BOX)).toEqual([]);
  });

  it.each([
    [[{ t: 5, value: 50 }], 'M50,5'],
    [[{ t: -5, value: 200 }], 'M0,0'], // clamped into the box
    [[], '']
  ])('draws a line %#', (line, d) => {
    expect(linePath(line, { ...BOX, max: 100 })).toBe(d);
  });

  it.each([
    [[1000, 1200], { t0: 1000, t1: 1200 }], // from the oldest sample
    [[0, 1200], { t0: 600, t1: 1200 }], // at most the window
    [[1190, 1200], { t0: 1140, t1: 1200 }], // at least a minute
    [[], { t0: -600, t1: 0 }]
  ])('spans samples at %p as %p', (times, span) => {
    const history = { window: 600, samples: times.map(t => ({ t })) } as IHistory;
    expect(windowOf(history)).toEqual(span);
  });

  it.each([
    [600, '−10 min'],
    [120, '−2 min'],
    [90, '−90 s'],
    [60, '−60 s']
  ])('labels a span of %i s as %s', (seconds, label) => {
    expect(spanLabel(seconds)).toBe(label);
  });

  it('keeps loaded models in their /api/ps colours, then others as they come', () => {
    const index = colourIndex(['b', 'a'], ['c', 'a', 'd', 'c']);
    expect(Array.from(index.entries())).toEqual([
      ['b', 0],
      ['a', 1],
      ['c', 2],
      ['d', 3]
    ]);
  });
});

function history(samples: IHistory['samples'], sampling = true): IHistory {
  return {
    interval: 2,
    window: 600,
    sampling,
    devices: [
      { id: 'GPU-0', name: 'Sim 8G', library: 'CUDA', total_memory: 8 * GiB },
      { id: 'cpu', name: 'CPU', library: 'CPU', total_memory: 32 * GiB }
    ],
    samples
  };
}

describe('HistoryView', () => {
  const samples: IHistorySample[] = [
    {
      t: 100,
      memory: { 'GPU-0': { 'tiny:latest': GiB }, cpu: {} },
      utilization: { 'GPU-0': 20 },
      tokens_per_second: {}
    },
    {
      t: 102,
      memory: { 'GPU-0': { 'tiny:latest': GiB, 'gemma:270m': 2 * GiB }, cpu: {} },
      utilization: { 'GPU-0': 60 },
      tokens_per_second: { 'tiny:latest': 42.5 }
    }
  ];

  it('is hidden until a history comes', () => {
    expect(new HistoryView().node.hidden).toBe(true);
  });

  it('draws memory by model per device, utilization and tokens/s', () => {
    const view = new HistoryView();
    view.setLoaded(['gemma:270m', 'tiny:latest']);
    view.update(history(samples));
    expect(view.node.hidden).toBe(false);
    const charts = Array.from(view.node.querySelectorAll('.jp-LLM-history-chart'));
    // the GPU and tokens/s; system RAM held nothing, so it is left out
    expect(charts.map(c => c.classList.contains('jp-LLM-history-tokens'))).toEqual([false, true]);
    const gpu = charts[0] as HTMLElement;
    expect(gpu.dataset.device).toBe('GPU-0');
    const areas = Array.from(gpu.querySelectorAll('path.jp-LLM-history-area')) as SVGElement[];
    expect(areas.map(a => [a.dataset.model, a.getAttribute('class')])).toEqual([
      ['gemma:270m', 'jp-LLM-history-area jp-LLM-colour-0'],
      ['tiny:latest', 'jp-LLM-history-area jp-LLM-colour-1']
    ]);
    expect(gpu.querySelector('.jp-LLM-history-utilization')).not.toBeNull();
    expect(gpu.querySelector('.jp-LLM-history-now')!.textContent).toBe('GPU 60%');
    expect(gpu.querySelector('.jp-LLM-history-scale')!.textContent).toBe('peak 3.0 GiB of 8.0 GiB');
    const tokens = charts[1];
    expect(tokens.querySelector('.jp-LLM-history-now')!.textContent).toBe('42.5 now');
    expect(tokens.querySelectorAll('path.jp-LLM-history-area')).toHaveLength(1);
    const legend = Array.from(
      view.node.querySelectorAll('.jp-LLM-history-legend .jp-LLM-legend-item')
    );
    expect(legend.map(l => l.textContent)).toEqual(['gemma:270m', 'tiny:latest']);
    expect((view.node.querySelector('.jp-LLM-history-empty') as HTMLElement).hidden).toBe(true);
  });

  it('updates its charts in place, so a hovered area is the same node', () => {
    const view = new HistoryView();
    view.update(history(samples));
    const chart = view.node.querySelector('[data-device="GPU-0"]')!;
    const tiny = chart.querySelector('path[data-model="tiny:latest"]')!;
    const before = tiny.getAttribute('d');
    const later = {
      t: 104,
      memory: { 'GPU-0': { 'tiny:latest': 2 * GiB }, cpu: {} },
      utilization: {},
      tokens_per_second: {}
    };
    view.update(history([...samples, later]));
    expect(view.node.querySelector('[data-device="GPU-0"]')).toBe(chart);
    expect(chart.querySelector('path[data-model="tiny:latest"]')).toBe(tiny);
    expect(tiny.getAttribute('d')).not.toBe(before);
    // gemma is still in the window: its area stays; with a window of only the
    // last sample it goes, and so does the utilization line
    expect(chart.querySelector('path[data-model="gemma:270m"]')).not.toBeNull();
    view.update(history([later]));
    expect(chart.querySelector('path[data-model="gemma:270m"]')).toBeNull();
    expect(chart.querySelector('.jp-LLM-history-utilization')).toBeNull();
    expect(chart.querySelector('.jp-LLM-history-now')!.textContent).toBe('');
  });

  it('says when the server keeps no history', () => {
    const view = new HistoryView();
    view.update(history([], false));
    const empty = view.node.querySelector('.jp-LLM-history-empty') as HTMLElement;
    expect(empty.hidden).toBe(false);
    expect(empty.textContent).toContain('not sampling');
  });
});

describe('polling backs off while the tab is hidden', () => {
  it.each([
    [2000, false, false, 2000],
    [2000, true, false, 4000],
    [4000, true, false, 8000],
    [32000, true, false, 60000],
    [60000, true, false, 60000],
    [2000, false, true, 4000], // a failure backs off too
    [16000, false, false, 2000] // visible and fine: back to the interval
  ])('after %i ms (hidden %s, failed %s): %i ms', (last, hidden, failed, next) => {
    expect(nextDelay(last, hidden, failed, 2000, 60000)).toBe(next);
  });

  let visibility: DocumentVisibilityState = 'visible';
  beforeEach(() => {
    jest.useFakeTimers();
    visibility = 'visible';
    jest.spyOn(document, 'visibilityState', 'get').mockImplementation(() => visibility);
  });
  afterEach(() => {
    jest.useRealTimers();
    jest.restoreAllMocks();
  });

  async function advance(ms: number): Promise<void> {
    await jest.advanceTimersByTimeAsync(ms);
  }

  it('polls at the interval in view, less and less when hidden, at once when back', async () => {
    const fetch = jest.fn(() => Promise.resolve());
    const poll = new VisibilityPoll({ fetch, interval: 2000, hiddenMax: 60000 });
    poll.start();
    await advance(0);
    expect(fetch).toHaveBeenCalledTimes(1);
    await advance(10000);
    expect(fetch).toHaveBeenCalledTimes(6); // every 2 s in view

    visibility = 'hidden';
    document.dispatchEvent(new Event('visibilitychange'));
    fetch.mockClear();
    await advance(60000);
    // 2 s (already scheduled), then 4, 8, 16, 32 s: far fewer than 30
    expect(fetch.mock.calls.length).toBeLessThanOrEqual(5);
    expect(poll.currentDelay).toBeGreaterThanOrEqual(32000);

    visibility = 'visible';
    document.dispatchEvent(new Event('visibilitychange'));
    fetch.mockClear();
    await advance(0);
    expect(fetch).toHaveBeenCalledTimes(1); // fresh data at once
    expect(poll.currentDelay).toBe(2000);
    await advance(4000);
    expect(fetch).toHaveBeenCalledTimes(3);
    poll.stop();
    await advance(20000);
    expect(fetch).toHaveBeenCalledTimes(3);
  });

  it('backs off after a failed fetch and recovers', async () => {
    const fetch = jest.fn().mockRejectedValueOnce(new Error('down')).mockResolvedValue(undefined);
    const poll = new VisibilityPoll({ fetch, interval: 2000, hiddenMax: 60000 });
    poll.start();
    await advance(0);
    expect(poll.currentDelay).toBe(4000);
    await advance(4000);
    expect(fetch).toHaveBeenCalledTimes(2);
    expect(poll.currentDelay).toBe(2000);
    poll.stop();
  });
});
