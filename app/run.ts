// `percept run`: config → stages → graph → summary. This file is the only place that knows every
// stage; the stages themselves only know their input and output types.
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import { RealClock, VirtualClock, type Clock } from '../pipeline/clock.ts';
import { loadConfig, type PerceptConfig, type SourceConfig } from '../pipeline/config.ts';
import { createGraph, stopOnSignals } from '../pipeline/graph.ts';
import { LiveTable, formatSummary, writeJsonSummary, type TelemetryEvent } from '../pipeline/telemetry.ts';
import type { ActionMessage, CameraFrame, EncoderContract } from '../nodes/payloads.ts';
import type { FrameSource, Stage } from '../pipeline/types.ts';
import type { PublisherStage } from '../nodes/publisher.ts';

export interface RunOptions {
  readonly config: string;
  readonly source?: string;
  readonly duration?: number;
  readonly jsonSummary?: string;
  readonly clock?: string;
}

const log = (msg: string) => process.stderr.write(`percept: ${msg}\n`);

/** `pattern[:FPS[:FRAMES]]`, `bag:PATH`, `folder:PATH[:FPS]` → a source config. */
export function parseSourceSpec(spec: string, current: SourceConfig): SourceConfig {
  const [kind, ...rest] = spec.split(':');
  const num = (text: string | undefined, name: string, fallback: number): number => {
    if (text === undefined || text === '') return fallback;
    const n = Number(text);
    if (!Number.isFinite(n) || n < 0) throw new Error(`--source ${spec}: ${name} must be a number >= 0, got '${text}'`);
    return n;
  };
  switch (kind) {
    case 'pattern': {
      const base = current.kind === 'pattern' ? current : { kind: 'pattern' as const, fps: 10, frames: 20, width: 1280, height: 720 };
      return { ...base, fps: num(rest[0], 'FPS', base.fps), frames: num(rest[1], 'FRAMES', base.frames) };
    }
    case 'bag': {
      const path = rest.join(':');
      if (!path) throw new Error(`--source ${spec}: expected bag:PATH`);
      const base = current.kind === 'bag' ? current : { kind: 'bag' as const, topic: '/camera/front/compressed', rate: 1, loop: false, path };
      return { ...base, path };
    }
    case 'folder': {
      if (!rest[0]) throw new Error(`--source ${spec}: expected folder:PATH[:FPS]`);
      return { kind: 'folder', path: rest[0], fps: num(rest[1], 'FPS', 5) };
    }
    default:
      throw new Error(`--source '${spec}': unknown kind '${kind}' (expected pattern, bag or folder)`);
  }
}

export async function createSource(config: SourceConfig): Promise<FrameSource<CameraFrame>> {
  switch (config.kind) {
    case 'pattern': {
      const { createPatternSource } = await import('../nodes/source-pattern.ts');
      return createPatternSource({ fps: config.fps, frames: config.frames === 0 ? Infinity : config.frames, width: config.width, height: config.height });
    }
    case 'bag': {
      const { createBagSource } = await import('../nodes/source-bag.ts');
      return createBagSource({ path: config.path, topic: config.topic, rate: config.rate, loop: config.loop, onIssue: (issue) => log(`bag: ${issue.reason} (topic ${issue.topic}, sequence ${issue.sequence})`) });
    }
    case 'folder': {
      const { createFolderSource } = await import('../nodes/source-folder.ts');
      return createFolderSource({ path: config.path, fps: config.fps, onIssue: (issue) => log(`folder: ${issue.file}: ${issue.reason}`) });
    }
  }
}

/** Refuses a vision encoder made for another decoder architecture (a Gemma 3 SigLIP encoder in front
 * of a Gemma 4 decoder would feed it embeddings of the wrong model, even when the widths agree). */
export function checkEncoderFitsDecoder(encoder: { readonly contract: EncoderContract; readonly source: string }, decoder: { readonly contract: EncoderContract; readonly source: string; readonly arch: string }): void {
  if (encoder.contract === decoder.contract) return;
  throw new Error(
    `encoder ${encoder.source} has the ${encoder.contract} vision contract, but decoder ${decoder.source} is a ${decoder.arch} model that needs a ${decoder.contract} vision encoder`,
  );
}

/** The frame the warm-up pushes through the stages: the pattern source's own size, else 720p. */
async function warmupFrame(source: SourceConfig): Promise<CameraFrame> {
  const { encodePatternFrame } = await import('../nodes/source-pattern.ts');
  const [width, height] = source.kind === 'pattern' ? [source.width, source.height] : [1280, 720];
  return { encoding: 'jpeg', data: await encodePatternFrame(0, width, height), width, height };
}

