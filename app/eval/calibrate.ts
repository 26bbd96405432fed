// `percept calibrate`: each stage's service time at each ladder level, measured on this machine with
// the config's own stages and frames. A config names the file in `virtualServiceMs`, so lockstep
// replays and tuning charge what this hardware costs.
//
// Calibration file, JSON of kind "percept.calibration", version 2:
//   virtualServiceMs   stage → per level, {count, quantilesMs}: the distribution the virtual clock samples
//   medianMs, p90Ms    stage → [ms at level 0, level 1, …], for people and for comparing files
// Version 1 held medians in virtualServiceMs; configs and tune read them as fixed costs.
//   levels             the knobs of each level, from the config's ladder
//   frames, machine, config, models, decoder   what was measured, where and with what
// Method: frames come from the config's source without pacing, and each level gets one untimed warm-up frame.
// Then each frame goes through the chain stage by stage on a real clock, each process() call timed on its own.
// A level that differs from the previous one only in frameSkip reuses its numbers, since skipping does not
// change what a frame costs.
import { cpus } from 'node:os';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { DegradeLadder } from '../../pipeline/budget.ts';
import { RealClock, VirtualClock } from '../../pipeline/clock.ts';
import { CALIBRATION_VERSION, type PerceptConfig } from '../../pipeline/config.ts';
import { serviceDistribution, type ServiceCost } from '../../pipeline/service-time.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { DropFrame, isRejection, type Knobs, type Stage } from '../../pipeline/types.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { median, quantile } from '../stats.ts';
import { createStages, runConfig } from '../run/run.ts';
import { createSource } from '../run/stages.ts';

export interface CalibrationFile {
  readonly kind: 'percept.calibration';
  /** 2; a version 1 file has medians in virtualServiceMs and no medianMs. */
  readonly version: 1 | 2;
  /** stage → per level: a distribution, or 0 where the stage had no call (version 1: the median). */
  readonly virtualServiceMs: Readonly<Record<string, readonly ServiceCost[]>>;
  readonly medianMs?: Readonly<Record<string, readonly number[]>>;
  readonly p90Ms: Readonly<Record<string, readonly number[]>>;
  readonly levels: readonly Knobs[];
  readonly frames: number;
  readonly machine: {
    readonly cpu: string;
    readonly cores: number;
    readonly platform: string;
    readonly arch: string;
    readonly node: string;
  };
  readonly config: string;
  readonly models: Readonly<Record<string, string>>;
  /** The decoder settings besides the models that change what a frame costs. Absent in percept 0.1's
   * first calibration files, which mean the defaults. */
  readonly decoder?: Pick<PerceptConfig['decoder'], 'ngram' | 'draftMax' | 'kvType' | 'threads' | 'gpuLayers'>;
}

export interface StageTimes {
  /** stage → per level, the durations (ms) of its calls. */
  readonly samples: ReadonlyMap<string, number[][]>;
}

/**
 * Times each stage's process() per level. `now` reads the clock, in ns, the times are measured on.
 * A frame a stage drops (DropFrame, e.g. an invalid action) ends there.
 */
export async function timeStages(options: {
  readonly stages: readonly Stage<never, unknown>[];
  readonly frames: readonly CameraFrame[];
  readonly levels: readonly Knobs[];
  readonly now: () => bigint;
  readonly warmup?: number;
  readonly onFrame?: (level: number, frame: number) => void;
}): Promise<StageTimes> {
  const { stages, frames, levels, now, warmup = 1 } = options;
  const samples = new Map(stages.map((s) => [s.name, levels.map((): number[] => [])]));
  for (const [level, knobs] of levels.entries()) {
    const previous = levels[level - 1];
    if (previous && sameCost(previous, knobs)) {
      for (const perLevel of samples.values()) perLevel[level] = [...perLevel[level - 1]!];
      // The level's frames are done too, taken from the level above: progress still reaches the total.
      for (let k = 0; k < frames.length; k++) options.onFrame?.(level, k);
      continue;
    }
    for (let k = -warmup; k < frames.length; k++) {
      let value: unknown = frames[(k + frames.length) % frames.length];
      const ctx = standaloneContext({ clock: new RealClock(), knobs, frame: { frameId: k + warmup, degradeLevel: level } });
      for (const stage of stages) {
        const start = now();
        try {
          value = await (stage.process as (input: unknown, c: typeof ctx) => Promise<unknown>)(value, ctx);
        } catch (err) {
          if (!(err instanceof DropFrame))
            throw new Error(`calibrate: stage ${stage.name} failed at level ${level}: ${(err as Error).message}`, { cause: err });
          if (k >= 0) samples.get(stage.name)![level]!.push(Number(now() - start) / 1e6);
          break;
        }
        if (k >= 0) samples.get(stage.name)![level]!.push(Number(now() - start) / 1e6);
      }
      if (k >= 0) options.onFrame?.(level, k);
    }
  }
  return { samples };
}

