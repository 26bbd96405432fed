// `percept eval`: replays a bag in lockstep on the virtual clock, records the run and measures the recording.
// Lockstep processes every frame, the same way each time.
// Metrics: schema-valid rate, accuracy against labels, deadline misses, drops, per-stage latency quantiles.
// Latencies are labelled measured (real clock) or modelled (virtual clock: fixed or sampled stage costs).
// With a reference config, such as the F16 decoder next to Q4_K_M, also the token agreement of the two.
// It writes metrics.json and report.html (app/eval/report.ts) into --out.
// `--fail-under valid=0.99,accuracy=0.8,miss=0.05` exits 2 when a metric is on the wrong side.
// Valid, accuracy, iou and agreement are minimums, and miss is a maximum.
// `percept compare A B` puts two eval outputs side by side.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import cliProgress from 'cli-progress';
import { loadConfig, type PerceptConfig } from '../../pipeline/config.ts';
import { costsPerLevel, isDistribution } from '../../pipeline/service-time.ts';
import type { Graph } from '../../pipeline/graph/graph.ts';
import type { RunSummary } from '../../pipeline/telemetry/events.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { McapFile } from '../../nodes/mcap-read.ts';
import { ACTIONS_TOPIC, EVENTS_TOPIC, STATS_TOPIC } from '../../nodes/recorder.ts';
import { loadLabels, type Label } from './labels.ts';
import { quantile } from '../stats.ts';
import { executeRun, runConfig } from '../run/run.ts';
import { renderReport } from './report.ts';
import type { Accuracy, EvalMetrics, EvalSeries, LatencyKind, StageCost, StageQuantiles, Timing, TokenAgreement } from './metrics.ts';

const log = (msg: string) => process.stderr.write(`percept: ${msg}\n`);

// ---- what a recording holds ----------------------------------------------------------------------

interface RecordedFrame {
  readonly frameId: number;
  readonly stampNs: bigint;
  readonly captureNs: bigint;
  action?: Record<string, unknown>;
  latencyMs?: number;
  late?: boolean;
  drop?: { readonly reason: string; readonly stage: string; readonly detail: string };
  tokens?: readonly number[];
}

/** The run as its recording tells it. */
export interface Recording {
  readonly frames: ReadonlyMap<number, RecordedFrame>;
  /** stage → durations (ms) of its calls, in stage order. */
  readonly spans: ReadonlyMap<string, number[]>;
  /** The run's final summary (its last /stats message). */
  readonly summary: RunSummary | undefined;
  readonly metadata: Readonly<Record<string, string>>;
  /** Warnings about the recording itself (damaged, unfinished). */
  readonly warnings: readonly string[];
}

const big = (v: unknown): bigint => BigInt(v as string);

