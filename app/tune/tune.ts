// `percept tune`: sweeps knobs on a bag and writes the config the objective picks.
//
// Each grid point (app/tune/grid.ts) is one recorded run of the bag, measured as `percept eval` measures.
//   virtual  each stage costs what `percept calibrate` measured, in lockstep or at the recorded pace;
//   real     the bag at its recorded pace on the real clock, everything measured on this machine.
// In virtual mode the stages still run, so quality is real. A point no calibration covers is refused up front.
// Then app/tune/select.ts builds the Pareto table, and the chosen point's config goes to --out.
// A state file next to --out (NAME.tune-state.json) keeps measured points, so a rerun measures only the rest.
// Exit codes: 130/143 on a signal, 1 when a point failed, 2 when nothing was chosen.
// Then an earlier config at --out is removed.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { cpus, tmpdir } from 'node:os';
import { basename, dirname, isAbsolute, join, relative, resolve, sep } from 'node:path';
import cliProgress from 'cli-progress';
import { ADDON_PATH } from '../../native/binding.ts';
import { LlamaModel } from '../../native/llama.ts';
import { decodeBudget, loadActionSchema, type ActionSchema } from '../../nodes/action-schema.ts';
import { resolveModel, type ModelKind } from '../../models/resolve.ts';
import { ConfigError, PATH_FIELDS, loadConfig, type ConfigIssue, type PerceptConfig } from '../../pipeline/config.ts';
import { STOP_SIGNALS, type Graph } from '../../pipeline/graph/graph.ts';
import { serviceDistribution, type ServiceCost } from '../../pipeline/service-time.ts';
import type { Knobs } from '../../pipeline/types.ts';
import { measure, readRecording, type Recording } from '../eval/eval.ts';
import type { EvalMetrics } from '../eval/metrics.ts';
import { loadLabels, type Label } from '../eval/labels.ts';
import { DEFAULT_CONFIG, executeRun } from '../run/run.ts';
import { runFailure } from '../run/stages.ts';
import { runIdentity, sha256File } from '../run/identity.ts';
import { calibratedCost, encoderSpec, readCalibration, type Calibration } from './costs.ts';
import {
  GridError,
  budgetsFor,
  defaultGrid,
  gridPoints,
  loadGrid,
  pointConfig,
  pointDecoder,
  pointLadderKnobs,
  type Grid,
  type GridPoint,
  type KnobName,
  type PointKnobs,
  type Replay,
} from './grid.ts';
import {
  choose,
  feasible,
  formatTable,
  knobsText,
  metricOf,
  orderLadder,
  paretoFront,
  parseObjective,
  rungText,
  type LadderStep,
  type Measurable,
  type Metric,
  type PointResult,
} from './select.ts';

const log = (msg: string) => process.stderr.write(`percept: ${msg}\n`);

export interface TuneOptions {
  readonly bag: string;
  readonly budgetMs: number;
  readonly grid?: string;
  readonly objective?: string;
  /** Default: BAG.labels.jsonl when it exists. */
  readonly labels?: string;
  /** A config whose decoder is the reference, such as the F16 model. Agreement is measured against it. */
  readonly reference?: string;
  readonly config?: string;
  /** Default: virtual when a calibration is given or named by the config, else real. */
  readonly mode?: 'virtual' | 'real';
  readonly calibration?: readonly string[];
  /** Seeds the draws from calibrated distributions (default: the config's virtualServiceSeed). */
  readonly seed?: number;
  /** Virtual mode: lockstep by default, or the bag's recorded pace. */
  readonly pace?: 'lockstep' | 'recorded';
  readonly out: string;
  readonly progress?: boolean;
}

export interface TunedPoint extends PointResult {
  readonly pareto: boolean;
  readonly feasible: boolean;
  /** Taken from the state file (measured by an earlier run of the same tune). */
  readonly resumed: boolean;
}

