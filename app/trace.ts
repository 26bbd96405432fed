// `percept trace`: a percept recording → the Chrome Trace Event format (JSON), which Perfetto (ui.perfetto.dev) and
// chrome://tracing open. One process per camera (source id), one thread per stage. Each span is a complete event
// ('X', ts and dur in µs on the run's clock) named after its frame. Drops, cancels, degrade steps and errors are
// instant events ('i') with their reason. Process and thread names are metadata events ('M').
// Two spans of one stage that overlap go on separate lanes ("decode #2"), so every thread's slices nest.
// How to open it: docs/observability.md
import { writeFileSync } from 'node:fs';
import { McapFile } from '../nodes/mcap-read.ts';
import { EVENTS_TOPIC } from '../nodes/recorder.ts';

/** One event of the Chrome Trace Event format, as this file writes them. */
export interface TraceEvent {
  readonly name: string;
  readonly ph: 'X' | 'i' | 'M';
  /** µs from the first event of the recording. */
  readonly ts: number;
  readonly pid: number;
  readonly tid: number;
  /** µs ('X' only). */
  readonly dur?: number;
  readonly cat?: string;
  /** Instant scope: 't' thread, 'p' process ('i' only). */
  readonly s?: 't' | 'p';
  readonly args?: Readonly<Record<string, unknown>>;
}

export interface ChromeTrace {
  readonly traceEvents: TraceEvent[];
  readonly displayTimeUnit: 'ms';
  readonly otherData: Readonly<Record<string, string>>;
}

export interface TraceResult {
  readonly trace: ChromeTrace;
  readonly frames: number;
  readonly spans: number;
  readonly instants: number;
  /** Threads (lanes) over all processes. */
  readonly tracks: number;
  /** Warnings about the recording itself (damaged, unfinished). */
  readonly warnings: readonly string[];
}

/** A telemetry event as the recorder stores it: JSON, bigints as decimal strings. */
type Recorded = Record<string, unknown> & { readonly type: string };

const big = (v: unknown): bigint => BigInt(v as string | number | bigint);
const RUN_PROCESS = 'percept';
/** The `percept.run` metadata keys the trace carries in otherData. */
const RUN_KEYS = ['run_id', 'percept_version', 'clock', 'lockstep', 'source', 'started_unix_ns'];

/** Reads the /events topic of a percept recording (a damaged one as far as it is valid). */
export async function readRecordedEvents(
  path: string,
): Promise<{ events: Recorded[]; metadata: Record<string, string>; warnings: string[] }> {
  const file = await McapFile.open(path);
  const events: Recorded[] = [];
  const warnings: string[] = [];
  let metadata: Record<string, string> = {};
  if (file.summaryError) warnings.push(`${path}: ${file.summaryError}`);
  if (file.end && !file.end.complete)
    warnings.push(`${path}: valid up to byte ${file.end.validBytes} of ${file.end.fileBytes}: ${file.end.reason}`);
  const decoder = new TextDecoder();
  try {
    for await (const event of file.read()) {
      if (event.kind === 'metadata') {
        if (event.metadata.name === 'percept.run') metadata = Object.fromEntries(event.metadata.metadata);
      } else if (event.kind === 'badChunk') {
        warnings.push(`${path}: the chunk at byte ${event.offset} was skipped: ${event.reason}`);
      } else if (file.channels.get(event.message.channelId)?.topic === EVENTS_TOPIC) {
        events.push(JSON.parse(decoder.decode(event.message.data)) as Recorded);
      }
    }
  } finally {
    await file.close();
  }
  return { events, metadata, warnings };
}

interface Lane {
  readonly tid: number;
  endNs: bigint;
}

