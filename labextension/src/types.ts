/** Wire types of the jupyter-llm REST API (`{baseUrl}llm/api/...`). */

/** One device from `GET /api/devices` (memory in bytes). */
export interface IDevice {
  id: string;
  library: string; // CUDA, ROCm, Vulkan, Metal, CPU
  name: string;
  description?: string;
  integrated?: boolean;
  total_memory: number;
  free_memory: number;
  node?: string; // the cluster node it is on ("" or absent: this server's machine)
}

/** A machine devices are on: this server's own (id "") or a Ray cluster node. */
export interface INode {
  id: string;
  name: string;
  address?: string;
  devices: string[]; // ids of its devices
}

export interface ISystemMemory {
  total_memory: number;
  free_memory: number;
  free_swap?: number;
  threads?: number;
}

/** Something wrong with the GPU setup, and the command that fixes it. */
export interface INotice {
  kind: string; // idle_gpu, runner_failed
  message: string;
  fix: string;
}

export interface IDevicesReply {
  devices: IDevice[];
  system: ISystemMemory;
  simulated?: boolean;
  notices?: INotice[];
  nodes?: INode[];
}

/** Memory one loaded model holds on one device. */
export interface IAllocation {
  device: string; // a device id, or "cpu" for system RAM
  weights: number;
  kv_cache: number;
  graph: number;
  measured?: boolean;
}

/** Who holds a loaded model (`/api/ps` `users`): requests running, queued. */
export interface IModelUser {
  name: string;
  running: number;
  queued: number;
}

/** One model from `GET /api/ps`. */
export interface ILoadedModel {
  name: string;
  model: string;
  size: number;
  size_vram: number;
  digest?: string;
  expires_at: string;
  context_length?: number;
  num_gpu_layers?: number;
  num_layers?: number;
  allocations?: IAllocation[];
  users?: IModelUser[];
  threads?: IThreads;
}

/**
 * The CPU threads a model decodes with: as its last request ended, as it
 * loaded, and whether it moves between 1 and that while other work holds
 * the cores.
 */
export interface IThreads {
  now: number;
  loaded: number;
  adaptive: boolean;
}

export interface IPsReply {
  models: ILoadedModel[];
}

/** What the sidebar shows: a snapshot of both endpoints. */
export interface ISnapshot {
  devices: IDevicesReply;
  models: ILoadedModel[];
}

/** The allocation id that stands for system RAM. */
export const CPU_DEVICE = 'cpu';

/**
 * Check the two replies' shape (a proxy's HTML page or another server's JSON
 * must not reach the view) and join them.
 */
export function toSnapshot(devices: unknown, ps: unknown): ISnapshot {
  const d = devices as IDevicesReply | null;
  const p = ps as IPsReply | null;
  if (
    !d ||
    !Array.isArray(d.devices) ||
    typeof d.system?.total_memory !== 'number' ||
    !p ||
    !Array.isArray(p.models)
  ) {
    throw new Error('the server sent a reply that is not from jupyter-llm');
  }
  return { devices: d, models: p.models };
}

/** One moment of `GET /api/history` (memory in bytes, time in unix seconds). */
export interface IHistorySample {
  t: number;
  memory: Record<string, Record<string, number>>; // device id -> model -> bytes
  utilization: Record<string, number>; // device id -> percent busy (NVML, or simulated)
  tokens_per_second: Record<string, number>; // model -> generated tokens per second
}

/** `GET /api/history`: the server's last `window` seconds, oldest sample first. */
export interface IHistory {
  interval: number;
  window: number;
  sampling: boolean;
  devices: { id: string; name: string; library: string; total_memory: number }[];
  samples: IHistorySample[];
}

/** Check `/api/history`'s shape, as `toSnapshot` does for the other two. */
export function toHistory(body: unknown): IHistory {
  const h = body as IHistory | null;
  if (!h || !Array.isArray(h.samples) || !Array.isArray(h.devices) || !(h.window > 0)) {
    throw new Error('the server sent a history that is not from jupyter-llm');
  }
  return h;
}