/** Builds the stages in dependency order: the decoder first (its n_embd fixes the encoder's
 * output width), then the encoder (its contract fixes preprocessing), then warms them up (see
 * app/warmup.ts; `warmup: false` skips it). `publish: false` leaves the publisher out (benchmarks
 * that end at the validated action). */
export async function createStages(config: PerceptConfig, { publish = true, warmup = true } = {}): Promise<Stage<never, unknown>[]> {
  const stages: Stage<never, unknown>[] = [];
  /** Stages made but not yet in `stages`, closed too if a later step fails. */
  const pending: Stage<never, unknown>[] = [];
  const closeAll = async () => {
    for (const s of [...stages, ...pending]) await s.close?.().catch(() => undefined);
  };
  try {
    const { resolveModelSpec } = await import('../models/synth.ts');
    const { createDecoderStage } = await import('../nodes/decoder.ts');
    const resolveDraft = async (spec: string | null) => (spec ? resolveModelSpec(spec) : null);
    log(`decoder: ${config.decoder.model}`);
    const decoder = await createDecoderStage({
      ...config.decoder,
      model: await resolveModelSpec(config.decoder.model),
      draft: await resolveDraft(config.decoder.draft),
      draftMtp: await resolveDraft(config.decoder.draftMtp),
      schemaPath: config.actions.schema,
    });
    pending.push(decoder as Stage<never, unknown>);
    const nEmbd = decoder.nEmbd;

    let contract: EncoderContract;
    let encoder: Stage<never, unknown>;
    let encoderSource: string;
    switch (config.encoder.kind) {
      case 'onnx': {
        const { resolveVisionSpec } = await import('../models/vision-synth.ts');
        const { createOnnxEncoderStage } = await import('../nodes/encoder-onnx.ts');
        log(`encoder: ${config.encoder.model}`);
        const onnx = await createOnnxEncoderStage({ model: resolveVisionSpec(config.encoder.model), ep: config.encoder.executionProvider, threads: config.encoder.threads, expectedHidden: nEmbd });
        contract = onnx.contract.kind;
        encoder = onnx as Stage<never, unknown>;
        encoderSource = config.encoder.model;
        break;
      }
      case 'projection': {
        const { createProjectionEncoderStage } = await import('../nodes/encoder-projection.ts');
        contract = decoder.contract;
        encoder = createProjectionEncoderStage({ nEmbd, seed: config.encoder.seed, tokens: config.encoder.tokens }) as Stage<never, unknown>;
        encoderSource = 'projection';
        break;
      }
      case 'mtmd': {
        const { resolveMmprojSpec } = await import('../models/mmproj-synth.ts');
        const { createMtmdEncoderStage } = await import('../nodes/encoder-mtmd.ts');
        log(`encoder (llama.cpp clip): ${config.encoder.mmproj}`);
        const mtmd = await createMtmdEncoderStage({ mmproj: await resolveMmprojSpec(config.encoder.mmproj), gpuLayers: config.encoder.gpuLayers, expectedHidden: nEmbd });
        contract = mtmd.contract.kind;
        encoder = mtmd as Stage<never, unknown>;
        encoderSource = config.encoder.mmproj;
        break;
      }
    }
    pending.push(encoder);
    checkEncoderFitsDecoder({ contract, source: encoderSource }, { contract: decoder.contract, source: config.decoder.model, arch: decoder.modelInfo.arch });
    const { createPreprocessStage } = await import('../nodes/preprocess.ts');
    const { createActionsStage } = await import('../nodes/actions.ts');
    stages.push(createPreprocessStage({ contract, maxPixels: config.preprocess.maxPixels, threads: config.preprocess.threads }) as Stage<never, unknown>);
    stages.push(encoder);
    stages.push(decoder as Stage<never, unknown>);
    pending.length = 0;
    stages.push(createActionsStage({ schema: config.actions.schema }) as Stage<never, unknown>);
    if (warmup) {
      const { warmUpStages } = await import('./warmup.ts');
      const { DegradeLadder } = await import('../pipeline/budget.ts');
      const ladder = new DegradeLadder(config.ladder, config.budgets.endToEndMs);
      const levels = config.ladder.enabled ? Array.from({ length: ladder.levels }, (_, i) => ladder.knobsAt(i)) : [ladder.knobsAt(0)];
      for (const step of await warmUpStages(stages, await warmupFrame(config.source), levels)) {
        const times = Object.entries(step.ms).map(([name, ms]) => `${name} ${ms.toFixed(0)} ms`).join(', ');
        log(`warm-up (${contract === 'gemma4' ? step.imageTokens : 256} image tokens): ${times}`);
      }
    }
    if (!publish) return stages;
    const { createPublisherStage } = await import('../nodes/publisher.ts');
    const publisher = await createPublisherStage({ endpoint: config.publisher.endpoint, topic: config.publisher.topic, sendHighWaterMark: config.publisher.sendHighWaterMark });
    log(`publishing actions on ${publisher.endpoint} (topic '${publisher.topic}')`);
    stages.push(publisher as Stage<never, unknown>);
    return stages;
  } catch (err) {
    await closeAll();
    throw err;
  }
}

