/**
 * What the completion provider and the sidebar's completion line share: the
 * settings, whether the chosen model can insert (from `/api/show`), the last
 * error. The sidebar writes a chosen model back through `choose`.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { completionProblem, DEFAULT_SETTINGS, ICompletionSettings } from './completion';

export class CompletionState {
  private _settings: ICompletionSettings = { ...DEFAULT_SETTINGS };
  /** Capabilities by model; null: not installed. Cleared when the model changes. */
  private capabilities = new Map<string, Promise<string[] | null>>();
  private _error: string | null = null;
  private _changed = new Signal<this, void>(this);

  constructor(
    private save: (model: string) => Promise<void>,
    private server: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  get settings(): ICompletionSettings {
    return this._settings;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The last error a completion met, shown in the sidebar until the next change. */
  get error(): string | null {
    return this._error;
  }

  update(settings: ICompletionSettings): void {
    this._settings = settings;
    this._error = null;
    this.capabilities.clear();
    this._changed.emit();
  }

  reportError(message: string): void {
    this._error = message;
    this._changed.emit();
  }

  /** Sets the model in the settings (the Settings Editor shows it too). */
  choose(model: string): Promise<void> {
    return this.save(model);
  }

  /** Why no completion can be made now, or null. */
  async problem(): Promise<string | null> {
    const model = this._settings.model;
    const capabilities = model ? await this.capabilitiesOf(model) : [];
    return completionProblem(this._settings, capabilities);
  }

  /** The installed models' names, for the sidebar's chooser. */
  async installed(): Promise<string[]> {
    const body = (await this.call('api/tags')) as { models?: { name?: string }[] } | null;
    return (body?.models ?? []).map(m => String(m.name ?? '')).filter(Boolean);
  }

  private capabilitiesOf(model: string): Promise<string[] | null> {
    let known = this.capabilities.get(model);
    if (!known) {
      known = this.show(model);
      this.capabilities.set(model, known);
      // a failure is not remembered: the next keystroke asks again
      known.catch(() => this.capabilities.delete(model));
    }
    return known;
  }

  private async show(model: string): Promise<string[] | null> {
    const body = (await this.call('api/show', { model })) as { capabilities?: string[] } | null;
    return body === null ? null : (body.capabilities ?? []);
  }

  /** A GET (no body) or POST; null for a 404 (the model is not there). */
  private async call(path: string, body?: unknown): Promise<unknown> {
    const url = URLExt.join(this.server.baseUrl, 'llm', path);
    const init = body === undefined ? {} : { method: 'POST', body: JSON.stringify(body) };
    const response = await ServerConnection.makeRequest(url, init, this.server);
    if (response.status === 404) {
      return null;
    }
    if (!response.ok) {
      throw new Error(`${path}: ${response.status} ${response.statusText}`);
    }
    return response.json();
  }
}