/** Reads a percept recording (a crashed one too, as far as it is valid). */
export async function readRecording(path: string): Promise<Recording> {
  const file = await McapFile.open(path);
  const frames = new Map<number, RecordedFrame>();
  const spans = new Map<string, number[]>();
  const warnings: string[] = [];
  if (file.summaryError) warnings.push(`${path}: ${file.summaryError}`);
  if (file.end && !file.end.complete)
    warnings.push(`${path}: valid up to byte ${file.end.validBytes} of ${file.end.fileBytes}: ${file.end.reason}`);
  let summary: RunSummary | undefined;
  let metadata: Record<string, string> = {};
  const decoder = new TextDecoder();
  const frameOf = (id: number): RecordedFrame | undefined => frames.get(id);
  try {
    for await (const event of file.read()) {
      if (event.kind === 'metadata') {
        if (event.metadata.name === 'percept.run') metadata = Object.fromEntries(event.metadata.metadata);
        continue;
      }
      if (event.kind === 'badChunk') {
        warnings.push(`${path}: the chunk at byte ${event.offset} was skipped: ${event.reason}`);
        continue;
      }
      const { message } = event;
      const topic = file.channels.get(message.channelId)?.topic;
      if (topic === ACTIONS_TOPIC) {
        const frame = frameOf(message.sequence);
        if (frame) frame.action = JSON.parse(decoder.decode(message.data)) as Record<string, unknown>;
      } else if (topic === STATS_TOPIC) {
        summary = JSON.parse(decoder.decode(message.data)) as RunSummary;
      } else if (topic === EVENTS_TOPIC) {
        const e = JSON.parse(decoder.decode(message.data)) as Record<string, unknown> & { type: string; frameId: number };
        if (e.type === 'frame') {
          frames.set(e.frameId, { frameId: e.frameId, stampNs: big(e.stampNs ?? e.captureNs), captureNs: big(e.captureNs) });
        } else if (e.type === 'span') {
          const list = spans.get(e.stage as string) ?? [];
          list.push(Number(big(e.exitNs) - big(e.enterNs)) / 1e6);
          spans.set(e.stage as string, list);
        } else if (e.type === 'output') {
          const frame = frameOf(e.frameId);
          if (frame) Object.assign(frame, { latencyMs: Number(big(e.latencyNs)) / 1e6, late: e.late === true });
        } else if (e.type === 'drop') {
          const frame = frameOf(e.frameId);
          if (frame) frame.drop = { reason: e.reason as string, stage: e.stage as string, detail: e.detail as string };
        } else if (e.type === 'note' && e.message === 'decode') {
          const data = e.data as Record<string, unknown> | undefined;
          const frame = frameOf(e.frameId);
          if (frame && typeof data?.tokenIds === 'string') frame.tokens = data.tokenIds === '' ? [] : data.tokenIds.split(' ').map(Number);
        }
      }
    }
  } finally {
    await file.close();
  }
  return { frames, spans, summary, metadata, warnings };
}

// ---- metrics -------------------------------------------------------------------------------------

const ratio = (a: number, b: number): number | null => (b > 0 ? a / b : null);
const round = (x: number | null): number | null => (x === null ? null : Math.round(x * 1e6) / 1e6);

function quantiles(values: readonly number[], latency: LatencyKind): StageQuantiles {
  const q = (p: number) => (values.length ? round(quantile(values, p)) : null);
  return {
    latency,
    count: values.length,
    p50Ms: q(0.5),
    p95Ms: q(0.95),
    p99Ms: q(0.99),
    maxMs: values.length ? round(Math.max(...values)) : null,
  };
}

/** Whether the run's latencies are measured or modelled, per stage and overall, from its recorded config. */
export function timingOf(recording: Recording, calibration: string | null): Timing {
  let config: Partial<Pick<PerceptConfig, 'clock' | 'virtualServiceMs' | 'virtualServiceSeed'>> = {};
  try {
    config = JSON.parse(recording.metadata.config ?? '{}') as typeof config;
  } catch {
    // An unreadable config says nothing of costs; the clock below still does.
  }
  // A recording that does not say is taken as modelled: never call a figure measured without proof.
  const clock = (recording.metadata.clock ?? config.clock ?? recording.summary?.clock) === 'real' ? 'real' : 'virtual';
  const costs = config.virtualServiceMs;
  const costOf = (stage: string): StageCost | null => {
    if (!costs || typeof costs !== 'object') return null;
    const given = costs[stage];
    if (given === undefined) return 'none';
    return costsPerLevel(given).some(isDistribution) ? 'sampled' : 'fixed';
  };
  const stages: Record<string, Timing['stages'][string]> = {};
  for (const stage of recording.spans.keys())
    stages[stage] = clock === 'real' ? { latency: 'measured', cost: null } : { latency: 'modelled', cost: costOf(stage) };
  const latency: LatencyKind = clock === 'real' ? 'measured' : 'modelled';
  const seed = clock === 'virtual' && typeof config.virtualServiceSeed === 'number' ? config.virtualServiceSeed : null;
  let summary: string;
  if (clock === 'real') summary = 'measured on the real clock';
  else {
    const byCost = new Map<string, string[]>();
    for (const [stage, t] of Object.entries(stages)) byCost.set(t.cost ?? 'unknown', [...(byCost.get(t.cost ?? 'unknown') ?? []), stage]);
    const words: Record<string, string> = {
      sampled: `sampled from measured distributions${seed === null ? '' : ` (seed ${seed})`}`,
      fixed: 'fixed figures (no spread)',
      none: 'no cost given (0 ms)',
      unknown: 'costs the recording does not say',
    };
    const parts = [...byCost].map(([cost, list]) => `${list.join(', ')}: ${words[cost]}`);
    summary = `modelled on the virtual clock, not measured${calibration ? ` (calibration ${calibration})` : ''}; ${parts.join('; ')}`;
  }
  return { clock, latency, stages, calibration, seed, summary };
}