/** Telemetry events (as recorded, or live with bigints) → a Chrome trace. Pure. */
export function eventsToTrace(events: readonly Recorded[], otherData: Readonly<Record<string, string>> = {}): TraceResult {
  // Pass 1: each frame's source, the stage order, the time origin.
  const sourceOf = new Map<number, string>();
  const stageOrder: string[] = [];
  let origin: bigint | undefined;
  const seeTime = (ns: bigint) => {
    if (origin === undefined || ns < origin) origin = ns;
  };
  for (const e of events) {
    if (e.type === 'stats') continue;
    if (e.atNs !== undefined) seeTime(big(e.atNs));
    if (e.type === 'frame') {
      sourceOf.set(e.frameId as number, e.sourceId as string);
      seeTime(big(e.captureNs));
    } else if (e.type === 'span') {
      seeTime(big(e.enterNs));
      if (!stageOrder.includes(e.stage as string)) stageOrder.push(e.stage as string);
    }
  }
  const zero = origin ?? 0n;
  const us = (ns: bigint): number => Number(ns - zero) / 1000;

  // Processes (cameras in order of their first frame) and threads (stages in order, lanes on demand).
  const meta: TraceEvent[] = [];
  const pids = new Map<string, number>();
  const pidOf = (source: string): number => {
    let pid = pids.get(source);
    if (pid === undefined) {
      pid = pids.size + 1;
      pids.set(source, pid);
      const name = source === RUN_PROCESS ? RUN_PROCESS : `camera ${source}`;
      meta.push({ name: 'process_name', ph: 'M', ts: 0, pid, tid: 0, args: { name } });
      meta.push({ name: 'process_sort_index', ph: 'M', ts: 0, pid, tid: 0, args: { sort_index: pid } });
    }
    return pid;
  };
  for (const source of new Set(sourceOf.values())) pidOf(source);
  const lanes = new Map<string, Lane[]>(); // `${pid} ${stage}` → its lanes
  let tracks = 0;
  const sortIndex = (stage: string, lane: number): number => {
    const at = stageOrder.indexOf(stage);
    return (at < 0 ? (stage === 'source' ? -1 : stageOrder.length) : at) * 16 + lane;
  };
  const laneAt = (pid: number, stage: string, k: number): Lane => {
    const key = `${pid} ${stage}`;
    const list = lanes.get(key) ?? [];
    lanes.set(key, list);
    while (list.length <= k) {
      tracks += 1;
      const tid = tracks;
      const name = list.length === 0 ? stage : `${stage} #${list.length + 1}`;
      meta.push({ name: 'thread_name', ph: 'M', ts: 0, pid, tid, args: { name } });
      meta.push({ name: 'thread_sort_index', ph: 'M', ts: 0, pid, tid, args: { sort_index: sortIndex(stage, list.length) } });
      list.push({ tid, endNs: -1n });
    }
    return list[k]!;
  };
  const processOf = (frameId: unknown): number =>
    pidOf(typeof frameId === 'number' && sourceOf.has(frameId) ? sourceOf.get(frameId)! : RUN_PROCESS);

  // Pass 2: spans in order of entry, each on the first lane of its stage that is free.
  const body: TraceEvent[] = [];
  const spans = events
    .filter((e) => e.type === 'span')
    .sort((a, b) => {
      const d = big(a.enterNs) - big(b.enterNs);
      return d < 0n ? -1 : d > 0n ? 1 : 0;
    });
  for (const e of spans) {
    const pid = processOf(e.frameId);
    const stage = e.stage as string;
    const enterNs = big(e.enterNs);
    const exitNs = big(e.exitNs);
    let k = 0;
    while (laneAt(pid, stage, k).endNs > enterNs) k += 1;
    const lane = laneAt(pid, stage, k);
    lane.endNs = exitNs;
    body.push({
      name: `frame ${e.frameId as number}`,
      cat: stage,
      ph: 'X',
      ts: us(enterNs),
      dur: Number(exitNs - enterNs) / 1000,
      pid,
      tid: lane.tid,
      args: { frame: e.frameId, stage, degradeLevel: e.degradeLevel },
    });
  }
  // Instants: on their stage's first lane, or process-wide.
  let instants = 0;
  const instant = (e: Recorded, name: string, stage: string | undefined, args: Record<string, unknown>): void => {
    const pid = processOf(e.frameId);
    const onThread = stage !== undefined;
    const tid = onThread ? laneAt(pid, stage, 0).tid : 0;
    instants += 1;
    body.push({ name, cat: e.type, ph: 'i', s: onThread ? 't' : 'p', ts: us(big(e.atNs)), pid, tid, args });
  };
  for (const e of events) {
    if (e.type === 'drop') {
      instant(e, `drop: ${e.reason as string}`, e.stage as string, {
        frame: e.frameId,
        reason: e.reason,
        detail: e.detail,
        ...(e.cause !== undefined ? { cause: e.cause } : {}),
      });
    } else if (e.type === 'cancel') {
      instant(e, `cancel: ${e.reason as string}`, e.stage as string, { frame: e.frameId, reason: e.reason, detail: e.detail });
    } else if (e.type === 'degrade') {
      const { from, to, direction, reason, predictedMs, limitMs } = e;
      instant(e, `degrade ${from as number}→${to as number}`, undefined, {
        frame: e.frameId,
        from,
        to,
        direction,
        reason,
        predictedMs,
        limitMs,
      });
    } else if (e.type === 'error') {
      const frame = e.frameId as number;
      instant(e, 'error', frame >= 0 ? (e.stage as string) : undefined, { frame, stage: e.stage, message: e.message });
    }
  }
  // Sorted by time, so every thread's events are in order; at one time a slice comes before the instants in it.
  body.sort((a, b) => a.ts - b.ts || (a.ph === b.ph ? 0 : a.ph === 'X' ? -1 : 1));
  return {
    trace: { traceEvents: [...meta, ...body], displayTimeUnit: 'ms', otherData: { ...otherData, origin_ns: zero.toString() } },
    frames: sourceOf.size,
    spans: spans.length,
    instants,
    tracks,
    warnings: [],
  };
}

/** The trace as text: one event a line, so a large trace stays readable and diffable. */
export function formatTrace(trace: ChromeTrace): string {
  const lines = trace.traceEvents.map((e) => JSON.stringify(e));
  return `{"displayTimeUnit":"ms","otherData":${JSON.stringify(trace.otherData)},"traceEvents":[\n${lines.join(',\n')}\n]}\n`;
}

/** Reads `recording` and writes its trace to `out` (default: the recording's path with .trace.json). */
export async function traceRecording(opts: { recording: string; out?: string }): Promise<Omit<TraceResult, 'trace'> & { out: string }> {
  const out = opts.out ?? `${opts.recording.replace(/\.mcap$/i, '')}.trace.json`;
  const { events, metadata, warnings } = await readRecordedEvents(opts.recording);
  const otherData: Record<string, string> = { generator: 'percept trace', recording: opts.recording };
  for (const key of RUN_KEYS) if (metadata[key] !== undefined) otherData[`run.${key}`] = metadata[key];
  const { trace, ...rest } = eventsToTrace(events, otherData);
  writeFileSync(out, formatTrace(trace));
  return { ...rest, warnings, out };
}