export interface TuneResult {
  readonly kind: 'percept.tune';
  readonly version: 1;
  readonly bag: string;
  readonly config: string;
  readonly labels: string | null;
  readonly reference: string | null;
  readonly grid: string;
  readonly mode: 'virtual' | 'real';
  readonly replay: Replay;
  readonly calibrations: readonly string[];
  /** Latencies: measured (real clock) or modelled (virtual clock, calibrated costs). */
  readonly latency: 'measured' | 'modelled';
  /** Virtual mode: the seed of the draws from the calibrated distributions. */
  readonly seed: number | null;
  /** How latencies came about, in words (printed after the table). */
  readonly latencies: string;
  readonly budgetMs: number;
  readonly objective: string;
  readonly quality: Metric;
  readonly points: readonly TunedPoint[];
  /** Points measured by this run, and taken from the state file. */
  readonly ran: number;
  readonly resumed: number;
  readonly chosen: { readonly index: number; readonly label: string; readonly knobs: PointKnobs } | null;
  readonly ladder: readonly LadderStep[];
  /** The config written, or null when no point met the objective's constraints. */
  readonly out: string | null;
  /** An earlier tune's config at --out, removed because this tune chose nothing. */
  readonly removed: string | null;
  readonly state: string;
}

/** Ctrl-C or kill during a tune: the measured points are in the state file. */
export class TuneInterrupted extends Error {
  readonly signal: string;
  constructor(signal: string, done: number, total: number, state: string) {
    super(
      `tune interrupted by ${signal} after ${done} of ${total} points (kept in ${state}); run the same command again to measure the rest`,
    );
    this.name = 'TuneInterrupted';
    this.signal = signal;
  }
}

// ---- models and the state file -----------------------------------------------------------------------

const sha256 = (text: string): string => createHash('sha256').update(text).digest('hex');

/** The action grammar's worst case for a decoder model, from its vocabulary alone. Null means unbounded. */
async function grammarWorstCase(path: string, schema: ActionSchema): Promise<{ worstCaseTokens: number | null; fallback: string | null }> {
  const model = await LlamaModel.load(path, { vocabOnly: true });
  try {
    const grammar = await model.grammarFromJsonSchema(schema.schema);
    return { worstCaseTokens: grammar.worstCaseTokens, fallback: grammar.fallback };
  } finally {
    await model.dispose();
  }
}

/** Version 2: a point's serviceMs holds distributions (version 1 held medians). */
const STATE_VERSION = 2;

interface StateFile {
  readonly kind: 'percept.tune-state';
  readonly version: typeof STATE_VERSION;
  readonly points: Record<string, PointResult>;
  reference?: { readonly key: string; readonly frames: readonly ReferenceFrame[] };
}

/** What agreement needs of a reference frame. */
interface ReferenceFrame {
  readonly stampNs: string;
  readonly tokens?: readonly number[];
  readonly action?: Record<string, unknown>;
}

function readState(path: string): StateFile {
  const empty: StateFile = { kind: 'percept.tune-state', version: STATE_VERSION, points: {} };
  if (!existsSync(path)) return empty;
  try {
    const state = JSON.parse(readFileSync(path, 'utf8')) as StateFile;
    if (state?.kind === 'percept.tune-state' && state.version === STATE_VERSION && typeof state.points === 'object') return state;
    if (state?.kind === 'percept.tune-state') {
      log(`${path} is a tune state of version ${String(state.version)}, not ${STATE_VERSION}; measuring every point anew`);
      return empty;
    }
  } catch {
    // an unreadable state is measured anew
  }
  log(`${path} is not a tune state file; measuring every point anew`);
  return empty;
}

/** Written whole to a temporary file and renamed, so a kill leaves the old state or the new one. */
function writeState(path: string, state: StateFile): void {
  writeFileSync(`${path}.partial`, `${JSON.stringify(state)}\n`);
  renameSync(`${path}.partial`, path);
}

/** What makes a run (see app/run/identity.ts), hashed with what it is measured against. */
async function runKey(config: PerceptConfig, schema: ActionSchema, against: object): Promise<string> {
  return sha256(JSON.stringify({ run: await runIdentity(config, schema), against }));
}

/** What a measurement depends on besides the run: the native addon that ran it, and on the real clock
 * the machine. The addon counts because percept's version does not change with a rebuild. */
export async function measurementEnvironment(mode: 'virtual' | 'real'): Promise<object> {
  const size = statSync(ADDON_PATH, { throwIfNoEntry: false })?.size;
  const addon = size === undefined ? null : { bytes: size, sha256: await sha256File(ADDON_PATH) };
  if (mode !== 'real') return { addon };
  const cpu = cpus();
  return { addon, machine: { cpu: cpu[0]?.model ?? 'unknown', cores: cpu.length, arch: process.arch, gpu: gpuNames() } };
}

/** The GPUs nvidia-smi lists (none when there is no nvidia-smi). */
function gpuNames(): string[] {
  try {
    const text = execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], {
      encoding: 'utf8',
      timeout: 10_000,
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    return text
      .split('\n')
      .map((line) => line.trim())
      .filter(Boolean);
  } catch {
    return [];
  }
}