export function iou(a: readonly number[] | undefined, b: readonly number[] | undefined): number {
  if (!a || !b || a.length !== 4 || b.length !== 4) return 0;
  const w = Math.max(0, Math.min(a[2]!, b[2]!) - Math.max(a[0]!, b[0]!));
  const h = Math.max(0, Math.min(a[3]!, b[3]!) - Math.max(a[1]!, b[1]!));
  const inter = w * h;
  const area = (r: readonly number[]) => Math.max(0, r[2]! - r[0]!) * Math.max(0, r[3]! - r[1]!);
  const union = area(a) + area(b) - inter;
  return union > 0 ? inter / union : 0;
}

type Target = { label?: string; bbox?: number[] } | undefined;
const DROPPED = '(no action)';

export function scoreLabels(recording: Recording, labels: readonly Label[]): Accuracy {
  const byStamp = new Map<bigint, RecordedFrame>();
  for (const frame of recording.frames.values()) byStamp.set(frame.stampNs, frame);
  let matched = 0;
  let covered = 0;
  let actionRight = 0;
  let withTarget = 0;
  let labelRight = 0;
  let withBox = 0;
  let iouSum = 0;
  let iou50 = 0;
  const pairs: [string, string][] = [];
  for (const label of labels) {
    const frame = 'logTimeNs' in label.key ? byStamp.get(label.key.logTimeNs) : recording.frames.get(label.key.frameId);
    if (frame) matched += 1;
    const got = frame?.action;
    if (got) covered += 1;
    const expected = label.action;
    pairs.push([String(expected.action), got ? String(got.action) : DROPPED]);
    if (got && got.action === expected.action) actionRight += 1;
    const want = expected.target as Target;
    const have = got?.target as Target;
    if (want?.label !== undefined) {
      withTarget += 1;
      if (have?.label === want.label) labelRight += 1;
    }
    if (want?.bbox) {
      withBox += 1;
      const overlap = iou(want.bbox, have?.bbox);
      iouSum += overlap;
      if (overlap >= 0.5) iou50 += 1;
    }
  }
  const names = [...new Set(pairs.flat())].sort((a, b) => (a === DROPPED ? 1 : b === DROPPED ? -1 : a < b ? -1 : 1));
  const matrix = names.map(() => names.map(() => 0));
  for (const [want, got] of pairs) matrix[names.indexOf(want)]![names.indexOf(got)]! += 1;
  return {
    labeled: labels.length,
    matched,
    covered,
    action: round(ratio(actionRight, labels.length))!,
    label: round(ratio(labelRight, withTarget)),
    meanIoU: round(ratio(iouSum, withBox)),
    iou50: round(ratio(iou50, withBox)),
    confusion: { labels: names, matrix },
  };
}

