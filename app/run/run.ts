// `percept run`: config → stages → graph → summary. This file is the only place that knows every
// stage; the stages themselves only know their input and output types.
import { mkdirSync } from 'node:fs';
import { access, constants, open, unlink } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DegradeLadder } from '../../pipeline/budget.ts';
import { RealClock, VirtualClock, type Clock } from '../../pipeline/clock.ts';
import { loadConfig, parseMetricsEndpoint, type PerceptConfig, type SourceConfig } from '../../pipeline/config.ts';
import { append, chain, type StageChain } from '../../pipeline/graph/chain.ts';
import { createGraph, stopOnSignals, type Graph } from '../../pipeline/graph/graph.ts';
import type { FinalRunSummary, RecorderSummary } from '../../pipeline/telemetry/events.ts';
import { LiveTable, formatSummary, writeJsonSummary } from '../../pipeline/telemetry/report.ts';
import type { FrameSource, Stage } from '../../pipeline/types.ts';
import type { Publisher } from '../../nodes/publisher.ts';
import { loadActionSchema, type ActionSchema } from '../../nodes/action-schema.ts';
import type { ActionMessage, CameraFrame } from '../../nodes/payloads.ts';
import type { Recorder } from '../../nodes/recorder.ts';
import type { MemoryBreakdown, ModelInfo } from '../../native/llama.ts';
import { resolveModel } from '../../models/resolve.ts';
import { replayRunId, runIdentity, type RunIdentity } from './identity.ts';
import {
  checkEncoderFitsDecoder,
  createEncoder,
  createPreprocessFor,
  createRemoteDecoder,
  createSource,
  describePublished,
  log,
  logWarmup,
  openFoxglove,
  openMetrics,
  openPublisher,
  runFailure,
  warmupFrames,
} from './stages.ts';
import type { MetricsServer } from './metrics.ts';
import type { FoxgloveLiveServer } from './foxglove.ts';

/** The config `percept run` and `npm start` use when none is given. */
export const DEFAULT_CONFIG = fileURLToPath(new URL('../../configs/default.json', import.meta.url));

export interface RunOptions {
  readonly config?: string;
  readonly source?: string;
  readonly duration?: number;
  readonly jsonSummary?: string;
  readonly clock?: 'real' | 'virtual';
  /** Record the run to this MCAP file (relative to the current directory). */
  readonly record?: string;
  /** Lockstep replay on the virtual clock: every frame is processed and the outputs are byte-identical. */
  readonly lockstep?: boolean;
  /** Serve Prometheus metrics and /healthz on [HOST:]PORT while the run goes on (app/run/metrics.ts); overrides metrics.endpoint. */
  readonly metrics?: string;
  /** Serve the live view over the Foxglove WebSocket protocol at this ws:// URL, or true for ws://127.0.0.1:8765 (app/run/foxglove.ts). */
  readonly foxglove?: string | boolean;
}

/** `pattern[:FPS[:FRAMES]]`, `bag:PATH`, `folder:PATH[:FPS]`, `ffmpeg:URL`, `zmq:ENDPOINT`, `ros2:TOPIC[:raw]` → the source section of a config, for
 * loadConfig to validate. What the spec leaves out comes from `current` when it is the same kind,
 * else from the schema's defaults. PATH is relative to the current directory. */
