// `percept run`: config → stages → graph → summary. This file is the only place that knows every
// stage; the stages themselves only know their input and output types.
import { mkdirSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DegradeLadder } from '../pipeline/budget.ts';
import { RealClock, VirtualClock, type Clock } from '../pipeline/clock.ts';
import { loadConfig, type PerceptConfig, type SourceConfig } from '../pipeline/config.ts';
import { append, chain, type StageChain } from '../pipeline/graph/chain.ts';
import { createGraph, stopOnSignals, type Graph } from '../pipeline/graph/graph.ts';
import type { RunSummary } from '../pipeline/telemetry/events.ts';
import { LiveTable, formatSummary, writeJsonSummary } from '../pipeline/telemetry/report.ts';
import type { FrameSource, Stage } from '../pipeline/types.ts';
import type { OpenAIDecoderStage } from '../nodes/decoder-openai.ts';
import type { PreprocessStage } from '../nodes/preprocess.ts';
import type { Publisher } from '../nodes/publisher.ts';
import { loadActionSchema, type ActionSchema } from '../nodes/action-schema.ts';
import type { ActionMessage, CameraFrame, EncoderContract, ImageEmbedding, PixelAllocator, PixelTensor } from '../nodes/payloads.ts';
import type { Recorder } from '../nodes/recorder.ts';
import type { MemoryBreakdown } from '../native/llama.ts';
import { resolveModel } from '../models/resolve.ts';
import { replayRunId, runIdentity, type RunIdentity } from './run-identity.ts';

/** The config `percept run` and `npm start` use when none is given. */
export const DEFAULT_CONFIG = fileURLToPath(new URL('../configs/default.json', import.meta.url));

export interface RunOptions {
  readonly config?: string;
  readonly source?: string;
  readonly duration?: number;
  readonly jsonSummary?: string;
  readonly clock?: 'real' | 'virtual';
  /** Record the run to this MCAP file (relative to the current directory). */
  readonly record?: string;
  /** Lockstep replay on the virtual clock (every frame processed; byte-identical outputs). */
  readonly lockstep?: boolean;
}

const log = (msg: string) => process.stderr.write(`percept: ${msg}\n`);

/** `pattern[:FPS[:FRAMES]]`, `bag:PATH`, `folder:PATH[:FPS]`, `ffmpeg:URL`, `zmq:ENDPOINT` → the source section of a config, for
 * loadConfig to validate: what the spec leaves out comes from `current` when it is the same kind,
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
    default:
      throw new Error(`--source '${spec}': unknown kind '${kind}' (expected pattern, bag, folder, ffmpeg or zmq)`);
  }
}

export async function createSource(config: SourceConfig): Promise<FrameSource<CameraFrame>> {
  switch (config.kind) {
    case 'pattern': {
      const { createPatternSource } = await import('../nodes/source-pattern.ts');
      return createPatternSource({
        fps: config.fps,
        frames: config.frames === 0 ? Infinity : config.frames,
        width: config.width,
        height: config.height,
      });
    }
    case 'bag': {
      const { createBagSource } = await import('../nodes/source-bag.ts');
      const source = await createBagSource({
        path: config.path,
        ...(config.topic !== undefined ? { topic: config.topic } : {}),
        ...(config.type !== undefined ? { type: config.type } : {}),
        pace: config.pace,
        rate: config.rate,
        loop: config.loop,
      });
      log(`replaying ${source.description}`);
      return source;
    }
    case 'folder': {
      const { createFolderSource } = await import('../nodes/source-folder.ts');
      return createFolderSource({ path: config.path, fps: config.fps, onIssue: (issue) => log(`folder: ${issue.file}: ${issue.reason}`) });
    }
    case 'ffmpeg': {
      const { createFfmpegSource } = await import('../nodes/source-ffmpeg.ts');
      const { kind: _kind, ...options } = config;
      return createFfmpegSource(options);
    }
    case 'zmq': {
      const { createZmqSource } = await import('../nodes/source-zmq.ts');
      const { kind: _kind, ...options } = config;
      const source = await createZmqSource(options);
      log(`frames from ${source.endpoint} (${config.socket}${config.bind ? ', bound' : ''})`);
      return source;
    }
  }
}

/** Refuses a vision encoder made for another decoder architecture (a Gemma 3 SigLIP encoder in front
 * of a Gemma 4 decoder would feed it embeddings of the wrong model, even when the widths agree). */