export function tokenAgreement(a: Recording, b: Recording, reference: string): TokenAgreement {
  let frames = 0;
  let exact = 0;
  let same = 0;
  let total = 0;
  let withActions = 0;
  let sameAction = 0;
  const byStamp = new Map([...b.frames.values()].map((f) => [f.stampNs, f]));
  for (const fa of a.frames.values()) {
    const fb = byStamp.get(fa.stampNs);
    if (!fb) continue;
    if (fa.tokens && fb.tokens) {
      frames += 1;
      const n = Math.max(fa.tokens.length, fb.tokens.length);
      let k = 0;
      while (k < n && fa.tokens[k] !== undefined && fa.tokens[k] === fb.tokens[k]) k += 1;
      same += k;
      total += n;
      if (k === n) exact += 1;
    }
    if (fa.action && fb.action) {
      withActions += 1;
      if (JSON.stringify(fa.action) === JSON.stringify(fb.action)) sameAction += 1;
    }
  }
  return {
    reference,
    frames,
    exactMatchRate: round(ratio(exact, frames)),
    tokenAgreement: round(total === 0 && frames > 0 ? 1 : ratio(same, total)),
    actionAgreement: round(ratio(sameAction, withActions)),
  };
}

/** The metrics of a recorded run (and the series the report plots). */
export function measure(
  recording: Recording,
  labels: readonly Label[] | undefined,
  names: { bag: string; config: string | null; labels: string | null; recording: string; calibration?: string | null },
  reference?: { recording: Recording; name: string },
): { metrics: EvalMetrics; series: EvalSeries } {
  const summary = recording.summary;
  const frames = [...recording.frames.values()].sort((x, y) => x.frameId - y.frameId);
  const out = frames.filter((f) => f.action !== undefined).length;
  const byReason: Record<string, number> = {};
  for (const f of frames) if (f.drop) byReason[f.drop.reason] = (byReason[f.drop.reason] ?? 0) + 1;
  const invalid = byReason.invalid ?? 0;
  const late = frames.filter((f) => f.late).length;
  const stale = byReason.stale ?? 0;
  const { calibration = null, ...files } = names;
  const timing = timingOf(recording, calibration);
  const stages: Record<string, StageQuantiles> = {};
  for (const [stage, values] of recording.spans) stages[stage] = quantiles(values, timing.stages[stage]!.latency);
  const latencies = frames.flatMap((f) => (f.latencyMs !== undefined ? [f.latencyMs] : []));
  const first = frames[0]?.captureNs ?? 0n;
  const metrics: EvalMetrics = {
    kind: 'percept.eval',
    version: 2,
    ...files,
    frames: { in: frames.length, out, dropped: frames.filter((f) => f.drop).length, rejected: byReason.rejected ?? 0 },
    validRate: round(ratio(out, out + invalid)),
    deadlineMissRate: round(ratio(late + stale, frames.length)),
    drops: { byReason, causes: summary?.drops.causes ?? {} },
    timing,
    stages,
    endToEnd: quantiles(latencies, timing.latency),
    accuracy: labels ? scoreLabels(recording, labels) : null,
    tokens: reference ? tokenAgreement(recording, reference.recording, reference.name) : null,
    warnings: [...recording.warnings, ...(summary?.source?.details ?? [])],
  };
  const series: EvalSeries = {
    timeline: frames.map((f) => ({
      frameId: f.frameId,
      t: Number(f.captureNs - first) / 1e9,
      latencyMs: f.latencyMs ?? null,
      late: f.late === true,
      drop: f.drop?.reason ?? null,
    })),
    spans: recording.spans,
  };
  return { metrics, series };
}

// ---- thresholds ------------------------------------------------------------------------------------

const THRESHOLDS: Readonly<Record<string, { read: (m: EvalMetrics) => number | null | undefined; atMost?: true; what: string }>> = {
  valid: { read: (m) => m.validRate, what: 'schema-valid rate' },
  accuracy: { read: (m) => m.accuracy?.action, what: 'action accuracy' },
  iou: { read: (m) => m.accuracy?.meanIoU, what: 'mean bbox IoU' },
  agreement: { read: (m) => m.tokens?.tokenAgreement, what: 'token agreement' },
  miss: { read: (m) => m.deadlineMissRate, atMost: true, what: 'deadline-miss rate' },
};

