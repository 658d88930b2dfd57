/**
 * The left-sidebar widget: polls the server with a Lumino `Poll` (backoff on
 * errors, standby while the panel or the browser tab is hidden) and feeds
 * `SidebarView`.
 */
import { Poll } from '@lumino/polling';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import { LabIcon } from '@jupyterlab/ui-components';

import { ExtensionMissingError, LLMClient } from './api';
import { HistoryView } from './history';
import { VisibilityPoll } from './history_poll';
import { SidebarView } from './view';

export const SIDEBAR_ID = 'jupyter-llm-sidebar';

/** Points asked of /api/history: two samples a point over ten minutes, for a 240-wide chart. */
const HISTORY_POINTS = 150;
/** The slowest history poll while the browser tab is hidden. */
const HIDDEN_MAX = 60 * 1000;

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 2h2v3h2V2h2v3h2V2h2v3a2 2 0 0 1 2 2v2h3v2h-3v2h3v2h-3v2a2 2 0 0 1-2 2v3h-2v-3h-2v3h-2v-3H9v3H7v-3a2 2 0 0 1-2-2v-2H2v-2h3v-2H2V9h3V7a2 2 0 0 1 2-2zm0 5v10h10V7zm2 2h6v6H9z"/>
  </g>
</svg>`;

export const llmIcon = new LabIcon({ name: 'jupyter-llm:devices', svgstr: ICON_SVG });

export interface ISidebarOptions {
  client?: LLMClient;
  /** Milliseconds between polls (default 2000). */
  interval?: number;
}

export class LLMSidebar extends Widget {
  readonly view: SidebarView;
  readonly poll: Poll;
  readonly history: HistoryView;
  readonly historyPoll: VisibilityPoll;
  private client: LLMClient;
  private clock: number | undefined;
  /** Numbers each fetch: a refresh can overtake one in flight, and an older
   * answer must not be drawn over a newer one. */
  private fetches = 0;
  /** Sections other plugins add below the view (inline completion's). */
  private sections: { node: HTMLElement; refresh(): Promise<void> }[] = [];

  constructor(options: ISidebarOptions = {}) {
    super();
    this.id = SIDEBAR_ID;
    this.addClass('jp-LLM-panel');
    this.title.icon = llmIcon;
    this.title.caption = 'LLM devices';
    this.client = options.client ?? new LLMClient();
    this.view = new SidebarView({
      unload: name => this.client.unload(name),
      refresh: () => void this.poll.refresh()
    });
    this.node.appendChild(this.view.node);
    this.history = new HistoryView();
    this.node.appendChild(this.history.node);
    const interval = options.interval ?? 2000;
    this.historyPoll = new VisibilityPoll({
      fetch: () => this.fetchHistory(),
      interval,
      hiddenMax: HIDDEN_MAX
    });
    this.poll = new Poll({
      auto: false,
      factory: () => this.fetch(),
      frequency: { interval, backoff: true, max: 30 * 1000 },
      name: 'jupyter-llm:sidebar',
      standby: () => !this.isVisible || document.hidden
    });
  }

  private async fetch(): Promise<void> {
    const fetch = ++this.fetches;
    try {
      const snapshot = await this.client.snapshot();
      if (fetch !== this.fetches) {
        return;
      }
      this.view.update({ kind: 'ready', snapshot });
      this.history.setLoaded(snapshot.models.map(m => m.name));
    } catch (error) {
      if (fetch !== this.fetches) {
        return;
      }
      if (error instanceof ExtensionMissingError) {
        this.view.update({ kind: 'missing' });
      } else {
        const message = error instanceof Error ? error.message : String(error);
        this.view.update({ kind: 'error', message });
      }
      throw error; // the Poll backs off
    }
  }

  /** The server's history; the section stays hidden until one arrives. */
  private async fetchHistory(): Promise<void> {
    this.history.update(await this.client.history(HISTORY_POINTS));
  }

  /** Appends a section, refreshed whenever the sidebar is shown. */
  addSection(section: { node: HTMLElement; refresh(): Promise<void> }): void {
    this.sections.push(section);
    this.node.appendChild(section.node);
    void section.refresh();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.sections.forEach(section => void section.refresh());
    void this.poll.start().then(() => this.poll.refresh());
    this.historyPoll.start();
    // countdowns move every second between polls
    this.clock = window.setInterval(() => this.view.tick(), 1000);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    window.clearInterval(this.clock);
    this.clock = undefined;
    this.historyPoll.stop();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearInterval(this.clock);
    this.historyPoll.stop();
    this.poll.dispose();
    super.dispose();
  }
}