export function checkEncoderFitsDecoder(
  encoder: { readonly contract: EncoderContract; readonly source: string },
  decoder: { readonly contract: EncoderContract; readonly source: string; readonly arch: string },
): void {
  if (encoder.contract === decoder.contract) return;
  throw new Error(
    `encoder ${encoder.source} has the ${encoder.contract} vision contract, but decoder ${decoder.source} is a ${decoder.arch} model that needs a ${decoder.contract} vision encoder`,
  );
}

/** Pattern frames of the warm-up count down from here: none a pattern source starts with. The decoder keeps the last
 * prompt's KV cache; after a warm-up on the run's own first image, the first frame would reuse the
 * whole prompt, image included (a prefill no later frame gets, and one a camera never gives). */
const WARMUP_PATTERN_INDEX = 0xffff;

/** `count` distinct frames for the warm-up to push through the stages (app/warmup.ts's WARMUP_FRAMES):
 * pattern images at the pattern source's own size, else 720p. */
export async function warmupFrames(source: SourceConfig, count: number): Promise<CameraFrame[]> {
  const { encodePatternFrame } = await import('../nodes/source-pattern.ts');
  const [width, height] = source.kind === 'pattern' ? [source.width, source.height] : [1280, 720];
  return Promise.all(
    Array.from({ length: count }, async (_, i) => ({
      encoding: 'jpeg' as const,
      data: await encodePatternFrame(WARMUP_PATTERN_INDEX - i, width, height),
      width,
      height,
    })),
  );
}

export interface PipelineStages {
  /** camera frame → published (or, without the publisher, validated) action. */
  readonly chain: StageChain<CameraFrame, ActionMessage>;
  /** The publisher, when it is part of the chain: its stage is the chain's last, its sink takes the
   * graph's events, and the run closes it after the graph, with the final summary. */
  readonly publisher?: Publisher;
  /** The in-process decoder (absent for a remote one): its llama_decode calls for the slowest action,
   * and its context's memory as it closed (DecoderStage.memoryAtClose). */
  readonly decoder?: { readonly worstCaseDecodeCalls: number | null; memoryAtClose(): MemoryBreakdown | null };
}

/** Role → model id for the action headers: the config's spec (synth:…) or the file's name. */
export function modelIds(config: PerceptConfig): Record<string, string> {
  // A remote server's model (vision tower included) is named by the id it serves.
  if (config.decoder.kind === 'openai') return { decoder: config.decoder.model };
  const id = (spec: string): string => (spec.startsWith('synth:') ? spec : basename(spec));
  const ids: Record<string, string> = { decoder: id(config.decoder.model) };
  const { encoder } = config;
  ids.encoder = encoder.kind === 'onnx' ? id(encoder.model) : encoder.kind === 'mtmd' ? id(encoder.mmproj) : `projection@${encoder.seed}`;
  if (config.decoder.draft) ids.draft = id(config.decoder.draft);
  if (config.decoder.draftMtp) ids.draft = id(config.decoder.draftMtp);
  return ids;
}

export interface CreateStagesOptions {
  /** Default true. */
  readonly publish?: boolean;
  /** Default true. */
  readonly warmup?: boolean;
  /** The run's clock, for the publisher's headers (default: a real clock: the stages on their own). */
  readonly clock?: Clock;
  /** The run's id on the wire (default: a random one; a virtual clock needs one, see run-identity.ts). */
  readonly runId?: string;
}

/** Builds the stages: the publisher first (it binds before the models load, so a busy endpoint fails
 * at once and subscribers have the load time to connect: a ZeroMQ PUB drops what it sends before a
 * subscription arrives, and the first action comes soon after the run starts), then in dependency
 * order the decoder (its n_embd fixes the encoder's output width) and the encoder (its contract fixes
 * preprocessing), then warms them up (see app/warmup.ts; `warmup: false` skips it). `publish: false`
 * leaves the publisher out (benchmarks that end at the validated action). A stage made before a step
 * that fails is closed, and so is the publisher. */
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
    if (publish) {
      const { createPublisher } = await import('../nodes/publisher.ts');
      publisher = await createPublisher({ ...config.publisher, clock, runId, models: modelIds(config) });
      log(`publishing on ${publisher.endpoint}: topics '${config.publisher.topic}', 'events', 'telemetry' (run ${publisher.runId})`);
    }
    if (config.decoder.kind === 'openai') {
      const validated = await createRemoteStages(config, actionSchema, warmup, track);
      return publisher ? { chain: append(validated, publisher.stage), publisher } : { chain: validated };
    }
    const { createDecoderStage } = await import('../nodes/decoder.ts');
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
    const { createActionsStage } = await import('../nodes/actions.ts');
    const preprocess = track(await createPreprocessFor(config, encoded));
    const actions = track(createActionsStage({ schema: actionSchema }));
    if (warmup) {
      const { warmUpStages, WARMUP_FRAMES } = await import('./warmup.ts');
      const ladder = new DegradeLadder(config.ladder, config.budgets.endToEndMs);
      const levels = config.ladder.enabled ? Array.from({ length: ladder.levels }, (_, i) => ladder.knobsAt(i)) : [ladder.knobsAt(0)];
      const frames = await warmupFrames(config.source, WARMUP_FRAMES);
      const steps = await warmUpStages({ preprocess, encode: encoder, decode: decoder }, frames, levels);
      for (const step of steps) {
        const times = Object.entries(step.ms)
          .map(([name, ms]) => `${name} ${ms.toFixed(0)} ms`)
          .join(', ');
        log(`warm-up (${contract === 'gemma4' ? step.imageTokens : 256} image tokens): ${times}`);
      }
    }
    const validated = chain(preprocess, encoder, decoder, actions);
    const bounds = { decoder: { worstCaseDecodeCalls, memoryAtClose: () => decoder.memoryAtClose() } };
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
  const { createActionsStage } = await import('../nodes/actions.ts');
  return chain(decoder, track(createActionsStage({ schema: actionSchema })));
}