/** Parses `valid=0.99,accuracy=0.8,miss=0.05`. */
export function parseFailUnder(spec: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of spec.split(',').filter(Boolean)) {
    const [key, value] = part.split('=');
    if (!key || !(key in THRESHOLDS))
      throw new Error(`--fail-under: unknown metric '${key}' (known: ${Object.keys(THRESHOLDS).join(', ')})`);
    const n = Number(value);
    if (value === undefined || value === '' || !Number.isFinite(n) || n < 0 || n > 1)
      throw new Error(`--fail-under: ${key} needs a number in [0, 1], got '${value ?? ''}'`);
    out[key] = n;
  }
  return out;
}

/** The reasons the metrics fail the thresholds (empty when they pass). */
export function checkThresholds(metrics: EvalMetrics, thresholds: Readonly<Record<string, number>>): string[] {
  const failures: string[] = [];
  for (const [key, limit] of Object.entries(thresholds)) {
    const { read, atMost, what } = THRESHOLDS[key]!;
    const value = read(metrics);
    if (value === null || value === undefined)
      failures.push(
        `${key}: the ${what} is not available (${key === 'accuracy' || key === 'iou' ? 'no labels' : key === 'agreement' ? 'no --reference' : 'no frames'})`,
      );
    else if (atMost ? value > limit : value < limit)
      failures.push(`${key}: the ${what} ${value.toFixed(4)} is ${atMost ? 'above' : 'below'} ${limit}`);
  }
  return failures;
}

// ---- the command -----------------------------------------------------------------------------------

export interface EvalOptions {
  readonly bag: string;
  readonly config?: string;
  readonly labels?: string;
  readonly reference?: string;
  readonly out: string;
  readonly failUnder?: string;
  readonly progress?: boolean;
  /** A calibration file whose stage costs replace the config's virtualServiceMs. */
  readonly calibration?: string;
  /** Seeds the draws from the costs' distributions (default: the config's virtualServiceSeed). */
  readonly seed?: number;
}

/** The knobs of each ladder level of a config: level 0 is `initial`, each next one adds a rung. */
function ladderLevels(config: PerceptConfig): Record<string, unknown>[] {
  const levels: Record<string, unknown>[] = [{ ...config.ladder.initial }];
  for (const rung of config.ladder.rungs) levels.push({ ...levels.at(-1), ...rung });
  return levels;
}

/** A calibration charges level i the costs measured at its level i: the two ladders must be the same. */
function checkCalibrationLadder(config: PerceptConfig, path: string): void {
  const file = JSON.parse(readFileSync(path, 'utf8')) as { levels?: Record<string, unknown>[] };
  if (!Array.isArray(file.levels)) return; // not a calibration: loadConfig says so
  const ours = ladderLevels(config);
  const fix = `calibrate with this config (percept calibrate -c …), or eval with the config it was measured with`;
  if (file.levels.length !== ours.length)
    throw new Error(`--calibration ${path}: it measured ${file.levels.length} ladder levels, the config has ${ours.length}; ${fix}`);
  file.levels.forEach((level, i) => {
    for (const [knob, value] of Object.entries(level)) {
      if (JSON.stringify(ours[i]![knob]) !== JSON.stringify(value))
        throw new Error(
          `--calibration ${path}: level ${i} was measured at ${knob}=${JSON.stringify(value)}, the config's is ${JSON.stringify(ours[i]![knob])}; ${fix}`,
        );
    }
  });
}

/** The calibration file a config names in virtualServiceMs, resolved, or null. */
export function namedCalibration(configPath: string | undefined): string | null {
  if (!configPath) return null;
  const named = (JSON.parse(readFileSync(configPath, 'utf8')) as { virtualServiceMs?: unknown }).virtualServiceMs;
  return typeof named === 'string' && named !== '' ? resolve(dirname(resolve(configPath)), named) : null;
}