export function parseSourceSpec(spec: string, current: SourceConfig): Record<string, unknown> {
  const [kind, ...rest] = spec.split(':');
  const num = (text: string | undefined, key: string): Record<string, number> => {
    if (text === undefined || text === '') return {};
    const n = Number(text);
    if (!Number.isFinite(n) || n < 0) throw new Error(`--source ${spec}: ${key.toUpperCase()} must be a number >= 0, got '${text}'`);
    return { [key]: n };
  };
  const same = current.kind === kind ? current : { kind };
  switch (kind) {
    case 'pattern':
      return { ...same, ...num(rest[0], 'fps'), ...num(rest[1], 'frames') };
    case 'bag': {
      const path = rest.join(':');
      if (!path) throw new Error(`--source ${spec}: expected bag:PATH`);
      return { ...same, path: resolve(path) };
    }
    case 'folder': {
      if (!rest[0]) throw new Error(`--source ${spec}: expected folder:PATH[:FPS]`);
      return { kind, path: resolve(rest[0]), ...num(rest[1], 'fps') };
    }
    case 'ffmpeg': {
      const url = rest.join(':');
      if (!url) throw new Error(`--source ${spec}: expected ffmpeg:URL (a device, stream URL or video file)`);
      // A file path is relative to the current directory; a URL or device stays as written.
      const path = /^[a-z][a-z0-9+.-]*:/i.test(url) || url.startsWith('/') ? url : resolve(url);
      return { ...same, url: path };
    }
    case 'zmq': {
      const endpoint = rest.join(':');
      if (!endpoint) throw new Error(`--source ${spec}: expected zmq:ENDPOINT (e.g. zmq:tcp://127.0.0.1:5560)`);
      return { ...same, endpoint };
    }
    case 'ros2': {
      const [topic, type, ...extra] = rest;
      if (!topic || extra.length > 0 || (type !== undefined && type !== 'raw' && type !== 'compressed'))
        throw new Error(
          `--source ${spec}: expected ros2:TOPIC (sensor_msgs/msg/CompressedImage) or ros2:TOPIC:raw (sensor_msgs/msg/Image)`,
        );
      const messageType = type === 'raw' ? 'sensor_msgs/msg/Image' : 'sensor_msgs/msg/CompressedImage';
      return { ...same, topic, type: messageType };
    }
    default:
      throw new Error(`--source '${spec}': unknown kind '${kind}' (expected pattern, bag, folder, ffmpeg, zmq or ros2)`);
  }
}

export interface PipelineStages {
  /** camera frame → published (or, without the publisher, validated) action. */
  readonly chain: StageChain<CameraFrame, ActionMessage>;
  /** The publisher, when it is part of the chain. Its stage is the chain's last and its sink takes the
   * graph's events. The run closes it after the graph, with the final summary. */
  readonly publisher?: Publisher;
  /** The in-process decoder, absent for a remote one. It gives its llama_decode calls for the slowest action,
   * its model and its context's memory as it closed (DecoderStage.memoryAtClose). */
  readonly decoder?: {
    readonly worstCaseDecodeCalls: number | null;
    readonly modelInfo: ModelInfo;
    memoryAtClose(): MemoryBreakdown | null;
  };
}

export interface CreateStagesOptions {
  /** Default true. */
  readonly publish?: boolean;
  /** Default true. */
  readonly warmup?: boolean;
  /** The run's clock, for the publisher's headers. Default: a real clock, as the stages have on their own. */
  readonly clock?: Clock;
  /** The run's id on the wire, random by default. A virtual clock needs one (app/run/identity.ts). */
  readonly runId?: string;
}

/** Builds the stages in dependency order, publisher first:
 *   publisher  binds before models load, so a busy port fails fast and subscribers can join;
 *   decoder    its n_embd fixes the encoder's output width;
 *   encoder    its contract fixes preprocessing;
 *   then a warm-up (app/run/warmup.ts). On failure every stage built so far is closed.
 * `warmup: false` skips the warm-up. `publish: false` leaves the publisher out, for benchmarks. */