/** The remote decode stage of decoder.kind "openai". Its load-time probe has run the server's vision
 * and decoder once; `warmup` sends one frame of that source's size at the ladder's first level, so the
 * server's first image graph of that size is not paid by a real frame. */
export async function createRemoteDecoder(
  config: PerceptConfig,
  actionSchema: ActionSchema,
  warmup: { readonly source: SourceConfig; readonly ladder: PerceptConfig['ladder'] } | null,
): Promise<OpenAIDecoderStage> {
  const { apiKeyFromEnv, createOpenAIDecoderStage } = await import('../nodes/decoder-openai.ts');
  const { endpoint, apiKey, ...decoderConfig } = config.decoder;
  const key = apiKeyFromEnv(apiKey);
  const decoder = await createOpenAIDecoderStage({ ...decoderConfig, endpoint: endpoint!, ...(key ? { apiKey: key } : {}), actionSchema });
  const { server } = decoder;
  log(
    `decoder: ${server.name} at ${server.baseUrl}, model ${server.model}, ${config.decoder.concurrency} in flight (probe ${server.probeMs.toFixed(0)} ms)`,
  );
  if (warmup) {
    const { standaloneContext } = await import('../pipeline/standalone.ts');
    const knobs = new DegradeLadder(warmup.ladder, config.budgets.endToEndMs).knobsAt(0);
    const t0 = performance.now();
    const [frame] = await warmupFrames(warmup.source, 1);
    await decoder.process(frame!, standaloneContext({ frame: { sourceId: 'warmup' }, knobs }));
    log(`warm-up (remote): decode ${(performance.now() - t0).toFixed(0)} ms`);
  }
  return decoder;
}

export type CreatedEncoder = Awaited<ReturnType<typeof createEncoder>>;

/** The preprocess stage for an encoder: its contract, the config's limits, the encoder's pixel
 * memory where it has its own (pinned host memory on CUDA), and JPEG frames left to the encoder's GPU
 * where it decodes them and the config allows. */
export async function createPreprocessFor(config: PerceptConfig, encoder: CreatedEncoder): Promise<PreprocessStage> {
  const { createPreprocessStage } = await import('../nodes/preprocess.ts');
  const jpegToEncoder = config.preprocess.jpegDecode === 'auto' && encoder.decodesJpeg === true;
  return createPreprocessStage({
    contract: encoder.contract,
    maxPixels: config.preprocess.maxPixels,
    threads: config.preprocess.threads,
    ...(encoder.allocatePixels ? { allocate: encoder.allocatePixels } : {}),
    ...(jpegToEncoder ? { jpegToEncoder } : {}),
  });
}