/** Runs the evaluation and resolves with the exit code: 1 when a run failed, 2 when a threshold was not met. */
export async function evaluate(opts: EvalOptions): Promise<{ code: number; metrics: EvalMetrics }> {
  const thresholds = opts.failUnder ? parseFailUnder(opts.failUnder) : {};
  const out = resolve(opts.out);
  mkdirSync(out, { recursive: true });
  const bag = resolve(opts.bag);
  const defaultLabels = bag.replace(/\.mcap$/, '') + '.labels.jsonl';
  const labelsPath = opts.labels ? resolve(opts.labels) : existsSync(defaultLabels) ? defaultLabels : null;
  // The labels are read and checked before any replay, so a bad file fails at once.
  const labelSchema = loadActionSchema(runConfig({ config: opts.config }).actions.schema);
  const labels = labelsPath ? loadLabels(labelsPath, labelSchema) : undefined;

  const calibration = opts.calibration ? resolve(opts.calibration) : namedCalibration(opts.config);
  const replay = async (configPath: string | undefined, name: string): Promise<{ config: PerceptConfig; recording: string }> => {
    const recording = join(out, `${name}.mcap`);
    const given = runConfig({ config: configPath, source: `bag:${bag}`, lockstep: true, record: recording });
    // eval reads percept's own recording profile, whatever the config records for ROS tools.
    let config: PerceptConfig = { ...given, recorder: { ...given.recorder, profile: '' as const } };
    if (name === 'run' && (opts.calibration || opts.seed !== undefined)) {
      if (opts.calibration) checkCalibrationLadder(config, calibration!);
      config = loadConfig({
        ...config,
        ...(opts.calibration ? { virtualServiceMs: calibration } : {}),
        ...(opts.seed !== undefined ? { virtualServiceSeed: opts.seed } : {}),
      });
    }
    const { failure, summary } = await executeRun(config, {
      publish: false,
      liveTable: false,
      onStart: progressBar(opts.progress !== false, name),
    });
    if (failure && summary.frames.in === 0) throw new Error(`eval: the ${name} run failed: ${failure}`);
    if (failure) log(`the ${name} run: ${failure}`);
    return { config, recording };
  };
  const main = await replay(opts.config, 'run');
  const reference = opts.reference ? await replay(opts.reference, 'reference') : undefined;
  const { metrics, series } = measure(
    await readRecording(main.recording),
    labels,
    { bag, config: opts.config ? resolve(opts.config) : null, labels: labelsPath, recording: basename(main.recording), calibration },
    reference ? { recording: await readRecording(reference.recording), name: resolve(opts.reference!) } : undefined,
  );
  writeFileSync(join(out, 'metrics.json'), `${JSON.stringify(metrics, null, 2)}\n`);
  writeFileSync(join(out, 'report.html'), await renderReport(metrics, series));
  const failures = checkThresholds(metrics, thresholds);
  for (const failure of failures) log(`fail-under ${failure}`);
  return { code: failures.length > 0 ? 2 : 0, metrics };
}

/** A progress bar over the replay's frames on stderr. When stderr is not a terminal, a line every few seconds. */
function progressBar(enabled: boolean, name: string) {
  return (graph: Graph, total: number | undefined): void => {
    if (!enabled) return;
    const bar = new cliProgress.SingleBar(
      {
        format: `percept eval (${name}) |{bar}| {value}/{total} frames | {eta_formatted} left`,
        stream: process.stderr,
        noTTYOutput: true,
        notTTYSchedule: 5000,
        hideCursor: true,
      },
      cliProgress.Presets.shades_classic,
    );
    bar.start(total ?? 0, 0);
    graph.events.subscribe({
      next: (event) => {
        if (event.type === 'output' || event.type === 'drop') bar.increment();
      },
      complete: () => bar.stop(),
    });
  };
}

// ---- compare ----------------------------------------------------------------------------------------

