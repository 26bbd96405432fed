// `percept run` with `cameras`: one graph per camera, with its own source, edges, budgets, ladder and deadlines.
// Their encode and decode stages are handles onto one shared encoder and decoder, which batch across cameras.
// The graphs run as one GraphGroup, with one event stream, one summary and one publisher.
// Each action carries its camera id as source_id.
import { DegradeLadder } from '../../pipeline/budget.ts';
import { RealClock, type Clock } from '../../pipeline/clock.ts';
import { cameraGraphConfig, type CameraConfig, type PerceptConfig } from '../../pipeline/config.ts';
import { append, chain, type StageChain } from '../../pipeline/graph/chain.ts';
import { STOP_SIGNALS, createGraph, type Graph } from '../../pipeline/graph/graph.ts';
import { GraphGroup } from '../../pipeline/graph/group.ts';
import type { RunSummary } from '../../pipeline/telemetry/events.ts';
import { LiveTable, formatSummary, writeJsonSummary } from '../../pipeline/telemetry/report.ts';
import type { FrameSource, Knobs, Stage } from '../../pipeline/types.ts';
import type { Publisher } from '../../nodes/publisher.ts';
import type { BatchingEncoderStats } from '../../nodes/encoder-batch.ts';
import { loadActionSchema, type ActionSchema } from '../../nodes/action-schema.ts';
import type { ActionMessage, CameraFrame } from '../../nodes/payloads.ts';
import { resolveModel } from '../../models/resolve.ts';
import type { ModelInfo, TimeAccount } from '../../native/llama.ts';
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

/** A remote decoder's server encodes the images: percept's encoder makes no calls. */
const NO_ENCODER: BatchingEncoderStats = { calls: 0, frames: 0, maxBatch: 0, discarded: 0, busyMs: 0 };

export interface CameraStages {
  /** Per camera, in config order: camera frame → published or validated action. */
  readonly chains: readonly StageChain<CameraFrame, ActionMessage>[];
  readonly publisher?: Publisher;
  /** The shared encoder's batching so far. */
  encoderStats(): BatchingEncoderStats;
  /** Where the shared decoder's scheduler spent its time so far (null: a remote decoder). */
  decoderTime(): TimeAccount | null;
  /** The shared decoder's model (null: a remote decoder). */
  readonly decoderModel: ModelInfo | null;
}

/** A source whose frames carry the camera id as their source id (the actions' source_id). */
export function asCamera<T>(source: FrameSource<T>, id: string): FrameSource<T> {
  return {
    id,
    ...(source.expectedItems !== undefined ? { expectedItems: source.expectedItems } : {}),
    async *frames(clock, signal, report) {
      for await (const item of source.frames(clock, signal, report)) yield { ...item, sourceId: id };
    },
    ...(source.close ? { close: () => source.close!() } : {}),
  };
}

/** The stages of every camera, in createStages' order (run.ts). They are the publisher, the shared decoder
 * with one sequence per camera, the shared encoder, then each camera's preprocess and actions.
 * The warm-up goes through the first camera. `publish: false` leaves the publisher out. */