export async function createEncoder(
  config: PerceptConfig,
  nEmbd: number,
  decoderContract: EncoderContract,
): Promise<{
  contract: EncoderContract;
  stage: Stage<PixelTensor, ImageEmbedding>;
  source: string;
  allocatePixels?: PixelAllocator;
  /** The stage decodes JPEG frames on its GPU (PixelTensor.jpeg). */
  decodesJpeg?: boolean;
}> {
  switch (config.encoder.kind) {
    case 'onnx': {
      const { createOnnxEncoderStage } = await import('../nodes/encoder-onnx.ts');
      log(`encoder: ${config.encoder.model}`);
      const stage = await createOnnxEncoderStage({
        model: await resolveModel(config.encoder.model, 'vision'),
        ep: config.encoder.executionProvider,
        threads: config.encoder.threads,
        expectedHidden: nEmbd,
      });
      return { contract: stage.contract.kind, stage, source: config.encoder.model };
    }
    case 'projection': {
      const { createProjectionEncoderStage } = await import('../nodes/encoder-projection.ts');
      return {
        contract: decoderContract,
        stage: createProjectionEncoderStage({ nEmbd, seed: config.encoder.seed, tokens: config.encoder.tokens }),
        source: 'projection',
      };
    }
    case 'mtmd': {
      const { createMtmdEncoderStage } = await import('../nodes/encoder-mtmd.ts');
      log(`encoder (llama.cpp clip): ${config.encoder.mmproj}`);
      const stage = await createMtmdEncoderStage({
        mmproj: await resolveModel(config.encoder.mmproj, 'mmproj'),
        gpuLayers: config.encoder.gpuLayers,
        expectedHidden: nEmbd,
      });
      if (stage.decodesJpeg)
        log(
          `encoder: JPEG frames decoded on the GPU (nvJPEG)${config.preprocess.jpegDecode === 'host' ? ', but preprocess.jpegDecode is host' : ''}`,
        );
      return {
        contract: stage.contract.kind,
        stage,
        source: config.encoder.mmproj,
        allocatePixels: stage.allocatePixels,
        decodesJpeg: stage.decodesJpeg,
      };
    }
  }
}

/** `actions 12 (dropped 0), events 3 (dropped 0), …`: what each topic sent and what its queue dropped. */
export function describePublished(stats: ReturnType<Publisher['stats']>): string {
  return Object.entries(stats)
    .map(([topic, s]) => `${topic} ${s.sent}${s.dropped ? ` (dropped ${s.dropped}: a subscriber read too slowly)` : ''}`)
    .join(', ');
}

/** Why a run that published nothing failed, or undefined when it published. */
export function runFailure(summary: RunSummary): string | undefined {
  if (summary.endReason === 'source_error') return 'the source failed (see the error above)';
  if (summary.frames.out > 0) return undefined;
  if (summary.frames.in === 0) return 'the source produced no frames';
  const reasons = Object.entries(summary.drops.byReason).map(([reason, n]) => `${reason} ${n}`);
  return `nothing was published: all ${summary.frames.in} frames were dropped (${reasons.join(', ')})`;
}

/** The config a `percept run` uses: the file (or the embedded default) with the command line's
 * overrides, validated again so they obey the same schema as the file. */
export function runConfig(opts: RunOptions): PerceptConfig {
  const base = loadConfig(opts.config ?? DEFAULT_CONFIG);
  const overrides: Record<string, unknown> = {};
  if (opts.source) overrides.source = parseSourceSpec(opts.source, base.source);
  if (opts.clock) overrides.clock = opts.clock;
  if (opts.lockstep) Object.assign(overrides, { clock: 'virtual', lockstep: true });
  if (opts.record) overrides.recorder = { ...base.recorder, enabled: true, path: resolve(opts.record) };
  return Object.keys(overrides).length ? loadConfig({ ...base, ...overrides }) : base;
}

export interface RunResult {
  readonly summary: RunSummary;
  /** Why the run failed (its exit code is then 1), or undefined. */
  readonly failure: string | undefined;
}

export interface ExecuteOptions {
  /** Publish actions over ZeroMQ (default true; eval runs without). */
  readonly publish?: boolean;
  /** Stop after this many seconds of real time. */
  readonly duration?: number;
  /** Draw the live table per config.telemetry (default true). */
  readonly liveTable?: boolean;
  /** Called with the graph before it runs (to follow its events), and the source's message count when known. */
  readonly onStart?: (graph: Graph, expectedFrames: number | undefined) => void;
}

/** Runs the pipeline of `config` once: recorder (first, so a bad path fails before any model loads),
 * source, stages, graph; everything is closed on the way out, whatever happens. */
