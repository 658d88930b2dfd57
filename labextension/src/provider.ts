/**
 * The inline completion provider: JupyterLab asks `fetch` on each keystroke,
 * which cancels the request before it, waits the debounce and hands back a
 * token; `stream(token)` then yields the growing completion from
 * `/api/generate`. Aborting the fetch closes the connection, and the server
 * cancels the generation when its client goes.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import type {
  CompletionHandler,
  IInlineCompletionItem,
  IInlineCompletionList,
  IInlineCompletionProvider
} from '@jupyterlab/completer';

import { abortableDelay, buildRequest, NdjsonLines, splitAtCursor } from './completion';
import { CompletionState } from './completion_state';

export const PROVIDER_ID = 'jupyter-llm:inline';

interface IPending {
  body: Record<string, unknown>;
  controller: AbortController;
}

export class LLMInlineProvider implements IInlineCompletionProvider {
  readonly name = 'jupyter-llm';
  readonly identifier = PROVIDER_ID;
  /** Fill-in-the-middle is what the model does: complete in the middle of a
   * line too (JupyterLab's default skips it). */
  readonly schema = { default: { autoFillInMiddle: true } };
  private controller: AbortController | null = null;
  private pending = new Map<string, IPending>();
  private tokens = 0;

  constructor(
    private state: CompletionState,
    private server: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  /** Cancels whatever is in flight: a keystroke makes it stale. */
  cancel(): void {
    this.controller?.abort();
    this.controller = null;
    this.pending.clear();
  }

  /** The context (notebook cell or file editor) does not matter: both complete the same way. */
  async fetch(request: CompletionHandler.IRequest): Promise<IInlineCompletionList> {
    this.cancel();
    const controller = new AbortController();
    this.controller = controller;
    const settings = this.state.settings;
    try {
      if ((await this.state.problem()) !== null) {
        return { items: [] }; // the sidebar says why
      }
    } catch (error) {
      this.state.reportError(error instanceof Error ? error.message : String(error));
      return { items: [] };
    }
    try {
      await abortableDelay(settings.debounceMs, controller.signal);
    } catch {
      return { items: [] };
    }
    const { prefix, suffix } = splitAtCursor(request.text, request.offset);
    const token = String(++this.tokens);
    this.pending.set(token, { body: buildRequest(settings, prefix, suffix), controller });
    return { items: [{ insertText: '', isIncomplete: true, token }] };
  }

  async *stream(token: string): AsyncGenerator<{ response: IInlineCompletionItem }> {
    const pending = this.pending.get(token);
    this.pending.delete(token);
    if (!pending || pending.controller.signal.aborted) {
      return;
    }
    let text = '';
    try {
      for await (const piece of this.generate(pending)) {
        if (piece.error) {
          this.state.reportError(piece.error);
          break;
        }
        text += piece.text;
        yield { response: { insertText: text, isIncomplete: !piece.done } };
        if (piece.done) {
          return;
        }
      }
    } catch (error) {
      if (!pending.controller.signal.aborted) {
        this.state.reportError(error instanceof Error ? error.message : String(error));
      }
    }
    yield { response: { insertText: text, isIncomplete: false } };
  }

  /** The stream's pieces as they arrive; ends early once aborted. */
  private async *generate(pending: IPending) {
    const url = URLExt.join(this.server.baseUrl, 'llm', 'api', 'generate');
    const init = {
      method: 'POST',
      body: JSON.stringify(pending.body),
      signal: pending.controller.signal
    };
    const response = await ServerConnection.makeRequest(url, init, this.server);
    if (!response.ok || !response.body) {
      const detail = await response.text();
      let message = `${response.status} ${response.statusText}`;
      try {
        message = JSON.parse(detail).error ?? message;
      } catch {
        // keep the status line
      }
      throw new Error(String(message));
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const lines = new NdjsonLines();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          yield* lines.end();
          return;
        }
        yield* lines.push(decoder.decode(value, { stream: true }));
      }
    } finally {
      reader.releaseLock();
    }
  }
}
