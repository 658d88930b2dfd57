/**
 * The pure parts of inline completion: the `/api/generate` body for the text
 * around the cursor, the NDJSON stream's lines, and the settings' bounds.
 * Kept free of JupyterLab so that jest tests them in isolation.
 */

/** The completion settings (schema/completion.json). */
export interface ICompletionSettings {
  enabled: boolean;
  model: string;
  debounceMs: number;
  maxTokens: number;
}

export const DEFAULT_SETTINGS: ICompletionSettings = {
  enabled: true,
  model: '',
  debounceMs: 250,
  maxTokens: 48
};

/** Characters of context sent each side of the cursor: a small model's
 * context holds a few thousand tokens, and the nearest text matters most. */
export const MAX_PREFIX_CHARS = 8000;
export const MAX_SUFFIX_CHARS = 2000;
/** The bounds of the schema, kept here too since a settings file can be edited by hand. */
export const MAX_TOKENS_LIMIT = 512;
export const MAX_DEBOUNCE_MS = 5000;

/** A blank line ends a completion, as in other fill-in-the-middle completers:
 * one block of code, not the rest of the file. */
export const STOP_SEQUENCES = ['\n\n', '\r\n\r\n'];

function clamp(value: unknown, low: number, high: number, fallback: number): number {
  const n = typeof value === 'number' && Number.isFinite(value) ? Math.round(value) : fallback;
  return Math.min(high, Math.max(low, n));
}

/** Settings as read from the registry, each field checked and bounded. */
export function readSettings(raw: Record<string, unknown>): ICompletionSettings {
  return {
    enabled: typeof raw.enabled === 'boolean' ? raw.enabled : DEFAULT_SETTINGS.enabled,
    model: typeof raw.model === 'string' ? raw.model.trim() : '',
    debounceMs: clamp(raw.debounceMs, 0, MAX_DEBOUNCE_MS, DEFAULT_SETTINGS.debounceMs),
    maxTokens: clamp(raw.maxTokens, 1, MAX_TOKENS_LIMIT, DEFAULT_SETTINGS.maxTokens)
  };
}

/** The text before and after the cursor, cut to the nearest characters. */
export function splitAtCursor(text: string, offset: number): { prefix: string; suffix: string } {
  const at = Math.max(0, Math.min(offset, text.length));
  return {
    prefix: text.slice(Math.max(0, at - MAX_PREFIX_CHARS), at),
    suffix: text.slice(at, at + MAX_SUFFIX_CHARS)
  };
}

/**
 * The `/api/generate` body. `raw` sends the prefix as it is when the suffix is
 * empty (the server only uses the model's fill-in-the-middle tokens for a
 * non-empty suffix); a low temperature keeps completions close to the likely.
 */
export function buildRequest(
  settings: ICompletionSettings,
  prefix: string,
  suffix: string
): Record<string, unknown> {
  const body: Record<string, unknown> = {
    model: settings.model,
    prompt: prefix,
    raw: true,
    stream: true,
    options: {
      num_predict: settings.maxTokens,
      temperature: 0.2,
      top_p: 0.9,
      stop: STOP_SEQUENCES
    }
  };
  if (suffix) {
    body.suffix = suffix;
  }
  return body;
}

/** One parsed line of the stream: the text it adds, whether it is the last, an error. */
export interface IStreamPiece {
  text: string;
  done: boolean;
  error?: string;
}

/** Splits NDJSON arriving in arbitrary chunks into whole lines, parsed. */
export class NdjsonLines {
  private pending = '';

  /** The pieces completed by this chunk; a partial line waits for the next. */
  push(chunk: string): IStreamPiece[] {
    this.pending += chunk;
    const lines = this.pending.split('\n');
    this.pending = lines.pop() ?? '';
    return lines.filter(line => line.trim()).map(parseLine);
  }

  /** What is left when the stream ends (a last line without a newline). */
  end(): IStreamPiece[] {
    const rest = this.pending;
    this.pending = '';
    return rest.trim() ? [parseLine(rest)] : [];
  }
}

export function parseLine(line: string): IStreamPiece {
  let value: any;
  try {
    value = JSON.parse(line);
  } catch {
    return { text: '', done: true, error: 'the server sent a line that is not JSON' };
  }
  if (value && typeof value.error === 'string') {
    return { text: '', done: true, error: value.error };
  }
  const text = typeof value?.response === 'string' ? value.response : '';
  return { text, done: value?.done === true };
}

/** Why completion cannot run, or null when it can. */
export function completionProblem(
  settings: ICompletionSettings,
  capabilities: string[] | null
): string | null {
  if (!settings.enabled) {
    return 'Inline completion is turned off (Settings → LLM inline completion).';
  }
  if (!settings.model) {
    return 'No completion model chosen: pick one here or in Settings → LLM inline completion.';
  }
  if (capabilities === null) {
    return `Model ${settings.model} is not installed.`;
  }
  if (!capabilities.includes('insert')) {
    return `Model ${settings.model} cannot insert (its GGUF has no fill-in-the-middle tokens): choose another model for completion.`;
  }
  return null;
}

/** Waits `ms`, or rejects as soon as the signal aborts. */
export function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(new DOMException('aborted', 'AbortError'));
      return;
    }
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(new DOMException('aborted', 'AbortError'));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