const COMPARED: readonly [string, (m: EvalMetrics) => number | null | undefined][] = [
  ['frames in', (m) => m.frames.in],
  ['frames out', (m) => m.frames.out],
  ['schema-valid rate', (m) => m.validRate],
  ['deadline-miss rate', (m) => m.deadlineMissRate],
  ['action accuracy', (m) => m.accuracy?.action],
  ['target label accuracy', (m) => m.accuracy?.label],
  ['mean bbox IoU', (m) => m.accuracy?.meanIoU],
  ['token agreement', (m) => m.tokens?.tokenAgreement],
  ['end-to-end p50 ms', (m) => m.endToEnd.p50Ms],
  ['end-to-end p95 ms', (m) => m.endToEnd.p95Ms],
  ['end-to-end p99 ms', (m) => m.endToEnd.p99Ms],
];

export interface Comparison {
  readonly a: string;
  readonly b: string;
  /** How each side's latencies came about (metrics.json version 1 does not say). */
  readonly timing: { readonly a: string; readonly b: string };
  readonly rows: readonly {
    readonly metric: string;
    readonly a: number | null;
    readonly b: number | null;
    readonly delta: number | null;
  }[];
}

function readMetrics(path: string): EvalMetrics {
  const file = existsSync(join(path, 'metrics.json')) ? join(path, 'metrics.json') : path;
  let metrics: EvalMetrics;
  try {
    metrics = JSON.parse(readFileSync(file, 'utf8')) as EvalMetrics;
  } catch (err) {
    throw new Error(`compare: cannot read ${file}: ${(err as Error).message}`, { cause: err });
  }
  if (metrics?.kind !== 'percept.eval') throw new Error(`compare: ${file} is not the metrics.json of percept eval`);
  return metrics;
}

/** Two eval outputs (folders or metrics.json files) side by side, with B − A. */
export function compare(a: string, b: string): Comparison {
  const [ma, mb] = [readMetrics(a), readMetrics(b)];
  const rows = [...COMPARED, ...stageRows(ma, mb)].map(([metric, read]) => {
    const [va, vb] = [read(ma) ?? null, read(mb) ?? null];
    return { metric, a: va, b: vb, delta: va !== null && vb !== null ? round(vb - va) : null };
  });
  for (const reason of new Set([...Object.keys(ma.drops.byReason), ...Object.keys(mb.drops.byReason)])) {
    const [va, vb] = [ma.drops.byReason[reason] ?? 0, mb.drops.byReason[reason] ?? 0];
    rows.push({ metric: `drops: ${reason}`, a: va, b: vb, delta: vb - va });
  }
  const timingText = (m: EvalMetrics) => (m.timing ? `latencies ${m.timing.summary}` : 'latencies: not said (an older metrics.json)');
  return { a, b, timing: { a: timingText(ma), b: timingText(mb) }, rows };
}

function stageRows(a: EvalMetrics, b: EvalMetrics): [string, (m: EvalMetrics) => number | null | undefined][] {
  const stages = [...new Set([...Object.keys(a.stages), ...Object.keys(b.stages)])];
  return stages.map((stage) => [`${stage} p95 ms`, (m: EvalMetrics) => m.stages[stage]?.p95Ms]);
}

export function formatComparison(c: Comparison): string {
  const fmt = (v: number | null) => (v === null ? '-' : Number.isInteger(v) ? String(v) : v.toFixed(4));
  const rows = [
    ['metric', 'A', 'B', 'B − A'],
    ...c.rows.map((r) => [r.metric, fmt(r.a), fmt(r.b), r.delta === null ? '-' : (r.delta > 0 ? '+' : '') + fmt(r.delta)]),
  ];
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return (
    [
      `A: ${c.a}`,
      `   ${c.timing.a}`,
      `B: ${c.b}`,
      `   ${c.timing.b}`,
      ...rows.map((r) => r.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join('  ')),
    ].join('\n') + '\n'
  );
}