const sameCost = (a: Knobs, b: Knobs): boolean =>
  a.imageTokens === b.imageTokens && a.maxNewTokens === b.maxNewTokens && a.draft === b.draft;

/** Per stage, one number per level: `stat` of the samples rounded to µs, 0 where there were none. */
export function perLevel(times: StageTimes, stat: (xs: number[]) => number): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  for (const [stage, levels] of times.samples) out[stage] = levels.map((xs) => (xs.length ? Math.round(stat(xs) * 1000) / 1000 : 0));
  return out;
}

/** Per stage, per level: the distribution of the samples, or 0 where there were none. */
export function distributionsPerLevel(times: StageTimes): Record<string, ServiceCost[]> {
  const out: Record<string, ServiceCost[]> = {};
  for (const [stage, levels] of times.samples) out[stage] = levels.map((xs) => (xs.length ? serviceDistribution(xs) : 0));
  return out;
}

export interface CalibrateOptions {
  readonly config?: string;
  readonly source?: string;
  readonly frames?: number;
  readonly out: string;
  readonly onProgress?: (done: number, total: number) => void;
}

export async function calibrate(opts: CalibrateOptions): Promise<CalibrationFile> {
  const frameCount = opts.frames ?? 10;
  if (!Number.isInteger(frameCount) || frameCount < 1) throw new RangeError(`--frames must be an integer >= 1, got ${opts.frames}`);
  const base = runConfig({ config: opts.config, source: opts.source });
  // Measured as configured, but on any free port: calibrating must not collide with a running percept.
  const config: PerceptConfig = { ...base, publisher: { ...base.publisher, endpoint: 'tcp://127.0.0.1:*' } };
  const frames = await readFrames(config, frameCount);
  const levels = Array.from({ length: config.ladder.rungs.length + 1 }, (_, i) =>
    new DegradeLadder(config.ladder, config.budgets.endToEndMs).knobsAt(i),
  );
  const { chain } = await createStages(config, loadActionSchema(config.actions.schema));
  let times: StageTimes;
  try {
    const total = levels.length * frames.length;
    let done = 0;
    times = await timeStages({
      stages: chain.stages,
      frames,
      levels,
      now: () => process.hrtime.bigint(),
      onFrame: () => opts.onProgress?.(++done, total),
    });
  } finally {
    for (const stage of chain.stages) await stage.close?.().catch(() => undefined);
  }
  const cpu = cpus();
  const models: Record<string, string> = { decoder: config.decoder.model };
  if (config.encoder.kind === 'onnx') models.encoder = config.encoder.model;
  if (config.encoder.kind === 'mtmd') models.encoder = config.encoder.mmproj;
  if (config.decoder.draft) models.draft = config.decoder.draft;
  if (config.decoder.draftMtp) models.draftMtp = config.decoder.draftMtp;
  const file: CalibrationFile = {
    kind: 'percept.calibration',
    version: CALIBRATION_VERSION,
    virtualServiceMs: distributionsPerLevel(times),
    medianMs: perLevel(times, median),
    p90Ms: perLevel(times, (xs) => quantile(xs, 0.9)),
    levels,
    frames: frames.length,
    machine: { cpu: cpu[0]?.model ?? 'unknown', cores: cpu.length, platform: process.platform, arch: process.arch, node: process.version },
    config: opts.config ?? '(the embedded default)',
    models,
    decoder: {
      ngram: config.decoder.ngram,
      draftMax: config.decoder.draftMax,
      kvType: config.decoder.kvType,
      threads: config.decoder.threads,
      gpuLayers: config.decoder.gpuLayers,
    },
  };
  mkdirSync(dirname(opts.out), { recursive: true });
  writeFileSync(opts.out, `${JSON.stringify(file, null, 2)}\n`);
  return file;
}

/** Up to `n` frames from the config's source, read without pacing (a virtual clock). */
async function readFrames(config: PerceptConfig, n: number): Promise<CameraFrame[]> {
  const source = await createSource(config.source, config.preprocess.maxPixels);
  const frames: CameraFrame[] = [];
  const controller = new AbortController();
  try {
    for await (const item of source.frames(new VirtualClock(source.startNs ?? 0n), controller.signal)) {
      if (isRejection(item)) continue;
      frames.push(item.payload);
      if (frames.length >= n) break;
    }
  } finally {
    controller.abort();
    await source.close?.();
  }
  if (frames.length === 0) throw new Error('calibrate: the source gave no frame');
  return frames;
}
