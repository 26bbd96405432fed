// What single-camera and multi-camera runs build alike: sources, encoders, the remote decoder,
// the publisher, warm-up frames and the words for a run's outcome.
import { basename } from 'node:path';
import { DegradeLadder } from '../../pipeline/budget.ts';
import type { Clock } from '../../pipeline/clock.ts';
import { maxMessageBytesFor, parseMetricsEndpoint, type PerceptConfig, type SourceConfig } from '../../pipeline/config.ts';
import type { RunSummary } from '../../pipeline/telemetry/events.ts';
import type { FrameSource, Stage } from '../../pipeline/types.ts';
import type { OpenAIDecoderStage } from '../../nodes/decoder-openai.ts';
import type { PreprocessStage } from '../../nodes/preprocess.ts';
import type { Publisher } from '../../nodes/publisher.ts';
import type { ActionSchema } from '../../nodes/action-schema.ts';
import type { CameraFrame, EncoderContract, ImageEmbedding, PixelAllocator, PixelTensor } from '../../nodes/payloads.ts';
import { resolveModel } from '../../models/resolve.ts';
import type { Observable } from 'rxjs';
import type { TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import type { MetricsServer } from './metrics.ts';
import type { FoxgloveGraphTaps, FoxgloveLiveServer } from './foxglove.ts';

export const log = (msg: string) => process.stderr.write(`percept: ${msg}\n`);

/** Binds the publisher before any model loads, so a busy endpoint fails at once and subscribers can join. */
export async function openPublisher(config: PerceptConfig, options: { clock?: Clock; runId?: string } = {}): Promise<Publisher> {
  const { createPublisher } = await import('../../nodes/publisher.ts');
  const publisher = await createPublisher({ ...config.publisher, ...options, models: modelIds(config) });
  log(`publishing on ${publisher.endpoint}: topics '${config.publisher.topic}', 'events', 'telemetry' (run ${publisher.runId})`);
  if (!config.ros2.publish) return publisher;
  const { withRos2Publisher } = await import('./ros2.ts');
  const both = await withRos2Publisher(publisher, config, modelIds(config), options.clock);
  const { topics, domainId } = config.ros2;
  log(`ROS 2: publishing ${topics.actions}, ${topics.detections}, ${topics.diagnostics} on DDS domain ${domainId}`);
  return both;
}

/** Logs each warm-up step's stage times. */
export function logWarmup(
  steps: readonly { readonly imageTokens: number; readonly ms: Readonly<Record<string, number>> }[],
  contract: EncoderContract,
): void {
  for (const step of steps) {
    const times = Object.entries(step.ms)
      .map(([name, ms]) => `${name} ${ms.toFixed(0)} ms`)
      .join(', ');
    log(`warm-up (${contract === 'gemma4' ? step.imageTokens : 256} image tokens): ${times}`);
  }
}

/** The source of a config. `maxPixels` (preprocess.maxPixels) bounds a zmq source's message bytes by default. */
export async function createSource(
  config: SourceConfig,
  maxPixels: number,
  ros2?: PerceptConfig['ros2'],
): Promise<FrameSource<CameraFrame>> {
  switch (config.kind) {
    case 'pattern': {
      const { createPatternSource } = await import('../../nodes/source-pattern.ts');
      return createPatternSource({
        fps: config.fps,
        frames: config.frames === 0 ? Infinity : config.frames,
        width: config.width,
        height: config.height,
      });
    }
    case 'bag': {
      const { createBagSource } = await import('../../nodes/source-bag.ts');
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
      const { createFolderSource } = await import('../../nodes/source-folder.ts');
      return createFolderSource({ path: config.path, fps: config.fps, onIssue: (issue) => log(`folder: ${issue.file}: ${issue.reason}`) });
    }
    case 'ffmpeg': {
      const { createFfmpegSource } = await import('../../nodes/source-ffmpeg.ts');
      const { kind: _kind, ...options } = config;
      return createFfmpegSource(options);
    }
    case 'zmq': {
      const { createZmqSource } = await import('../../nodes/source-zmq.ts');
      const { kind: _kind, ...options } = config;
      const source = await createZmqSource({ ...options, maxMessageBytes: maxMessageBytesFor(config, maxPixels) });
      log(`frames from ${source.endpoint} (${config.socket}${config.bind ? ', bound' : ''})`);
      return source;
    }
    case 'ros2':
      return (await import('./ros2.ts')).openRos2Source(config, ros2);
  }
}

/** Refuses a vision encoder made for another decoder architecture, even when the widths agree.
 * A Gemma 3 SigLIP encoder would feed a Gemma 4 decoder the embeddings of the wrong model. */
export function checkEncoderFitsDecoder(
  encoder: { readonly contract: EncoderContract; readonly source: string },
  decoder: { readonly contract: EncoderContract; readonly source: string; readonly arch: string },
): void {
  if (encoder.contract === decoder.contract) return;
  throw new Error(
    `encoder ${encoder.source} has the ${encoder.contract} vision contract, but decoder ${decoder.source} is a ${decoder.arch} model that needs a ${decoder.contract} vision encoder`,
  );
}

/** Pattern frames of the warm-up count down from here, so none is one a pattern source starts with.
 * The decoder keeps the last prompt's KV cache. After a warm-up on the run's own first image, the first
 * frame would reuse the whole prompt, as no camera frame does. */
const WARMUP_PATTERN_INDEX = 0xffff;

/** `count` distinct frames for the warm-up (app/run/warmup.ts's WARMUP_FRAMES). They are pattern images
 * at the pattern source's own size, else 720p. */
export async function warmupFrames(source: SourceConfig, count: number): Promise<CameraFrame[]> {
  const { encodePatternFrame } = await import('../../nodes/source-pattern.ts');
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

/** Role → model id for the action headers, from the config's spec (synth:…) or the file's name. */
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

/** The remote decode stage of decoder.kind "openai". Its load-time probe has run the server's vision
 * and decoder once. `warmup` sends one frame of the source's size at the ladder's first level, so no
 * real frame pays for the server's first image graph. */
export async function createRemoteDecoder(
  config: PerceptConfig,
  actionSchema: ActionSchema,
  warmup: { readonly source: SourceConfig; readonly ladder: PerceptConfig['ladder'] } | null,
): Promise<OpenAIDecoderStage> {
  const { apiKeyFromEnv, createOpenAIDecoderStage } = await import('../../nodes/decoder-openai.ts');
  const { endpoint, apiKey, ...decoderConfig } = config.decoder;
  const key = apiKeyFromEnv(apiKey);
  const decoder = await createOpenAIDecoderStage({ ...decoderConfig, endpoint: endpoint!, ...(key ? { apiKey: key } : {}), actionSchema });
  const { server } = decoder;
  log(
    `decoder: ${server.name} at ${server.baseUrl}, model ${server.model}, ${config.decoder.concurrency} in flight, ` +
      `constrained by ${server.constraint === 'json_schema' ? 'response_format json_schema' : `percept's grammar (${server.constraint})`} (probe ${server.probeMs.toFixed(0)} ms)`,
  );
  if (server.grammarRefused)
    log(`decoder: ${server.name} refused percept's grammar, so numbers are bounded only by the actions stage: ${server.grammarRefused}`);
  if (warmup) {
    const { standaloneContext } = await import('../../pipeline/standalone.ts');
    const knobs = new DegradeLadder(warmup.ladder, config.budgets.endToEndMs).knobsAt(0);
    const t0 = performance.now();
    const [frame] = await warmupFrames(warmup.source, 1);
    await decoder.process(frame!, standaloneContext({ frame: { sourceId: 'warmup' }, knobs }));
    log(`warm-up (remote): decode ${(performance.now() - t0).toFixed(0)} ms`);
  }
  return decoder;
}

export type CreatedEncoder = Awaited<ReturnType<typeof createEncoder>>;

/** The preprocess stage for an encoder, from its contract and the config's limits. It writes into the
 * encoder's own pixel memory where it has one (pinned host memory on CUDA). JPEG frames are left to
 * the encoder's GPU where it decodes them and the config allows. */
export async function createPreprocessFor(config: PerceptConfig, encoder: CreatedEncoder): Promise<PreprocessStage> {
  const { createPreprocessStage } = await import('../../nodes/preprocess.ts');
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
      const { createOnnxEncoderStage } = await import('../../nodes/encoder-onnx.ts');
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
      const { createProjectionEncoderStage } = await import('../../nodes/encoder-projection.ts');
      return {
        contract: decoderContract,
        stage: createProjectionEncoderStage({ nEmbd, seed: config.encoder.seed, tokens: config.encoder.tokens }),
        source: 'projection',
      };
    }
    case 'mtmd': {
      const { createMtmdEncoderStage } = await import('../../nodes/encoder-mtmd.ts');
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

/** Serves Prometheus metrics, /healthz and /readyz for a run on "[HOST:]PORT" (metrics.endpoint, or `--metrics`);
 * the host defaults to loopback. */
export async function openMetrics(spec: string, events: Observable<TelemetryEvent>, publisher?: Publisher): Promise<MetricsServer> {
  const endpoint = parseMetricsEndpoint(spec);
  if (!endpoint) throw new Error(`metrics endpoint ${spec}: expected PORT or HOST:PORT, e.g. 9464 or 127.0.0.1:9464`);
  const { startMetricsServer } = await import('./metrics.ts');
  const queuedMessages = publisher && (() => Object.fromEntries(Object.entries(publisher.stats()).map(([topic, c]) => [topic, c.queued])));
  const server = await startMetricsServer({ ...endpoint, events, ...(queuedMessages ? { queuedMessages } : {}) });
  log(`metrics on ${server.url}/metrics, health on ${server.url}/healthz and ${server.url}/readyz`);
  return server;
}

/** Serves the live view over the Foxglove WebSocket protocol for a run (`--foxglove [URL]`; default
 * ws://127.0.0.1:8765, loopback). Start it before the run; closing it logs what it sent and dropped. */
export async function openFoxglove(
  spec: string | true,
  run: { readonly graphs: readonly FoxgloveGraphTaps[]; readonly events: Observable<TelemetryEvent>; readonly clock: Clock },
): Promise<FoxgloveLiveServer> {
  const { DEFAULT_FOXGLOVE_URL, startFoxgloveServer } = await import('./foxglove.ts');
  const server = await startFoxgloveServer({ url: spec === true ? DEFAULT_FOXGLOVE_URL : spec, ...run });
  log(`live view on ${server.url} (Foxglove: Open connection → Foxglove WebSocket)`);
  let closed = false;
  return {
    ...server,
    stats: () => server.stats(),
    async close() {
      await server.close();
      if (closed) return;
      closed = true;
      const { sent, dropped, skipped } = server.stats();
      const skips = Object.entries(skipped).map(([reason, n]) => `${reason} ${n}`);
      log(
        `live view: sent ${sent} messages` +
          (dropped ? `, dropped ${dropped} (a client read too slowly)` : '') +
          (skips.length ? `, frames not shown: ${skips.join(', ')}` : ''),
      );
    },
  };
}