export async function createStages(
  config: PerceptConfig,
  actionSchema: ActionSchema,
  { publish = true, warmup = true, clock, runId }: CreateStagesOptions = {},
): Promise<PipelineStages> {
  const built: Stage<never, unknown>[] = [];
  const track = <S extends Stage<never, unknown>>(stage: S): S => {
    built.push(stage);
    return stage;
  };
  let publisher: Publisher | undefined;
  try {
    if (publish) publisher = await openPublisher(config, { clock, runId });
    if (config.decoder.kind === 'openai') {
      const validated = await createRemoteStages(config, actionSchema, warmup, track);
      return publisher ? { chain: append(validated, publisher.stage), publisher } : { chain: validated };
    }
    const { createDecoderStage } = await import('../../nodes/decoder.ts');
    const resolveDraft = async (spec: string | null) => (spec ? resolveModel(spec, 'decoder') : null);
    log(`decoder: ${config.decoder.model}`);
    const decoder = track(
      await createDecoderStage({
        ...config.decoder,
        model: await resolveModel(config.decoder.model, 'decoder'),
        draft: await resolveDraft(config.decoder.draft),
        draftMtp: await resolveDraft(config.decoder.draftMtp),
        actionSchema,
      }),
    );
    const { maxNewTokens, worstCaseDecodeCalls } = decoder;
    log(
      `decoder: an action takes at most ${maxNewTokens} tokens` +
        (worstCaseDecodeCalls !== null ? ` and ${worstCaseDecodeCalls} llama_decode calls after the prompt (any logits)` : ''),
    );
    const encoded = await createEncoder(config, decoder.nEmbd, decoder.contract);
    const { contract, stage: encoder, source: encoderSource } = encoded;
    track(encoder);
    checkEncoderFitsDecoder(
      { contract, source: encoderSource },
      { contract: decoder.contract, source: config.decoder.model, arch: decoder.modelInfo.arch },
    );
    const { createActionsStage } = await import('../../nodes/actions.ts');
    const preprocess = track(await createPreprocessFor(config, encoded));
    const actions = track(createActionsStage({ schema: actionSchema }));
    if (warmup) {
      const { warmUpStages, WARMUP_FRAMES } = await import('./warmup.ts');
      const ladder = new DegradeLadder(config.ladder, config.budgets.endToEndMs);
      const levels = config.ladder.enabled ? Array.from({ length: ladder.levels }, (_, i) => ladder.knobsAt(i)) : [ladder.knobsAt(0)];
      const frames = await warmupFrames(config.source, WARMUP_FRAMES);
      logWarmup(await warmUpStages({ preprocess, encode: encoder, decode: decoder }, frames, levels), contract);
    }
    const validated = chain(preprocess, encoder, decoder, actions);
    const bounds = { decoder: { worstCaseDecodeCalls, modelInfo: decoder.modelInfo, memoryAtClose: () => decoder.memoryAtClose() } };
    if (!publisher) return { chain: validated, ...bounds };
    return { chain: append(validated, publisher.stage), publisher, ...bounds };
  } catch (err) {
    for (const stage of built) await stage.close?.().catch(() => undefined);
    await publisher?.close();
    throw err;
  }
}

/** decoder.kind "openai": the server takes the camera frame, so the chain is [decode, actions]. */
async function createRemoteStages(
  config: PerceptConfig,
  actionSchema: ActionSchema,
  warmup: boolean,
  track: <S extends Stage<never, unknown>>(stage: S) => S,
): Promise<StageChain<CameraFrame, ActionMessage>> {
  const decoder = track(await createRemoteDecoder(config, actionSchema, warmup ? { source: config.source, ladder: config.ladder } : null));
  const { createActionsStage } = await import('../../nodes/actions.ts');
  return chain(decoder, track(createActionsStage({ schema: actionSchema })));
}

/** The config a `percept run` uses: the file or the embedded default, with the command line's
 * overrides. It is validated again, so the overrides obey the same schema as the file. */
export function runConfig(opts: RunOptions): PerceptConfig {
  const base = loadConfig(opts.config ?? DEFAULT_CONFIG);
  const overrides: Record<string, unknown> = {};
  if (opts.source) overrides.source = parseSourceSpec(opts.source, base.source);
  if (opts.clock) overrides.clock = opts.clock;
  if (opts.lockstep) Object.assign(overrides, { clock: 'virtual', lockstep: true });
  if (opts.record) overrides.recorder = { ...base.recorder, enabled: true, path: resolve(opts.record) };
  if (opts.metrics !== undefined) {
    if (!parseMetricsEndpoint(opts.metrics))
      throw new Error(`--metrics ${opts.metrics}: expected PORT or HOST:PORT with a port 0–65535, e.g. 9464 or 127.0.0.1:9464`);
    overrides.metrics = { ...base.metrics, endpoint: opts.metrics };
  }
  return Object.keys(overrides).length ? loadConfig({ ...base, ...overrides }) : base;
}

export interface RunResult {
  /** With `recorder` when the run had a recording. */
  readonly summary: FinalRunSummary;
  /** Why the run failed (its exit code is then 1), or undefined. */
  readonly failure: string | undefined;
}

