/**
 * The history's poll: every `interval` while the tab is visible; while it is
 * hidden (`document.visibilityState`) the delay doubles up to `hiddenMax`, and
 * coming back polls at once. A failed fetch backs off the same way. The server
 * keeps the history, so a slow poll loses nothing but freshness.
 */

export interface IVisibilityPollOptions {
  fetch: () => Promise<void>;
  /** Milliseconds between polls while the tab is visible. */
  interval: number;
  /** The longest delay, reached by doubling while hidden or failing. */
  hiddenMax: number;
  doc?: Document;
}

/** The delay after a poll: the interval, or double the last one (capped) when hidden or failed. */
export function nextDelay(
  last: number,
  hidden: boolean,
  failed: boolean,
  interval: number,
  max: number
): number {
  if (!hidden && !failed) {
    return interval;
  }
  return Math.min(max, Math.max(interval, last) * 2);
}

export class VisibilityPoll {
  private timer: ReturnType<typeof setTimeout> | undefined;
  private delay: number;
  private running = false;
  private inFlight = false;
  private readonly doc: Document;
  private readonly onVisibility = () => {
    if (this.running && !this.hidden) {
      this.delay = this.options.interval;
      this.schedule(0); // back in view: fresh data now
    }
  };

  constructor(private options: IVisibilityPollOptions) {
    this.doc = options.doc ?? document;
    this.delay = options.interval;
  }

  /** The delay before the next poll (milliseconds). */
  get currentDelay(): number {
    return this.delay;
  }

  private get hidden(): boolean {
    return this.doc.visibilityState === 'hidden';
  }

  /** Poll now and on; a second start only polls now. */
  start(): void {
    if (!this.running) {
      this.running = true;
      this.doc.addEventListener('visibilitychange', this.onVisibility);
    }
    this.schedule(0);
  }

  stop(): void {
    this.running = false;
    this.doc.removeEventListener('visibilitychange', this.onVisibility);
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private schedule(ms: number): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(), ms);
  }

  private async tick(): Promise<void> {
    if (!this.running || this.inFlight) {
      return;
    }
    this.inFlight = true;
    let failed = false;
    try {
      await this.options.fetch();
    } catch {
      failed = true;
    } finally {
      this.inFlight = false;
    }
    if (this.running) {
      const { interval, hiddenMax } = this.options;
      this.delay = nextDelay(this.delay, this.hidden, failed, interval, hiddenMax);
      this.schedule(this.delay);
    }
  }
}