export async function executeRun(config: PerceptConfig, opts: ExecuteOptions = {}): Promise<RunResult> {
  const actionSchema = loadActionSchema(config.actions.schema);
  const recorder = config.recorder.enabled ? await openRecorder(config, actionSchema) : undefined;
  const publish = opts.publish ?? true;
  let source: FrameSource<CameraFrame> | undefined;
  let stages: PipelineStages | undefined;
  let clock: Clock;
  let identity: RunIdentity | undefined;
  let runId: string | undefined;
  try {
    source = await createSource(config.source);
    // A virtual replay of a bag runs on the bag's own time line, so its recording's times are the bag's.
    clock = config.clock === 'virtual' ? new VirtualClock(source.startNs ?? 0n) : new RealClock();
    // A replay is named by what makes it (see run-identity.ts), known before its first message.
    if (clock.virtual && (publish || recorder)) {
      identity = await runIdentity(config, actionSchema);
      runId = replayRunId(identity);
    }
    stages = await createStages(config, actionSchema, { publish, clock, runId });
  } catch (err) {
    await source?.close?.();
    await recorder?.close().catch(() => undefined);
    throw err;
  }
  const graph = createGraph({ source, stages: stages.chain, clock, config });
  const { publisher } = stages;
  const recorderErrors: string[] = [];
  const table = new LiveTable({
    mode: opts.liveTable === false ? 'off' : config.telemetry.liveTable,
    intervalMs: config.telemetry.intervalMs,
  });
  let control: Awaited<ReturnType<(typeof import('./control.ts'))['startControlServer']>> | undefined;
  let removeSignals: (() => void) | undefined;
  let timer: NodeJS.Timeout | undefined;
  let running = false;
  try {
    if (recorder) {
      identity ??= await runIdentity(config, actionSchema);
      await recorder.writeMetadata('percept.run', runMetadata(config, identity, clock, publisher?.runId ?? runId));
      recordGraph(graph, recorder, clock, config.recorder.frames, (err) => {
        if (recorderErrors.length === 0) log(`recorder: ${err.message}`);
        recorderErrors.push(err.message);
      });
    }
    if (config.control.enabled) {
      const { startControlServer } = await import('./control.ts');
      control = await startControlServer(config.control, graph.control);
      log(`control socket on ${control.endpoint}`);
    }
    // Drops, cancels, degrade steps, errors, source incidents and the periodic stats go to the
    // publisher's topics, so a robot stack sees every decision the graph makes. The publisher outlives
    // the graph: it closes after the run's last stats, with the final summary as the last event.
    if (publisher) graph.events.subscribe(publisher.sink.accept);
    // What the source reports besides frames (skipped or damaged input, restarts), as it happens.
    graph.events.subscribe((event) => {
      if (event.type === 'source') log(`source ${event.kind}: ${event.detail}`);
    });
    opts.onStart?.(graph, source.expectedItems);
    table.attach(graph.events);
    removeSignals = stopOnSignals(graph);
    timer = opts.duration ? setTimeout(() => void graph.stop('duration'), opts.duration * 1000) : undefined;
    running = true;
    const summary = await graph.run();
    await control?.close();
    table.detach();
    if (recorder) await recorder.close().catch((err: Error) => recorderErrors.push(err.message));
    const published = await publisher?.close(summary);
    if (published) log(`published ${describePublished(published)}`);
    const notRecorded = recorder?.counts.framesNotRecorded ?? 0;
    if (notRecorded > 0) log(`recorder: ${notRecorded} frames were not recorded (the disk did not keep up)`);
    const failure = runFailure(summary) ?? (recorderErrors.length > 0 ? `the recording failed: ${recorderErrors[0]}` : undefined);
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
  }
}

/** Runs the pipeline; resolves with the process exit code (1 when the run failed, saying why). */
export async function runPipeline(opts: RunOptions): Promise<number> {
  const config = runConfig(opts);
  if (config.cameras) return (await import('./cameras.ts')).runCameras(config, opts);
  const { summary, failure } = await executeRun(config, { duration: opts.duration });
  process.stdout.write(`${formatSummary(summary)}\n`);
  if (opts.jsonSummary) writeJsonSummary(opts.jsonSummary, summary);
  if (failure) log(failure);
  return failure ? 1 : 0;
}

async function openRecorder(config: PerceptConfig, actionSchema: ActionSchema): Promise<Recorder> {
  const { path, chunkMs } = config.recorder;
  try {
    mkdirSync(dirname(path), { recursive: true });
  } catch (err) {
    throw new Error(`recorder: cannot create the folder of ${path}: ${(err as Error).message}`, { cause: err });
  }
  const { createRecorder } = await import('../nodes/recorder.ts');
  // On a virtual clock, chunks close on log time only: the file must not depend on how fast the run went.
  return createRecorder({ path, actionSchema, chunkMs, flushAfterMs: config.clock === 'virtual' ? null : chunkMs });
}

/** Records the run: each input frame, each action (with its frame's stamp), every event and stats. */
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

/** The recording's `percept.run` metadata: what made the run, its id (the one its published stream
 * carries) and, on a real clock only, when it started (the file must be the same on every replay). */
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