export interface ExecuteOptions {
  /** Publish actions over ZeroMQ (default true). Eval runs without. */
  readonly publish?: boolean;
  /** Stop after this many seconds of real time. */
  readonly duration?: number;
  /** Draw the live table per config.telemetry (default true). */
  readonly liveTable?: boolean;
  /** Called with the graph before it runs (to follow its events), and the source's message count when known. */
  readonly onStart?: (graph: Graph, expectedFrames: number | undefined) => void;
  /** [HOST:]PORT for Prometheus metrics and /healthz; default config.metrics.endpoint (null: none). */
  readonly metrics?: string;
  /** The live view's ws:// URL, or true for the default (RunOptions.foxglove). */
  readonly foxglove?: string | boolean;
}

/** Runs the pipeline of `config` once: recorder, source, stages, graph. The recorder's path is checked first, so a
 * bad path fails before any model loads; the file is created once the stages are built, so a failed or interrupted
 * start leaves no empty recording. Everything is closed on the way out, whatever happens.
 * A failed recording is said at once (an error event of stage 'recorder', the log), stops the run unless
 * recorder.onError is 'continue', fails it either way, and is in the summary's `recorder`. */
export async function executeRun(config: PerceptConfig, opts: ExecuteOptions = {}): Promise<RunResult> {
  const actionSchema = loadActionSchema(config.actions.schema);
  if (config.recorder.enabled) await checkRecorderPath(config.recorder.path);
  const publish = opts.publish ?? true;
  let source: FrameSource<CameraFrame> | undefined;
  let stages: PipelineStages | undefined;
  let recorder: Recorder | undefined;
  let clock: Clock;
  let identity: RunIdentity | undefined;
  let runId: string | undefined;
  // The recorder's first failure, whenever it comes (a write, a background flush, the close).
  let recorderFailed: { readonly error: Error; readonly atNs: bigint } | undefined;
  let onRecorderFailure: (error: Error) => void = () => undefined;
  try {
    source = await createSource(config.source, config.preprocess.maxPixels, config.ros2);
    // A virtual replay of a bag runs on the bag's own time line, so its recording's times are the bag's.
    clock = config.clock === 'virtual' ? new VirtualClock(source.startNs ?? 0n) : new RealClock();
    // A replay is named by what makes it (app/run/identity.ts), known before its first message.
    if (clock.virtual && (publish || config.recorder.enabled)) {
      identity = await runIdentity(config, actionSchema);
      runId = replayRunId(identity);
    }
    stages = await createStages(config, actionSchema, { publish, clock, runId });
    const failClock = clock;
    if (config.recorder.enabled)
      recorder = await openRecorder(config, actionSchema, (error) => {
        recorderFailed ??= { error, atNs: failClock.nowNs() };
        onRecorderFailure(error);
      });
  } catch (err) {
    await source?.close?.();
    for (const stage of stages?.chain.stages ?? []) await stage.close?.().catch(() => undefined);
    await stages?.publisher?.close();
    throw err;
  }
  const graph = createGraph({ source, stages: stages.chain, clock, config });
  const { publisher } = stages;
  const recorderErrors: string[] = [];
  onRecorderFailure = (error) => {
    const lost = recorder?.bytesLost ?? 0;
    const written = recorder?.bytesWritten ?? 0;
    const stop = config.recorder.onError === 'stop';
    const message = `${error.message} (${lost} bytes lost so far, ${written} written; ${stop ? 'stopping the run' : 'the run continues unrecorded'})`;
    log(`recorder: ${message}`);
    publisher?.sink.accept({ type: 'error', atNs: clock.nowNs(), frameId: -1, stage: 'recorder', message });
    if (stop) void graph.stop('recorder failed');
  };
  const table = new LiveTable({
    mode: opts.liveTable === false ? 'off' : config.telemetry.liveTable,
    intervalMs: config.telemetry.intervalMs,
  });
  let control: Awaited<ReturnType<(typeof import('./control.ts'))['startControlServer']>> | undefined;
  let removeSignals: (() => void) | undefined;
  let metrics: MetricsServer | undefined;
  let foxglove: FoxgloveLiveServer | undefined;
  let timer: NodeJS.Timeout | undefined;
  let running = false;
  try {
    if (recorder) {
      identity ??= await runIdentity(config, actionSchema);
      // A failure here is the recorder's first: onRecorderFailure has said so and the run stops below, or goes on (continue).
      await recorder.writeMetadata('percept.run', runMetadata(config, identity, clock, publisher?.runId ?? runId)).catch(() => undefined);
      recordGraph(graph, recorder, clock, config.recorder.frames, (err) => recorderErrors.push(err.message));
    }
    if (config.control.enabled) {
      const { startControlServer } = await import('./control.ts');
      control = await startControlServer(config.control, graph.control);
      log(`control socket on ${control.endpoint}`);
    }
    // Drops, cancels, degrade steps, errors, source incidents and periodic stats go to the
    // publisher's topics, so a robot stack sees each decision of the graph. The publisher outlives
    // the graph: it closes after the run's last stats, with the final summary as the last event.
    if (publisher) graph.events.subscribe(publisher.sink.accept);
    // The ROS 2 publisher's detections need each frame's pixel size.
    if (config.ros2.publish) (await import('./ros2.ts')).tapFrameSizes(publisher, graph.inputs);
    // What the source reports besides frames (skipped or damaged input, restarts), as it happens.
    graph.events.subscribe((event) => {
      if (event.type === 'source') log(`source ${event.kind}: ${event.detail}`);
    });
    opts.onStart?.(graph, source.expectedItems);
    const metricsEndpoint = opts.metrics ?? config.metrics.endpoint;
    if (metricsEndpoint) metrics = await openMetrics(metricsEndpoint, graph.events, publisher);
    if (opts.foxglove) foxglove = await openFoxglove(opts.foxglove, { graphs: [graph], events: graph.events, clock });
    table.attach(graph.events);
    removeSignals = stopOnSignals(graph);
    timer = opts.duration ? setTimeout(() => void graph.stop('duration'), opts.duration * 1000) : undefined;
    running = true;
    const startNs = clock.nowNs();
    // A recorder that failed before the run (its metadata) stops it before its first frame.
    if (recorderFailed && config.recorder.onError === 'stop') void graph.stop('recorder failed');
    let summary: FinalRunSummary = await graph.run();
    await control?.close();
    table.detach();
    if (recorder) {
      await recorder.close().catch((err: Error) => recorderErrors.push(err.message));
      if (!recorderFailed && recorderErrors.length === 0) log(`recorded the run to ${config.recorder.path}`);
      summary = { ...summary, recorder: recorderSummary(config, recorder, recorderFailed, startNs) };
    }
    const published = await publisher?.close(summary);
    if (published) log(`published ${describePublished(published)}`);
    const notRecorded = recorder?.counts.framesNotRecorded ?? 0;
    if (notRecorded > 0) log(`recorder: ${notRecorded} frames were not recorded (the disk did not keep up)`);
    const recordingFailure = recorderFailed?.error.message ?? recorderErrors[0];
    const failure =
      (recordingFailure && config.recorder.onError === 'stop'
        ? `the recording failed, so the run stopped: ${recordingFailure}`
        : undefined) ??
      runFailure(summary) ??
      (recordingFailure ? `the recording failed: ${recordingFailure}` : undefined);
    return { summary, failure };
  } finally {
    if (timer) clearTimeout(timer);
    removeSignals?.();
    table.detach();
    // The graph closes the source and the stages when it runs; before that, they are closed here.
    if (!running) for (const closable of [source, ...stages.chain.stages]) await closable.close?.().catch(() => undefined);
    // All three are idempotent: after a failure they still release their files and endpoints.
    await control?.close();
    await publisher?.close();
    await recorder?.close().catch(() => undefined);
    await metrics?.close();
    await foxglove?.close();
  }
}

