import { ServerConnection } from '@jupyterlab/services';

import {
  buildRequest,
  completionProblem,
  DEFAULT_SETTINGS,
  MAX_PREFIX_CHARS,
  MAX_SUFFIX_CHARS,
  NdjsonLines,
  readSettings,
  splitAtCursor
} from '../src/completion';
import { CompletionState } from '../src/completion_state';
import { LLMInlineProvider } from '../src/provider';

// jsdom has no TextDecoder/TextEncoder; Node's are the same API
declare function require(name: string): any;
const { TextDecoder, TextEncoder } = require('util');
Object.assign(globalThis, { TextDecoder, TextEncoder });
// ServerConnection.makeSettings reads the browser's fetch API for its defaults
for (const name of ['fetch', 'Headers', 'Request']) {
  (globalThis as any)[name] ??= () => {
    throw new Error(`no ${name} in these tests: FakeServer answers`);
  };
}

describe('readSettings', () => {
  it('bounds numbers and trims the model', () => {
    expect(readSettings({ model: ' m ', debounceMs: -3, maxTokens: 1e9, enabled: false })).toEqual({
      enabled: false,
      model: 'm',
      debounceMs: 0,
      maxTokens: 512
    });
  });
  it('falls back to the defaults for wrong types', () => {
    expect(readSettings({ model: 3, debounceMs: 'x', maxTokens: null })).toEqual(DEFAULT_SETTINGS);
  });
});

describe('splitAtCursor', () => {
  it('splits at the offset', () => {
    expect(splitAtCursor('abcdef', 2)).toEqual({ prefix: 'ab', suffix: 'cdef' });
  });
  it('keeps only the nearest characters', () => {
    const text = 'p'.repeat(MAX_PREFIX_CHARS + 10) + 's'.repeat(MAX_SUFFIX_CHARS + 10);
    const { prefix, suffix } = splitAtCursor(text, MAX_PREFIX_CHARS + 10);
    expect(prefix.length).toBe(MAX_PREFIX_CHARS);
    expect(suffix.length).toBe(MAX_SUFFIX_CHARS);
  });
});

describe('buildRequest', () => {
  const settings = { ...DEFAULT_SETTINGS, model: 'm', maxTokens: 7 };
  it('sends the suffix for fill-in-the-middle', () => {
    const body = buildRequest(settings, 'def f(', '):') as any;
    expect(body).toMatchObject({ model: 'm', prompt: 'def f(', suffix: '):', raw: true });
    expect(body.stream).toBe(true);
    expect(body.options.num_predict).toBe(7);
    expect(body.options.stop).toContain('\n\n');
    expect(body.priority).toBeUndefined(); // the server has no priorities yet
  });
  it('sends no empty suffix (raw continuation instead)', () => {
    expect(buildRequest(settings, 'x = ', '')).not.toHaveProperty('suffix');
  });
});

describe('NdjsonLines', () => {
  it('joins lines split across chunks', () => {
    const lines = new NdjsonLines();
    expect(lines.push('{"response":"a","do')).toEqual([]);
    expect(lines.push('ne":false}\n{"response":"b","done":false}\n{"resp')).toEqual([
      { text: 'a', done: false },
      { text: 'b', done: false }
    ]);
    expect(lines.push('onse":"","done":true}')).toEqual([]);
    expect(lines.end()).toEqual([{ text: '', done: true }]);
  });
  it('reports an error line and a line that is not JSON', () => {
    const lines = new NdjsonLines();
    expect(lines.push('{"error":"boom"}\nnope\n')).toEqual([
      { text: '', done: true, error: 'boom' },
      { text: '', done: true, error: 'the server sent a line that is not JSON' }
    ]);
  });
});

describe('completionProblem', () => {
  const on = { ...DEFAULT_SETTINGS, model: 'm' };
  it('says why no completion can be made', () => {
    expect(completionProblem({ ...on, enabled: false }, ['insert'])).toMatch(/turned off/);
    expect(completionProblem({ ...on, model: '' }, [])).toMatch(/No completion model/);
    expect(completionProblem(on, null)).toMatch(/not installed/);
    expect(completionProblem(on, ['completion'])).toMatch(/cannot insert/);
    expect(completionProblem(on, ['completion', 'insert'])).toBeNull();
  });
});

/** A fake server: /api/show says the model inserts; /api/generate streams
 * the chunks pushed into `feed`, and records when its request is aborted. */
class FakeServer {
  generates: { body: any; aborted: boolean }[] = [];
  capabilities: string[] | 'fail' = ['insert'];
  private feeds: ((chunk: string | null) => void)[] = [];

  settings(): ServerConnection.ISettings {
    class FakeRequest {
      headers = new Map<string, string>();
      constructor(
        public url: string,
        public init: any
      ) {
        (this.headers as any).append = (k: string, v: string) => this.headers.set(k, v);
      }
    }
    return ServerConnection.makeSettings({
      baseUrl: 'http://x/',
      token: '',
      appendToken: false,
      fetch: ((request: FakeRequest) => this.answer(request)) as any,
      Request: FakeRequest as any
    });
  }