export async function createCameraStages(
  config: PerceptConfig,
  actionSchema: ActionSchema,
  { publish = true, warmup = true } = {},
): Promise<CameraStages> {
  const cameras = config.cameras;
  if (!cameras) throw new TypeError('createCameraStages: the config has no cameras');
  const n = cameras.length;
  const built: Stage<never, unknown>[] = [];
  let publisher: Publisher | undefined;
  try {
    if (publish) publisher = await openPublisher(config);
    if (config.decoder.kind === 'openai') {
      // The server batches the cameras' requests. Each camera's graph keeps its own edge, deadline and
      // up to decoder.concurrency requests in flight on the one remote stage.
      const { createActionsStage } = await import('../../nodes/actions.ts');
      const decoder = await createRemoteDecoder(config, actionSchema, warmup ? cameras[0]! : null);
      const chains = cameras.map(() => {
        const validated = chain(decoder, createActionsStage({ schema: actionSchema }));
        return publisher ? append(validated, publisher.stage) : validated;
      });
      return { chains, ...(publisher ? { publisher } : {}), encoderStats: () => NO_ENCODER, decoderTime: () => null, decoderModel: null };
    }
    const { createCameraDecoderStages } = await import('../../nodes/decoder.ts');
    const lanes = config.batching.lanes > 1 ? `, over ${config.batching.lanes} lanes` : '';
    log(`decoder: ${config.decoder.model} (${n} cameras, one sequence each, batched${lanes})`);
    const decoders = await createCameraDecoderStages(
      { ...config.decoder, model: await resolveModel(config.decoder.model, 'decoder'), actionSchema },
      {
        cameras: n,
        maxActive: config.batching.decodeMaxActive,
        admit: config.batching.admit,
        groupWaitMs: config.batching.groupWaitMs,
        rollingJoin: config.batching.rollingJoin,
        joinRunning: config.batching.joinRunning,
        prefillChunk: config.batching.prefillChunk,
        lanes: config.batching.lanes,
        stepRows: config.batching.stepRows,
        mixSteps: config.batching.mixSteps,
        kvUnified: config.batching.kvUnified,
        imageTokens: Math.max(...cameras.map((camera) => Math.max(...ladderLevels(camera).map((k) => k.imageTokens)))),
      },
    );
    built.push(...decoders);
    const decoder = decoders[0]!;
    const encoded = await createEncoder(config, decoder.nEmbd, decoder.contract);
    const { contract, stage: encoder, source: encoderSource } = encoded;
    checkEncoderFitsDecoder(
      { contract, source: encoderSource },
      { contract: decoder.contract, source: config.decoder.model, arch: decoder.modelInfo.arch },
    );
    const { createCameraEncoderStages } = await import('../../nodes/encoder-batch.ts');
    const encoders = createCameraEncoderStages(encoder, { cameras: n, waitMs: config.batching.encodeWaitMs });
    built.push(...encoders);
    const { createActionsStage } = await import('../../nodes/actions.ts');
    const preprocess = await Promise.all(cameras.map(() => createPreprocessFor(config, encoded)));
    const actions = cameras.map(() => createActionsStage({ schema: actionSchema }));
    if (warmup) {
      const { warmUpStages, WARMUP_FRAMES } = await import('./warmup.ts');
      const levels = ladderLevels(cameras[0]!);
      const frames = await warmupFrames(cameras[0]!.source, WARMUP_FRAMES);
      logWarmup(await warmUpStages({ preprocess: preprocess[0]!, encode: encoders[0]!, decode: decoders[0]! }, frames, levels), contract);
    }
    const chains = cameras.map((_, i) => {
      const validated = chain(encoders[i]!.announcing(preprocess[i]!), encoders[i]!, decoders[i]!, actions[i]!);
      return publisher ? append(validated, publisher.stage) : validated;
    });
    return {
      chains,
      ...(publisher ? { publisher } : {}),
      encoderStats: () => encoders[0]!.stats(),
      decoderTime: () => decoder.schedulerTime(),
      decoderModel: decoder.modelInfo,
    };
  } catch (err) {
    for (const stage of built) await stage.close?.().catch(() => undefined);
    await publisher?.close();
    throw err;
  }
}

/** The knobs of every ladder level a camera can run at (only the initial one with the ladder off). */
function ladderLevels(camera: CameraConfig): Knobs[] {
  const ladder = new DegradeLadder(camera.ladder, camera.budgets.endToEndMs);
  return camera.ladder.enabled ? Array.from({ length: ladder.levels }, (_, i) => ladder.knobsAt(i)) : [ladder.knobsAt(0)];
}

/** One graph per camera (frame ids i, i + n, … for camera i of n, so they stay apart on the wire),
 * run as one group. `onGraph` sees each graph before it runs (to tap its inputs). */