/** The summary's `recorder`, once the recorder has closed. */
function recorderSummary(
  config: PerceptConfig,
  recorder: Recorder,
  failed: { readonly error: Error; readonly atNs: bigint } | undefined,
  startNs: bigint,
): RecorderSummary {
  const failure = failed?.error ?? recorder.failure;
  return {
    ok: failure === undefined,
    error: failure?.message ?? null,
    failedAtMs: failed ? Math.max(0, Number(failed.atNs - startNs) / 1e6) : null,
    bytesWritten: recorder.bytesWritten,
    bytesLost: recorder.bytesLost,
    onError: config.recorder.onError,
  };
}

/** Runs the pipeline and resolves with the process exit code, 1 when the run failed (saying why). */
export async function runPipeline(opts: RunOptions): Promise<number> {
  const config = runConfig(opts);
  // runConfig put --metrics into config.metrics.endpoint.
  if (config.cameras) return (await import('./cameras.ts')).runCameras(config, { ...opts, metrics: config.metrics.endpoint ?? undefined });
  const { summary, failure } = await executeRun(config, { duration: opts.duration, foxglove: opts.foxglove });
  process.stdout.write(`${formatSummary(summary)}\n`);
  if (opts.jsonSummary) writeJsonSummary(opts.jsonSummary, summary);
  if (failure) log(failure);
  return failure ? 1 : 0;
}