  feed(index: number, chunk: string | null): void {
    this.feeds[index](chunk);
  }

  private async answer(request: { url: string; init: any }): Promise<any> {
    if (request.url.includes('api/show')) {
      if (this.capabilities === 'fail') {
        return { ok: false, status: 500, statusText: 'Internal Server Error' };
      }
      const capabilities = this.capabilities;
      return { ok: true, status: 200, json: async () => ({ capabilities }) };
    }
    const record = { body: JSON.parse(request.init.body), aborted: false };
    this.generates.push(record);
    const queue: (string | null)[] = [];
    let wake: (() => void) | null = null;
    this.feeds.push(chunk => {
      queue.push(chunk);
      wake?.();
    });
    const signal: AbortSignal = request.init.signal;
    signal.addEventListener('abort', () => {
      record.aborted = true;
      wake?.();
    });
    const reader = {
      read: async (): Promise<{ value?: Uint8Array; done: boolean }> => {
        while (!queue.length && !signal.aborted) {
          await new Promise<void>(resolve => (wake = resolve));
        }
        if (signal.aborted) {
          throw new DOMException('aborted', 'AbortError');
        }
        const chunk = queue.shift()!;
        return chunk === null
          ? { done: true }
          : { value: new TextEncoder().encode(chunk), done: false };
      },
      releaseLock: () => undefined
    };
    return { ok: true, status: 200, body: { getReader: () => reader } };
  }
}

describe('LLMInlineProvider', () => {
  function setUp() {
    const server = new FakeServer();
    const settings = server.settings();
    const state = new CompletionState(async () => undefined, settings);
    state.update({ ...DEFAULT_SETTINGS, model: 'demo', debounceMs: 0 });
    return { server, provider: new LLMInlineProvider(state, settings) };
  }
  it('streams the growing completion', async () => {
    const { server, provider } = setUp();
    const list = await provider.fetch({ text: 'ab', offset: 1 });
    const token = list.items[0].token!;
    const stream = provider.stream(token);
    const first = stream.next();
    await waitFor(() => server.generates.length === 1);
    expect(server.generates[0].body).toMatchObject({ prompt: 'a', suffix: 'b', model: 'demo' });
    server.feed(0, '{"response":"x","done":false}\n');
    expect((await first).value).toEqual({ response: { insertText: 'x', isIncomplete: true } });
    const second = stream.next();
    server.feed(0, '{"response":"y","done":false}\n{"response":"","done":true}\n');
    expect((await second).value).toEqual({ response: { insertText: 'xy', isIncomplete: true } });
    expect((await stream.next()).value).toEqual({
      response: { insertText: 'xy', isIncomplete: false }
    });
    expect((await stream.next()).done).toBe(true);
  });

  it('aborts the request in flight on the next keystroke', async () => {
    const { server, provider } = setUp();
    const list = await provider.fetch({ text: 'a', offset: 1 });
    const stream = provider.stream(list.items[0].token!);
    const first = stream.next();
    await waitFor(() => server.generates.length === 1);
    server.feed(0, '{"response":"x","done":false}\n');
    await first;
    const rest = stream.next();
    await provider.fetch({ text: 'ab', offset: 2 }); // a keystroke
    expect(server.generates[0].aborted).toBe(true);
    expect((await rest).value).toEqual({ response: { insertText: 'x', isIncomplete: false } });
    expect((await stream.next()).done).toBe(true);
  });

  it('asks nothing of a model that cannot insert', async () => {
    const { server, provider } = setUp();
    server.capabilities = ['completion'];
    expect(await provider.fetch({ text: 'a', offset: 1 })).toEqual({ items: [] });
    expect(server.generates).toEqual([]);
  });

  it('reports a failed /api/show and offers nothing', async () => {
    const { server, provider } = setUp();
    server.capabilities = 'fail';
    expect(await provider.fetch({ text: 'a', offset: 1 })).toEqual({ items: [] });
    expect((provider as any).state.error).toMatch(/api\/show: 500/);
  });

  it('cancels a fetch still in its debounce', async () => {
    const { provider } = setUp();
    (provider as any).state.update({ ...DEFAULT_SETTINGS, model: 'demo', debounceMs: 5000 });
    const waiting = provider.fetch({ text: 'a', offset: 1 });
    await waitFor(() => (provider as any).controller !== null);
    const next = provider.fetch({ text: 'ab', offset: 2 });
    expect(await waiting).toEqual({ items: [] });
    provider.cancel();
    expect(await next).toEqual({ items: [] });
  });
});

async function waitFor(check: () => boolean): Promise<void> {
  for (let i = 0; i < 1000 && !check(); i++) {
    await new Promise(resolve => setTimeout(resolve, 1));
  }
  expect(check()).toBe(true);
}
