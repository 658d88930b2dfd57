/**
 * The jupyter-llm REST calls the sidebar makes. Every request goes through
 * `ServerConnection.makeRequest`, so JupyterLab adds the token and XSRF header.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IHistory, ISnapshot, toHistory, toSnapshot } from './types';

/** The server answered 404: the jupyter-llm server extension is not loaded. */
export class ExtensionMissingError extends Error {
  constructor() {
    super('the jupyter-llm server extension is not running');
    this.name = 'ExtensionMissingError';
  }
}

export class LLMClient {
  constructor(private settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /**
   * One call; the parsed JSON body (null when there is none). With
   * `missingOn404`, a 404 means no route: the server extension is not loaded.
   */
  private async request(
    path: string,
    init: RequestInit = {},
    missingOn404 = false
  ): Promise<unknown> {
    const url = URLExt.join(this.settings.baseUrl, 'llm', path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new ServerConnection.NetworkError(error as TypeError);
    }
    if (response.status === 404 && missingOn404) {
      throw new ExtensionMissingError();
    }
    const text = await response.text();
    let body: any = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      // not JSON: fall through to the status check with the raw text
    }
    if (!response.ok) {
      const message =
        (body && (body.error?.message ?? body.error ?? body.message)) ||
        `${response.status} ${response.statusText}`;
      throw new ServerConnection.ResponseError(response, String(message));
    }
    return body;
  }

  /** `/api/devices` and `/api/ps` together; a missing extension wins over other errors. */
  async snapshot(): Promise<ISnapshot> {
    const [devices, ps] = await Promise.allSettled([
      this.request('api/devices', {}, true),
      this.request('api/ps', {}, true)
    ]);
    const failures = [devices, ps].filter(r => r.status === 'rejected');
    const missing = failures.find(r => r.reason instanceof ExtensionMissingError);
    if (missing || failures.length) {
      throw (missing ?? failures[0]).reason;
    }
    return toSnapshot(
      (devices as PromiseFulfilledResult<unknown>).value,
      (ps as PromiseFulfilledResult<unknown>).value
    );
  }

  /** `/api/history`, merged server-side into at most `points` points. */
  async history(points: number): Promise<IHistory> {
    return toHistory(await this.request(`api/history?points=${points}`, {}, true));
  }

  /** Unload at once, as Ollama does for a generate with keep_alive 0. */
  async unload(model: string): Promise<void> {
    await this.request('api/generate', {
      method: 'POST',
      body: JSON.stringify({ model, keep_alive: 0 })
    });
  }
}
