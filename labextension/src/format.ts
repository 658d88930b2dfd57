/**
 * Pure presentation rules: byte sizes, Ollama's PROCESSOR and UNTIL columns,
 * and how a device's memory splits into stacked-bar segments. No DOM, no
 * JupyterLab imports, so Jest tests them as plain functions.
 */
import { ILoadedModel, IModelUser } from './types';

export type SegmentKind = 'weights' | 'kv_cache' | 'graph' | 'other' | 'free';

export interface ISegment {
  kind: SegmentKind;
  /** Index of the model in the /api/ps list (its colour); -1 for other/free. */
  model: number;
  label: string;
  bytes: number;
}

/** How each kind of segment is named in tooltips and the legend. */
export const KIND_LABELS: Record<SegmentKind, string> = {
  weights: 'weights',
  kv_cache: 'KV cache',
  graph: 'graph',
  other: 'other use',
  free: 'free'
};

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;

/** "12.3 GiB", "512 MiB", "3 KiB": binary units, as nvidia-smi and Ollama use. */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes <= 0) {
    return '0 B';
  }
  if (bytes >= GIB) {
    return `${(bytes / GIB).toFixed(bytes >= 100 * GIB ? 0 : 1)} GiB`;
  }
  if (bytes >= MIB) {
    return `${Math.round(bytes / MIB)} MiB`;
  }
  if (bytes >= 1024) {
    return `${Math.round(bytes / 1024)} KiB`;
  }
  return `${Math.round(bytes)} B`;
}

/**
 * Where a model runs, as Ollama's `ps` PROCESSOR column writes it:
 * "100% GPU", "100% CPU" or "48%/52% CPU/GPU". Every layer on a GPU reads as
 * 100% GPU though system RAM still holds buffers (token embeddings, the host's
 * compute buffer, logits); otherwise the memory split, where a side that rounds
 * to 0% reads as 100% on the other. Same rule as `jupyter llm ps`.
 */
export function processor(
  model: Pick<ILoadedModel, 'size' | 'size_vram' | 'num_layers' | 'num_gpu_layers'>
): string {
  const { size, size_vram: vram } = model;
  if (!size || !vram) {
    return '100% CPU';
  }
  const layers = model.num_layers ?? 0;
  if (layers && (model.num_gpu_layers ?? 0) >= layers) {
    return '100% GPU';
  }
  const gpu = Math.round((100 * vram) / size);
  if (gpu >= 100) {
    return '100% GPU';
  }
  if (gpu <= 0) {
    return '100% CPU';
  }
  return `${100 - gpu}%/${gpu}% CPU/GPU`;
}

/**
 * The CPU threads of a model with layers on the CPU as its last request
 * ended: "2 threads", or "1 of 2 threads" when other work held cores then (a
 * runner at the default count moves between 1 and the count it loaded with). '' for a model wholly on GPUs, or
 * where the server does not say.
 */
export function threadsText(
  model: Pick<ILoadedModel, 'size' | 'size_vram' | 'num_layers' | 'num_gpu_layers' | 'threads'>
): string {
  const threads = model.threads;
  if (!threads || !(threads.loaded > 0) || processor(model) === '100% GPU') {
    return '';
  }
  const now = threads.now > 0 && threads.now < threads.loaded ? threads.now : threads.loaded;
  const unit = threads.loaded === 1 ? 'thread' : 'threads';
  return now < threads.loaded ? `${now} of ${threads.loaded} ${unit}` : `${now} ${unit}`;
}

/** Seconds left before a model unloads; Infinity when it is kept loaded. */
export function secondsLeft(expiresAt: string, now: number): number {
  const then = Date.parse(expiresAt);
  if (Number.isNaN(then)) {
    return NaN;
  }
  // Ollama reports "keep loaded forever" as a date centuries ahead.
  if (then - now > 10 * 365 * 86400 * 1000) {
    return Infinity;
  }
  return Math.max(0, Math.round((then - now) / 1000));
}

/** The UNTIL column: "unloads in 4:05", "kept loaded", "unloading…". */
export function countdown(expiresAt: string, now: number): string {
  const left = secondsLeft(expiresAt, now);
  if (Number.isNaN(left)) {
    return '';
  }
  if (left === Infinity) {
    return 'kept loaded';
  }
  if (left <= 0) {
    return 'unloading…';
  }
  const hours = Math.floor(left / 3600);
  const minutes = Math.floor((left % 3600) / 60);
  const seconds = left % 60;
  const mmss = `${minutes}:${String(seconds).padStart(2, '0')}`;
  return hours
    ? `unloads in ${hours}:${String(minutes).padStart(2, '0')}:${String(seconds).padStart(2, '0')}`
    : `unloads in ${mmss}`;
}

/**
 * Who holds a model on a shared engine: "In use by alice (1 running), bob
 * (2 running, 3 queued)". Empty when nobody does, and when the only holder is
 * `local`, a plain server's one user (who knows).
 */
export function holdersText(users: IModelUser[] | undefined): string {
  const shown = (users ?? []).filter(u => u.running > 0 || u.queued > 0);
  if (!shown.length || (shown.length === 1 && shown[0].name === 'local')) {
    return '';
  }
  const each = shown.map(u => {
    const counts = [u.running ? `${u.running} running` : '', u.queued ? `${u.queued} queued` : ''];
    return `${u.name} (${counts.filter(Boolean).join(', ')})`;
  });
  return `In use by ${each.join(', ')}`;
}

/**
 * How `device`'s memory splits: each loaded model's weights, KV cache and
 * graph (in /api/ps order), then memory used by anything else, then free.
 * Segments of zero bytes are dropped; free is kept so a bar is never empty.
 */
export function memorySegments(
  device: string,
  total: number,
  free: number,
  models: ILoadedModel[]
): ISegment[] {
  const segments: ISegment[] = [];
  let ours = 0;
  models.forEach((model, index) => {
    for (const allocation of model.allocations ?? []) {
      if (allocation.device !== device) {
        continue;
      }
      for (const kind of ['weights', 'kv_cache', 'graph'] as const) {
        const bytes = Math.max(0, allocation[kind] ?? 0);
        if (bytes > 0) {
          segments.push({
            kind,
            model: index,
            label: `${model.name} ${KIND_LABELS[kind]}`,
            bytes
          });
          ours += bytes;
        }
      }
    }
  });
  const used = Math.max(0, total - free);
  const other = Math.max(0, used - ours);
  if (other > 0) {
    segments.push({ kind: 'other', model: -1, label: KIND_LABELS.other, bytes: other });
  }
  segments.push({
    kind: 'free',
    model: -1,
    label: KIND_LABELS.free,
    bytes: Math.max(0, total - ours - other)
  });
  return segments;
}

/** Each segment's share of the bar in percent; they add up to at most 100. */
export function segmentWidths(segments: ISegment[], total: number): number[] {
  const sum = segments.reduce((acc, s) => acc + s.bytes, 0);
  const scale = Math.max(total, sum, 1);
  return segments.map(s => (100 * s.bytes) / scale);
}