// ---- signals and progress ----------------------------------------------------------------------------

/** A stop signal during a tune: the run in flight stops, and the caller stops after it. */
class Interruption {
  signal: NodeJS.Signals | null = null;
  #graph: Graph | undefined;
  readonly #handler = (signal: NodeJS.Signals): void => {
    this.signal ??= signal;
    void this.#graph?.stop(signal);
  };

  constructor() {
    for (const signal of STOP_SIGNALS) process.on(signal, this.#handler);
  }

  /** The graph a signal stops; one that came while it loaded stops it as soon as it runs. */
  follow(graph: Graph | undefined): void {
    this.#graph = graph;
    const signal = this.signal;
    if (graph && signal) setImmediate(() => void graph.stop(signal));
  }

  dispose(): void {
    for (const signal of STOP_SIGNALS) process.off(signal, this.#handler);
  }
}

type Progress = ReturnType<typeof progressBar>;

/** A bar over the points on stderr. When stderr is not a terminal, a line every few seconds. */
function progressBar(enabled: boolean, total: number) {
  const bar = enabled
    ? new cliProgress.SingleBar(
        {
          format: 'percept tune |{bar}| {value}/{total} points | {point} {frames}',
          stream: process.stderr,
          noTTYOutput: true,
          notTTYSchedule: 5000,
          hideCursor: true,
        },
        cliProgress.Presets.shades_classic,
      )
    : undefined;
  bar?.start(total, 0, { point: '', frames: '' });
  return {
    point(label: string) {
      bar?.update({ point: label, frames: '' });
    },
    follow(graph: Graph, frames: number | undefined) {
      let done = 0;
      graph.events.subscribe((event) => {
        if (event.type === 'output' || event.type === 'drop') bar?.update({ frames: `frame ${++done}${frames ? `/${frames}` : ''}` });
      });
    },
    done() {
      bar?.increment(1, { frames: '' });
    },
    stop() {
      bar?.stop();
    },
  };
}

// ---- one run -------------------------------------------------------------------------------------------

/** Runs `config`, recording to config.recorder.path, and reads the recording. Null when interrupted. */
async function replay(config: PerceptConfig, interruption: Interruption, progress: Progress): Promise<Recording | null> {
  try {
    let run: Awaited<ReturnType<typeof executeRun>>;
    try {
      run = await executeRun(config, {
        publish: false,
        liveTable: false,
        onStart: (graph, frames) => {
          interruption.follow(graph);
          progress.follow(graph, frames);
        },
      });
    } catch (err) {
      if (interruption.signal) return null;
      throw err;
    }
    if (interruption.signal) return null;
    const { summary, failure } = run;
    // A run that dropped every frame is a measurement; a failed source or recording is not.
    if (failure && (summary.endReason === 'source_error' || summary.frames.in === 0 || failure !== runFailure(summary)))
      throw new Error(failure);
    return await readRecording(config.recorder.path);
  } finally {
    interruption.follow(undefined);
    rmSync(config.recorder.path, { force: true });
  }
}

function resultOf(
  point: GridPoint,
  ladder: Knobs,
  metrics: EvalMetrics,
  spans: ReadonlyMap<string, readonly number[]>,
  serviceMs: Record<string, ServiceCost> | null,
): PointResult {
  const stages = Object.fromEntries(Object.entries(metrics.stages).map(([s, q]) => [s, { p50Ms: q.p50Ms, p99Ms: q.p99Ms }]));
  // On the real clock, each stage's cost is the distribution of its measured calls.
  const measured = Object.fromEntries([...spans].flatMap(([s, ms]) => (ms.length ? [[s, serviceDistribution(ms)]] : [])));
  return {
    index: point.index,
    label: point.label,
    knobs: point.knobs,
    ladder,
    status: 'ok',
    error: null,
    frames: { in: metrics.frames.in, out: metrics.frames.out, dropped: metrics.frames.dropped },
    dropsByReason: metrics.drops.byReason,
    endToEnd: { p50Ms: metrics.endToEnd.p50Ms, p99Ms: metrics.endToEnd.p99Ms },
    stages,
    missRate: metrics.deadlineMissRate,
    dropRate: metrics.frames.in > 0 ? (metrics.frames.in - metrics.frames.out) / metrics.frames.in : null,
    validRate: metrics.validRate,
    accuracy: metrics.accuracy?.action ?? null,
    iou: metrics.accuracy?.meanIoU ?? null,
    agreement: metrics.tokens?.tokenAgreement ?? null,
    serviceMs: serviceMs ?? measured,
  };
}

function failedResult(point: GridPoint, ladder: Knobs, error: string): PointResult {
  return {
    index: point.index,
    label: point.label,
    knobs: point.knobs,
    ladder,
    status: 'failed',
    error,
    frames: { in: 0, out: 0, dropped: 0 },
    dropsByReason: {},
    endToEnd: { p50Ms: null, p99Ms: null },
    stages: {},
    missRate: null,
    dropRate: null,
    validRate: null,
    accuracy: null,
    iou: null,
    agreement: null,
    serviceMs: {},
  };
}

// ---- planning: every point checked before anything runs -------------------------------------------------

/** A point ready to run: its loaded config, its ladder knobs, and in virtual mode its stage costs. */
interface PlannedPoint {
  readonly point: GridPoint;
  readonly config: PerceptConfig;
  readonly ladder: Knobs;
  readonly serviceMs: Record<string, ServiceCost> | null;
}

interface Plan {
  readonly base: PerceptConfig;
  readonly schema: ActionSchema;
  readonly grid: Grid;
  readonly bag: string;
  readonly budgetMs: number;
  readonly replay: Replay;
  readonly calibrations: readonly Calibration[];
  readonly workDir: string;
}

/** Each point's config, ladder knobs and costs. Throws GridError naming every problem: an unresolvable
 * model, a maxNewTokens below the grammar's worst case, what virtual mode cannot model, a bad config.
 * Reads only model headers and vocabularies. */
async function planPoints(plan: Plan): Promise<PlannedPoint[]> {
  const { base, schema, grid, calibrations } = plan;
  const points = gridPoints(grid);
  const where = (knob: KnobName, point: GridPoint): string =>
    grid.listed.includes(knob) ? `/knobs/${knob}/${point.at[knob]}` : `(the config's ${knob})`;
  const issues = new Map<string, ConfigIssue>();
  const issue = (path: string, message: string) => issues.set(`${path}\0${message}`, { path, message });
  if (plan.replay === 'lockstep' && grid.axes.edges.length > 1)
    issue('/knobs/edges', 'edge policies change nothing in a lockstep replay (no frame waits on an edge): use --pace recorded, or --real');

  // The models: each resolved, so a missing file is refused here, and each decoder's grammar worst case.
  const local = base.decoder.kind === 'local';
  const resolved = new Map<string, string | null>();
  const resolveAt = async (spec: string, kind: ModelKind, path: string): Promise<string | null> => {
    if (!resolved.has(`${kind}:${spec}`)) {
      resolved.set(
        `${kind}:${spec}`,
        await resolveModel(spec, kind).catch((err: Error) => {
          issue(path, err.message);
          return null;
        }),
      );
    }
    return resolved.get(`${kind}:${spec}`)!;
  };
  const worst = new Map<string, { worstCaseTokens: number | null; fallback: string | null }>();
  if (local) {
    const encoder = encoderSpec(base);
    if (encoder) await resolveAt(encoder, base.encoder.kind === 'onnx' ? 'vision' : 'mmproj', '/encoder');
    for (const point of points) {
      const { model, draft } = point.knobs;
      if ('model' in draft) await resolveAt(draft.model, 'decoder', where('draft', point));
      const path = await resolveAt(model, 'decoder', where('model', point));
      if (path && !worst.has(model)) worst.set(model, await grammarWorstCase(path, schema));
    }
  }

  const planned: PlannedPoint[] = [];
  for (const point of points) {
    // The ladder's maxNewTokens: the decoder's budget, the grammar's worst case when it is null.
    let maxNewTokens = point.knobs.maxNewTokens ?? base.ladder.initial.maxNewTokens;
    const w = worst.get(point.knobs.model);
    if (local && !w) continue;
    if (w) {
      try {
        maxNewTokens = decodeBudget(point.knobs.maxNewTokens, w, schema.path).maxNewTokens;
      } catch (err) {
        issue(
          grid.listed.includes('maxNewTokens') ? `/knobs/maxNewTokens/${point.at.maxNewTokens}` : '/decoder/maxNewTokens',
          (err as Error).message,
        );
        continue;
      }
    }
    let serviceMs: Record<string, ServiceCost> | null = null;
    if (plan.replay !== 'real') {
      const cost = calibratedCost(
        calibrations,
        point.knobs,
        { knob: maxNewTokens, bounded: w?.worstCaseTokens != null },
        encoderSpec(base),
      );
      if ('why' in cost) {
        issue(cost.knob === null ? `(point ${point.label})` : cost.knob === 'encoder' ? '/encoder' : where(cost.knob, point), cost.why);
        continue;
      }
      serviceMs = cost.serviceMs;
    }
    const setup = {
      bag: plan.bag,
      budgetMs: plan.budgetMs,
      replay: plan.replay,
      serviceMs: serviceMs ?? {},
      maxNewTokensKnob: maxNewTokens,
      recording: join(plan.workDir, `point-${point.index}.mcap`),
    };
    try {
      const config = loadConfig(pointConfig(base, point.knobs, setup));
      planned.push({ point, config, ladder: pointLadderKnobs(point.knobs, maxNewTokens), serviceMs });
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      for (const i of err.issues) issue(`(point ${point.label}) ${i.path}`, i.message);
    }
  }
  if (issues.size > 0) throw new GridError(grid.origin, [...issues.values()]);
  return planned;
}

/** The reference run: its decoder at its ladder's first level, every frame decoded in lockstep with
 * nothing charged. The state file keeps the frames agreement needs. False when interrupted. */
async function measureReference(
  reference: PerceptConfig,
  source: PerceptConfig['source'],
  ctx: {
    state: StateFile;
    statePath: string;
    schema: ActionSchema;
    workDir: string;
    interruption: Interruption;
    progress: Progress;
    environment: object;
  },
): Promise<boolean> {
  const config = loadConfig({
    ...reference,
    source,
    clock: 'virtual',
    lockstep: true,
    virtualServiceMs: {},
    ladder: { ...reference.ladder, enabled: false, rungs: [] },
    recorder: { ...reference.recorder, enabled: true, path: join(ctx.workDir, 'reference.mcap'), frames: false, profile: '' },
    control: { ...reference.control, enabled: false },
    telemetry: { ...reference.telemetry, liveTable: 'off' },
  });
  const key = await runKey(config, loadActionSchema(config.actions.schema), { environment: ctx.environment });
  if (ctx.state.reference?.key === key) return true;
  ctx.progress.point('reference');
  const recording = await replay(config, ctx.interruption, ctx.progress);
  if (!recording) return false;
  const frames = [...recording.frames.values()].map((f) => ({
    stampNs: String(f.stampNs),
    ...(f.tokens ? { tokens: f.tokens } : {}),
    ...(f.action ? { action: f.action } : {}),
  }));
  ctx.state.reference = { key, frames };
  writeState(ctx.statePath, ctx.state);
  return true;
}

/** The reference run as a Recording that eval's tokenAgreement reads. */
function referenceRecording(frames: readonly ReferenceFrame[]): Recording {
  const byId = new Map(
    frames.map((f, frameId) => [
      frameId,
      {
        frameId,
        stampNs: BigInt(f.stampNs),
        captureNs: 0n,
        ...(f.tokens ? { tokens: f.tokens } : {}),
        ...(f.action ? { action: f.action } : {}),
      },
    ]),
  );
  return { frames: byId, spans: new Map(), summary: undefined, metadata: {}, warnings: [] };
}

// ---- the command ---------------------------------------------------------------------------------------

export async function tune(opts: TuneOptions): Promise<TuneResult> {
  if (!(Number.isFinite(opts.budgetMs) && opts.budgetMs > 0))
    throw new RangeError(`--budget-ms must be a number > 0, got ${opts.budgetMs}`);
  const bag = resolve(opts.bag);
  if (!statSync(bag, { throwIfNoEntry: false })?.isFile()) throw new Error(`--bag ${opts.bag}: no such file`);
  const configPath = resolve(opts.config ?? DEFAULT_CONFIG);
  const loaded = loadConfig(configPath);
  const base = opts.seed === undefined ? loaded : loadConfig({ ...loaded, virtualServiceSeed: opts.seed });
  if (base.cameras) throw new Error(`tune runs one camera: ${configPath} has cameras`);
  const schema = loadActionSchema(base.actions.schema);
  const defaultLabels = bag.replace(/\.mcap$/, '') + '.labels.jsonl';
  const labelsPath = opts.labels ? resolve(opts.labels) : existsSync(defaultLabels) ? defaultLabels : null;
  const labels: Label[] | undefined = labelsPath ? loadLabels(labelsPath, schema) : undefined;
  const referencePath = opts.reference ? resolve(opts.reference) : null;
  const reference = referencePath ? loadConfig(referencePath) : null;
  const measurable: Measurable = { labels: labels !== undefined, reference: reference !== null };
  const objective = parseObjective(opts.objective, measurable);

  // Mode: virtual needs calibrations, given or named by the config's virtualServiceMs.
  const named = (JSON.parse(readFileSync(configPath, 'utf8')) as { virtualServiceMs?: unknown }).virtualServiceMs;
  const calibrationPaths = opts.calibration?.length
    ? opts.calibration.map((p) => resolve(p))
    : typeof named === 'string'
      ? [resolve(dirname(configPath), named)]
      : [];
  const mode = opts.mode ?? (calibrationPaths.length > 0 ? 'virtual' : 'real');
  if (mode === 'virtual' && calibrationPaths.length === 0)
    throw new Error(
      '--virtual needs the stage costs percept calibrate measured: --calibration FILE (or a config whose virtualServiceMs names one)',
    );
  if (mode === 'real' && opts.calibration?.length)
    throw new Error('--calibration is for --virtual: --real measures every stage on this machine (leave out one or the other)');
  if (mode === 'real' && opts.pace !== undefined) throw new Error('--pace is for --virtual: --real replays the bag at its recorded pace');
  const calibrations = mode === 'virtual' ? calibrationPaths.map(readCalibration) : [];
  const replayKind: Replay = mode === 'real' ? 'real' : opts.pace === 'recorded' ? 'virtual-recorded' : 'lockstep';
  const grid = opts.grid ? loadGrid(resolve(opts.grid), base) : defaultGrid(base, { levels: mode === 'virtual' });

  const out = resolve(opts.out);
  const statePath = `${out.replace(/\.json$/, '')}.tune-state.json`;
  const workDir = mkdtempSync(join(tmpdir(), 'percept-tune-'));
  const results: PointResult[] = [];
  const resumed = new Set<number>();
  try {
    const planned = await planPoints({ base, schema, grid, bag, budgetMs: opts.budgetMs, replay: replayKind, calibrations, workDir });
    mkdirSync(dirname(out), { recursive: true });
    const state = readState(statePath);
    const interruption = new Interruption();
    const progress = progressBar(opts.progress !== false, planned.length);
    const interrupted = () => new TuneInterrupted(interruption.signal!, results.length, planned.length, statePath);
    try {
      // The reference run is virtual, in lockstep with nothing charged, so the machine is no part of it.
      const environment = await measurementEnvironment(mode);
      if (!reference) delete state.reference;
      else if (
        !(await measureReference(reference, planned[0]!.config.source, {
          state,
          statePath,
          schema,
          workDir,
          interruption,
          progress,
          environment: await measurementEnvironment('virtual'),
        }))
      )
        throw interrupted();
      // Measured against the labels and the reference, by this addon and on the real clock this machine.
      // A change in any of them makes another measurement.
      const against = {
        labels: labelsPath ? await sha256File(labelsPath) : null,
        reference: state.reference?.key ?? null,
        environment,
      };
      const agreementWith = state.reference ? { recording: referenceRecording(state.reference.frames), name: referencePath! } : undefined;
      const keys: string[] = [];
      for (const { point, config, ladder, serviceMs } of planned) {
        if (interruption.signal) throw interrupted();
        const key = await runKey(config, schema, against);
        keys.push(key);
        const kept = state.points[key];
        if (kept) {
          results.push({ ...kept, index: point.index, label: point.label });
          resumed.add(point.index);
          progress.done();
          continue;
        }
        progress.point(point.label);
        let result: PointResult;
        try {
          const recording = await replay(config, interruption, progress);
          if (!recording) throw interrupted();
          const names = { bag, config: configPath, labels: labelsPath, recording: config.recorder.path };
          const { metrics, series } = measure(recording, labels, names, agreementWith);
          result = resultOf(point, ladder, metrics, series.spans, serviceMs);
          state.points[key] = result;
          writeState(statePath, state);
        } catch (err) {
          if (err instanceof TuneInterrupted) throw err;
          // A point that cannot run, such as a model that does not load, is a row with its reason.
          // It is not kept, so a rerun tries it again.
          result = failedResult(point, ladder, (err as Error).message);
        }
        results.push(result);
        progress.done();
      }
      if (interruption.signal) throw interrupted();
      // The state keeps this grid's points only.
      for (const key of Object.keys(state.points)) if (!keys.includes(key)) delete state.points[key];
      writeState(statePath, state);
    } finally {
      progress.stop();
      interruption.dispose();
    }
  } finally {
    rmSync(workDir, { recursive: true, force: true });
  }

  const front = paretoFront(results, objective.quality);
  const chosen = choose(results, objective, opts.budgetMs);
  const ladder = chosen ? orderLadder(results, chosen, objective.quality) : [];
  let removed: string | null = null;
  if (chosen) {
    const levels = [chosen, ...ladder.map((step) => results.find((r) => r.index === step.index)!)];
    writeTunedConfig(out, base, levels, ladder, opts.budgetMs);
  } else if (existsSync(out)) {
    // An earlier tune's choice would read as this one's: this tune chose nothing.
    rmSync(out);
    removed = out;
  }
  return {
    kind: 'percept.tune',
    version: 1,
    bag,
    config: configPath,
    labels: labelsPath,
    reference: referencePath,
    grid: grid.origin,
    mode,
    replay: replayKind,
    calibrations: calibrations.map((c) => c.path),
    latency: mode === 'real' ? 'measured' : 'modelled',
    seed: mode === 'real' ? null : base.virtualServiceSeed,
    latencies: latencyText(mode, calibrations, base.virtualServiceSeed),
    budgetMs: opts.budgetMs,
    objective: objective.text,
    quality: objective.quality,
    points: results.map((r) => ({
      ...r,
      pareto: front.has(r.index),
      feasible: feasible(r, objective, opts.budgetMs),
      resumed: resumed.has(r.index),
    })),
    ran: results.length - resumed.size,
    resumed: resumed.size,
    chosen: chosen ? { index: chosen.index, label: chosen.label, knobs: chosen.knobs } : null,
    ladder,
    out: chosen ? out : null,
    removed,
    state: statePath,
  };
}

// ---- the written config ----------------------------------------------------------------------------------

const CONFIG_SCHEMA = new URL('../../configs/percept.schema.json', import.meta.url).pathname;

/** `path` relative to `dir` when the two share a folder below the root (a config next to its models
 * and bags moves with them), else absolute. */
function relativeWithin(dir: string, path: string): string {
  const rel = relative(dir, path);
  const up = rel.split(sep).filter((part) => part === '..').length;
  return up < dir.split(sep).filter(Boolean).length ? rel : path;
}

/**
 * The base config with the chosen point's knobs, the budget and the ladder below it. Each level's
 * stage costs go in as virtualServiceMs, so a lockstep replay charges what the tune measured. Paths are
 * written relative to the file. Validated by loadConfig once written.
 */
function writeTunedConfig(
  out: string,
  base: PerceptConfig,
  levels: readonly PointResult[],
  steps: readonly LadderStep[],
  budgetMs: number,
): void {
  const text = `${JSON.stringify(tunedConfig(out, base, levels, steps, budgetMs), null, 2)}\n`;
  // Validated before it takes --out's place, in the same folder since its paths are relative to it.
  const partial = join(dirname(out), `.${basename(out, '.json')}.partial.json`);
  writeFileSync(partial, text);
  try {
    loadConfig(partial);
  } catch (err) {
    rmSync(partial, { force: true });
    throw new Error(`tune made a config for ${out} that does not load (nothing written): ${(err as Error).message}`, { cause: err });
  }
  renameSync(partial, out);
}

/**
 * The config written to `out` (see writeTunedConfig). The base ladder's frame-skip rungs (no grid
 * point measures skipping) stay below the tuned rungs, each at the last level's stage costs.
 */
export function tunedConfig(
  out: string,
  base: PerceptConfig,
  levels: readonly PointResult[],
  steps: readonly LadderStep[],
  budgetMs: number,
): Record<string, unknown> {
  const chosen = levels[0]!;
  const skips = base.ladder.rungs.flatMap((rung) => (rung.frameSkip !== undefined ? [{ frameSkip: rung.frameSkip }] : []));
  const costs = [...levels, ...skips.map(() => levels.at(-1)!)];
  const stages = [...new Set(levels.flatMap((l) => Object.keys(l.serviceMs)))];
  const config: Record<string, unknown> = {
    $schema: relativeWithin(dirname(out), CONFIG_SCHEMA),
    ...base,
    decoder: pointDecoder(base.decoder, chosen.knobs),
    edges: chosen.knobs.edges,
    budgets: budgetsFor(base.budgets, budgetMs),
    ladder: { ...base.ladder, enabled: true, initial: chosen.ladder, rungs: [...steps.map((step) => step.rung), ...skips] },
    virtualServiceMs: Object.fromEntries(stages.map((s) => [s, costs.map((l) => l.serviceMs[s] ?? 0)])),
  };
  for (const keys of PATH_FIELDS) {
    const parent = keys.slice(0, -1).reduce<unknown>((node, key) => (node as Record<string, unknown> | undefined)?.[key], config) as
      Record<string, unknown> | undefined;
    const value = parent?.[keys.at(-1)!];
    if (typeof value === 'string' && isAbsolute(value)) parent![keys.at(-1)!] = relativeWithin(dirname(out), value);
  }
  return config;
}

/** Whether a tune's latencies are measured or modelled, and from what. */
function latencyText(mode: 'virtual' | 'real', calibrations: readonly Calibration[], seed: number): string {
  if (mode === 'real') return 'measured on the real clock';
  const fixed = calibrations.filter((c) => c.version === 1).map((c) => c.path);
  const sampled = `stage costs sampled from the calibrated distributions (seed ${seed})`;
  if (fixed.length === 0) return `modelled, not measured: ${sampled}`;
  const medians = `fixed medians from version 1 calibrations (${fixed.join(', ')}; p99 = p50 per stage)`;
  return `modelled, not measured: ${fixed.length === calibrations.length ? medians : `${sampled}, except ${medians}`}`;
}

/** The points that could not be measured, each with why (a rerun tries them again). */
export function failedPoints(result: TuneResult): string[] {
  return result.points.filter((p) => p.status === 'failed').map((p) => `${p.label}: ${p.error ?? 'failed'}`);
}

/** The report printed after a tune (the Pareto table and what was chosen). */
export function formatTune(result: TuneResult): string {
  const measurable: Measurable = { labels: result.labels !== null, reference: result.reference !== null };
  const objective = parseObjective(result.objective, measurable);
  const chosen = result.points.find((p) => p.index === result.chosen?.index);
  const table = formatTable({
    results: result.points,
    front: new Set(result.points.filter((p) => p.pareto).map((p) => p.index)),
    chosen,
    objective,
    budgetMs: result.budgetMs,
    measurable,
  });
  const q = (v: number | null) => (v === null ? '-' : v.toFixed(3));
  const lines = [
    table,
    '',
    `'*' Pareto front (${result.quality} against end-to-end p99), '>' chosen; ${result.points.length} points: ${result.ran} measured, ${result.resumed} from ${result.state}`,
    `mode       ${result.mode} (${result.replay === 'real' ? 'real clock, the bag at its recorded pace' : result.replay === 'lockstep' ? 'virtual clock, lockstep, calibrated stage costs' : 'virtual clock, recorded pace, calibrated stage costs'})${result.calibrations.length ? `: ${result.calibrations.join(', ')}` : ''}`,
    `latencies  ${result.latencies}`,
    `objective  ${result.objective}, budget ${result.budgetMs} ms`,
  ];
  const failed = result.points.filter((p) => p.status === 'failed').length;
  const n = result.points.length;
  if (!chosen) {
    lines.push(
      failed === n
        ? 'chosen     none: every point failed (FAILED above); nothing written'
        : failed > 0
          ? `chosen     none: ${failed} of ${n} points failed (FAILED above), and none of the ${n - failed} measured meets the constraints; nothing written`
          : 'chosen     none: no point meets the constraints; nothing written',
    );
    if (result.removed) lines.push(`removed    ${result.removed} (an earlier tune's choice, not this one's)`);
    return `${lines.join('\n')}\n`;
  }
  if (failed > 0) lines.push(`failed     ${failed} of ${n} points (FAILED above): chosen among the ${n - failed} measured`);
  lines.push(
    `chosen     ${knobsText(chosen.knobs)} (${result.quality} ${q(metricOf(chosen, result.quality))}, p99 ${chosen.endToEnd.p99Ms?.toFixed(1)} ms)`,
  );
  result.ladder.forEach((step, i) =>
    lines.push(
      `ladder ${i + 1}   ${rungText(step.rung)}: saves ${step.savedMs.toFixed(1)} ms for ${q(step.qualityLost)} ${result.quality} (${step.msPerUnit === null ? 'no loss' : `${step.msPerUnit.toFixed(1)} ms per unit`})`,
    ),
  );
  if (result.ladder.length === 0) lines.push('ladder     no measured point is faster within reach of the ladder');
  lines.push(`wrote      ${result.out}`);
  return `${lines.join('\n')}\n`;
}