/** Fails (`recorder: cannot create …`) when the recording's path cannot take a file: its folder cannot be made or
 * written, it is a directory, a device or on a kernel filesystem. Creates the folder, but not the file. */
async function checkRecorderPath(path: string): Promise<void> {
  try {
    mkdirSync(dirname(path), { recursive: true });
  } catch (err) {
    throw new Error(`recorder: cannot create the folder of ${path}: ${(err as Error).message}`, { cause: err });
  }
  const { checkRecordingPath } = await import('../../nodes/recorder.ts');
  await checkRecordingPath(path);
  try {
    // An existing file must be writable; a new one is created and removed again, so nothing is left behind.
    const existed = await access(path, constants.F_OK).then(
      () => true,
      () => false,
    );
    if (existed) await access(path, constants.W_OK);
    else {
      await (await open(path, 'wx')).close();
      await unlink(path);
    }
  } catch (err) {
    throw new Error(`recorder: cannot create ${path}: ${(err as Error).message}`, { cause: err });
  }
}

async function openRecorder(config: PerceptConfig, actionSchema: ActionSchema, onFailure: (error: Error) => void): Promise<Recorder> {
  const { path, chunkMs, profile } = config.recorder;
  const { createRecorder } = await import('../../nodes/recorder.ts');
  // On a virtual clock, chunks close on log time only: the file must not depend on how fast the run went.
  return createRecorder({ path, actionSchema, chunkMs, profile, flushAfterMs: config.clock === 'virtual' ? null : chunkMs, onFailure });
}

/** Records the run: each input frame, each action with its frame's stamp, every event and stats. */
function recordGraph(graph: Graph, recorder: Recorder, clock: Clock, frames: boolean, onError: (err: Error) => void): void {
  // Stamp of each frame in the graph, so the events about it carry it too.
  const stamps = new Map<number, bigint>();
  graph.inputs.subscribe((env) => {
    if (!frames) return;
    const meta = { frameId: env.frameId, sourceId: env.sourceId, stampNs: env.stampNs ?? clock.unixNs(env.captureNs) };
    recorder.recordFrame(env.payload as CameraFrame, meta, clock.unixNs(env.captureNs)).catch(onError);
  });
  graph.events.subscribe((event) => {
    const atNs = clock.unixNs(event.atNs);
    if (event.type === 'stats') {
      recorder.recordStats(event.summary, atNs).catch(onError);
      return;
    }
    if (event.type === 'frame' && event.stampNs !== undefined) stamps.set(event.frameId, event.stampNs);
    const stampNs = 'frameId' in event ? stamps.get(event.frameId) : undefined;
    recorder.recordEvent(event, atNs, stampNs ?? atNs).catch(onError);
    if (event.type === 'output' || event.type === 'drop') stamps.delete(event.frameId);
  });
  graph.outputs.subscribe((env) => {
    const exitNs = env.spans.at(-1)?.exitNs ?? clock.nowNs();
    const action = env.payload as ActionMessage;
    recorder.recordAction(action, env.stampNs ?? clock.unixNs(env.captureNs), clock.unixNs(exitNs)).catch(onError);
  });
}

/** The recording's `percept.run` metadata: what made the run and the id its published stream carries.
 * Only a real clock adds when it started, since a replay's file must be the same every time. */
function runMetadata(config: PerceptConfig, identity: RunIdentity, clock: Clock, runId: string | undefined): Record<string, string> {
  return {
    ...identity,
    node_version: process.version,
    // Without the recording's own path: two replays into two files record the same run.
    recorder: JSON.stringify({ ...config.recorder, path: undefined }),
    clock: config.clock,
    lockstep: String(config.lockstep),
    ...(runId ? { run_id: runId } : {}),
    ...(clock.virtual ? {} : { started_unix_ns: String(clock.unixNs(clock.nowNs())) }),
  };
}