export function createCameraGroup(
  config: PerceptConfig,
  sources: readonly FrameSource<CameraFrame>[],
  stages: CameraStages,
  clock: Clock,
  onGraph?: (graph: Graph) => void,
): GraphGroup {
  const cameras = config.cameras!;
  const members = cameras.map((camera, i) => ({
    id: camera.id,
    graph: createGraph({
      source: sources[i]!,
      stages: stages.chains[i]!,
      clock,
      config: cameraGraphConfig(config, camera),
      frameIds: { first: i, stride: cameras.length },
    }),
  }));
  for (const { graph } of members) onGraph?.(graph);
  return new GraphGroup(members, clock, config.telemetry.intervalMs);
}

/** Why a run of several cameras failed, or undefined: the run as a whole, then each camera. */
export function camerasFailure(summary: RunSummary): string | undefined {
  const whole = runFailure(summary);
  if (whole) return whole;
  const failed = Object.entries(summary.cameras ?? {}).flatMap(([id, s]) => {
    const why = runFailure(s);
    return why ? [`camera ${id}: ${why}`] : [];
  });
  return failed.length ? failed.join('; ') : undefined;
}

/** `percept run` on a config with cameras; resolves with the exit code. */
export async function runCameras(
  config: PerceptConfig,
  opts: { readonly duration?: number; readonly jsonSummary?: string; readonly metrics?: string; readonly foxglove?: string | boolean },
): Promise<number> {
  const cameras = config.cameras!;
  const clock = new RealClock();
  const actionSchema = loadActionSchema(config.actions.schema);
  const sources: FrameSource<CameraFrame>[] = [];
  const closeSources = async () => {
    for (const s of sources) await s.close?.().catch(() => undefined);
  };
  let stages: CameraStages;
  try {
    for (const camera of cameras)
      sources.push(asCamera(await createSource(camera.source, config.preprocess.maxPixels, config.ros2), camera.id));
    stages = await createCameraStages(config, actionSchema);
  } catch (err) {
    await closeSources();
    throw err;
  }
  // The ROS 2 publisher's detections need each frame's pixel size.
  const tapRos2 = config.ros2.publish ? (await import('./ros2.ts')).tapFrameSizes : undefined;
  const group = createCameraGroup(config, sources, stages, clock, (graph) => tapRos2?.(stages.publisher, graph.inputs));
  const { publisher } = stages;
  if (publisher) group.events.subscribe(publisher.sink.accept);
  const metrics = opts.metrics ? await openMetrics(opts.metrics, group.events, publisher) : undefined;
  // The group's graphs are its own: the live view shows its events and stats, not the frames.
  const foxglove = opts.foxglove
    ? await openFoxglove(opts.foxglove, { graphs: [], events: group.events, clock }).catch(async (err: unknown) => {
        await metrics?.close();
        throw err;
      })
    : undefined;
  const table = new LiveTable({ mode: config.telemetry.liveTable, intervalMs: config.telemetry.intervalMs });
  table.attach(group.events);
  const onSignal = (signal: NodeJS.Signals): void => void group.stop(signal);
  for (const signal of STOP_SIGNALS) process.on(signal, onSignal);
  const timer = opts.duration ? setTimeout(() => void group.stop('duration'), opts.duration * 1000) : undefined;
  try {
    const summary = await group.run();
    table.detach();
    const published = await publisher?.close(summary);
    process.stdout.write(`${formatSummary(summary)}\n`);
    const enc = stages.encoderStats();
    if (config.decoder.kind === 'local') log(`encoder: ${enc.frames} frames in ${enc.calls} calls (at most ${enc.maxBatch} in one)`);
    if (published) log(`published ${describePublished(published)}`);
    if (opts.jsonSummary) writeJsonSummary(opts.jsonSummary, summary);
    const failure = camerasFailure(summary);
    if (failure) log(failure);
    return failure ? 1 : 0;
  } finally {
    if (timer) clearTimeout(timer);
    for (const signal of STOP_SIGNALS) process.off(signal, onSignal);
    await publisher?.close();
    await metrics?.close();
    await foxglove?.close();
  }
}