export async function runPipeline(opts: RunOptions): Promise<number> {
  const base = loadConfig(opts.config);
  const overrides: Record<string, unknown> = {};
  if (opts.source) overrides.source = parseSourceSpec(opts.source, base.source);
  if (opts.clock) {
    if (opts.clock !== 'real' && opts.clock !== 'virtual') throw new Error(`--clock must be 'real' or 'virtual', got '${opts.clock}'`);
    overrides.clock = opts.clock;
  }
  // Re-validate with the overrides applied, so they obey the same schema as the file.
  const config = Object.keys(overrides).length ? loadConfig({ ...base, ...overrides }) : base;
  const clock: Clock = config.clock === 'virtual' ? new VirtualClock() : new RealClock();

  const source = await createSource(config.source);
  let stages: Stage<never, unknown>[];
  try {
    stages = await createStages(config);
  } catch (err) {
    await source.close?.();
    throw err;
  }
  const graph = createGraph({ source, stages, clock, config });

  let recorder: Awaited<ReturnType<typeof import('../nodes/recorder.ts')['createRecorder']>> | undefined;
  if (config.recorder.enabled) {
    const { createRecorder } = await import('../nodes/recorder.ts');
    mkdirSync(dirname(config.recorder.path), { recursive: true });
    recorder = await createRecorder({ path: config.recorder.path, actionSchema: config.actions.schema });
    const rec = recorder;
    graph.events.subscribe((event: TelemetryEvent) => {
      if (event.type !== 'stats') void rec.recordEvent(event, event.atNs).catch((err: Error) => log(`recorder: ${err.message}`));
    });
    graph.outputs.subscribe((env) => {
      const exit = env.spans.at(-1)?.exitNs ?? clock.nowNs();
      void rec.recordAction(env.payload as ActionMessage, exit).catch((err: Error) => log(`recorder: ${err.message}`));
    });
  }

  // Drops, cancels, degrade steps and errors go out on the publisher's 'events' topic and the
  // periodic stats on 'telemetry', so a robot stack sees every decision the graph makes.
  // Those that come after the publisher has closed (the last ones of a run) are counted and
  // reported; they are in the summary and the recording all the same.
  const publisher = stages.find((s) => s.name === 'publish') as Partial<PublisherStage> | undefined;
  let eventsNotPublished = 0;
  if (publisher?.publishEvent && publisher.publishTelemetry) {
    const { publishEvent, publishTelemetry } = publisher as PublisherStage;
    graph.events.subscribe((event: TelemetryEvent) => {
      const send = event.type === 'stats' ? publishTelemetry : ['drop', 'cancel', 'degrade', 'error'].includes(event.type) ? publishEvent : undefined;
      send?.(event).catch(() => void eventsNotPublished++);
    });
  }

  const table = new LiveTable({ mode: config.telemetry.liveTable, intervalMs: config.telemetry.intervalMs });
  table.attach(graph.events);
  const removeSignals = stopOnSignals(graph);
  const timer = opts.duration ? setTimeout(() => void graph.stop('duration'), opts.duration * 1000) : undefined;
  try {
    const summary = await graph.run();
    table.detach();
    if (recorder) await recorder.close();
    process.stdout.write(`${formatSummary(summary)}\n`);
    if (eventsNotPublished > 0) log(`${eventsNotPublished} telemetry/event message(s) came after the publisher closed and were not published`);
    if (opts.jsonSummary) {
      mkdirSync(dirname(opts.jsonSummary), { recursive: true });
      writeJsonSummary(opts.jsonSummary, summary);
    }
    return 0;
  } finally {
    if (timer) clearTimeout(timer);
    removeSignals();
  }
}
