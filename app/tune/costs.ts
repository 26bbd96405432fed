// The stage costs of a tune's grid point on the virtual clock: what `percept calibrate` measured for its knobs.
// A calibration's levels vary image tokens, max new tokens and drafting on/off.
// Its models and decoder settings (model, encoder, speculator, KV type, threads, GPU layers) must be the point's.
// A point no calibration measured gets the first knob none measured, as the reason.
// A cost is a distribution the virtual clock samples per call (seeded), or fixed ms from a version 1 file.
import { readFileSync } from 'node:fs';
import { CALIBRATION_VERSION, type PerceptConfig } from '../../pipeline/config.ts';
import type { ServiceCost } from '../../pipeline/service-time.ts';
import type { Knobs } from '../../pipeline/types.ts';
import type { CalibrationFile } from '../eval/calibrate.ts';
import { knobText, sameDraft, speculatorOf, type DraftChoice, type KnobName, type PointKnobs } from './grid.ts';

export interface Calibration {
  readonly path: string;
  readonly levels: readonly Knobs[];
  /** stage → per level: a distribution, or fixed ms. */
  readonly serviceMs: Readonly<Record<string, readonly ServiceCost[]>>;
  readonly version: 1 | 2;
  readonly decoder: string;
  readonly encoder: string | null;
  readonly speculator: DraftChoice;
  readonly kvType: PointKnobs['kvType'];
  readonly threads: number | null;
  readonly gpuLayers: number;
}

export function readCalibration(path: string): Calibration {
  let file: CalibrationFile;
  try {
    file = JSON.parse(readFileSync(path, 'utf8')) as CalibrationFile;
  } catch (err) {
    throw new Error(`--calibration ${path}: ${(err as Error).message}`, { cause: err });
  }
  const bad = (what: string) => new Error(`--calibration ${path}: ${what} (write one with percept calibrate)`);
  if (file?.kind !== 'percept.calibration') throw bad('not a calibration file');
  if (file.version !== 1 && file.version !== CALIBRATION_VERSION)
    throw bad(`version ${String(file.version)}, and this percept reads versions 1 and ${CALIBRATION_VERSION}`);
  if (!Array.isArray(file.levels) || file.levels.length === 0) throw bad('no levels');
  for (const [stage, values] of Object.entries(file.virtualServiceMs ?? {})) {
    if (!Array.isArray(values) || values.length !== file.levels.length || !values.every(validCost))
      throw bad(
        `virtualServiceMs.${stage} must hold one cost per level (${file.levels.length}): ms >= 0, or {count, quantilesMs} ascending`,
      );
  }
  if (typeof file.models?.decoder !== 'string') throw bad('models.decoder is missing');
  const settings = file.decoder ?? { ngram: false, draftMax: null, kvType: 'f16', threads: null, gpuLayers: 0 };
  const speculator = speculatorOf({ ...settings, draft: file.models.draft, draftMtp: file.models.draftMtp });
  return {
    path,
    levels: file.levels,
    serviceMs: file.virtualServiceMs,
    version: file.version,
    decoder: file.models.decoder,
    encoder: file.models.encoder ?? null,
    speculator,
    kvType: settings.kvType,
    threads: settings.threads,
    gpuLayers: settings.gpuLayers,
  };
}

const validMs = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v) && v >= 0;

function validCost(cost: unknown): boolean {
  if (typeof cost !== 'object' || cost === null) return validMs(cost);
  const { count, quantilesMs } = cost as { count?: unknown; quantilesMs?: unknown };
  return (
    Number.isInteger(count) &&
    (count as number) >= 1 &&
    Array.isArray(quantilesMs) &&
    quantilesMs.length > 0 &&
    quantilesMs.every((v: unknown, i) => validMs(v) && (i === 0 || (v as number) >= (quantilesMs[i - 1] as number)))
  );
}

/** The encoder a calibration must have measured: the config's model file spec, or null for projection. */
export function encoderSpec(config: PerceptConfig): string | null {
  return config.encoder.kind === 'onnx' ? config.encoder.model : config.encoder.kind === 'mtmd' ? config.encoder.mmproj : null;
}

/** The calibrated service times of a point, or why no calibration measured it. */
export function calibratedCost(
  calibrations: readonly Calibration[],
  knobs: PointKnobs,
  maxNewTokens: { readonly knob: number; readonly bounded: boolean },
  encoder: string | null,
): { readonly serviceMs: Record<string, ServiceCost> } | { readonly knob: KnobName | 'encoder' | null; readonly why: string } {
  const on = knobs.draft.kind !== 'none';
  const settingsMatch = (c: Calibration) =>
    c.decoder === knobs.model &&
    c.encoder === encoder &&
    c.kvType === knobs.kvType &&
    c.threads === knobs.threads &&
    c.gpuLayers === knobs.gpuLayers &&
    (!on || sameDraft(c.speculator, knobs.draft));
  for (const c of calibrations.filter(settingsMatch)) {
    // A bounded grammar ends every action before any budget at or above its worst case: the cost
    // does not depend on maxNewTokens then.
    const level = c.levels.findIndex(
      (l) =>
        l.imageTokens === knobs.imageTokens &&
        (maxNewTokens.bounded || l.maxNewTokens === maxNewTokens.knob) &&
        (on ? l.draft : !l.draft || c.speculator.kind === 'none'),
    );
    if (level >= 0) return { serviceMs: Object.fromEntries(Object.entries(c.serviceMs).map(([stage, values]) => [stage, values[level]!])) };
  }
  // Why: the first knob no calibration measured at all.
  const list = (values: Iterable<unknown>) => [...new Set(values)].map(String).join(', ');
  if (!calibrations.some((c) => c.decoder === knobs.model))
    return {
      knob: 'model',
      why: `no calibration measured decoder ${knobs.model} (calibrated: ${list(calibrations.map((c) => c.decoder))})`,
    };
  if (!calibrations.some((c) => c.encoder === encoder))
    return {
      knob: 'encoder',
      why: `no calibration measured the config's encoder ${encoder ?? 'projection'} (calibrated: ${list(calibrations.map((c) => c.encoder ?? 'projection'))})`,
    };
  const settings: [KnobName, (c: Calibration) => boolean, (c: Calibration) => unknown][] = [
    ['kvType', (c) => c.kvType === knobs.kvType, (c) => c.kvType],
    ['threads', (c) => c.threads === knobs.threads, (c) => knobText('threads', c.threads)],
    ['gpuLayers', (c) => c.gpuLayers === knobs.gpuLayers, (c) => c.gpuLayers],
    ['draft', (c) => !on || sameDraft(c.speculator, knobs.draft), (c) => knobText('draft', c.speculator)],
  ];
  for (const [knob, match, show] of settings) {
    if (!calibrations.some(match))
      return {
        knob,
        why: `no calibration measured ${knob} ${knobText(knob, knobs[knob])} (calibrated: ${list(calibrations.map(show))}); it needs a calibration made with it, or --real`,
      };
  }
  if (!calibrations.some((c) => c.levels.some((l) => l.imageTokens === knobs.imageTokens)))
    return {
      knob: 'imageTokens',
      why: `no calibration measured imageTokens ${knobs.imageTokens} (calibrated: ${list(calibrations.flatMap((c) => c.levels.map((l) => l.imageTokens)))})`,
    };
  return {
    knob: null,
    why: 'no calibration measured this combination of knobs (calibrate with a config whose ladder has it, or use --real)',
  };
}
