// One resolver for every model a config or a command names: a file path, or a synthetic checkpoint made on first use and cached.
//
//   const gguf = await resolveModel('synth:gemma4-tiny?wtype=q4_k', 'decoder');
//
// Spec grammar (`synth:PRESET[@SEED][?key=value&…]`): models/README.md#model-specs
import { existsSync, statSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { assembleDemoModel } from './demo-model.ts';
import { mmprojVisionPreset, synthesizeMmproj, type MmprojDtype } from './mmproj-synth.ts';
import { readGGUF, type GGUFFile } from './gguf.ts';
import { describeSynthetic, synthesize, type WeightType } from './synth.ts';
import { synthesizeVision, visionPreset } from './vision-synth.ts';

export type ModelKind = 'decoder' | 'vision' | 'mmproj';

/** Where synthetic checkpoints are cached unless a caller says otherwise. */
export const MODEL_CACHE = join(dirname(fileURLToPath(import.meta.url)), '..', '.cache', 'models');

export interface ResolveModelOptions {
  /** Cache folder for synthetic checkpoints (default MODEL_CACHE). */
  readonly cacheDir?: string;
  /** Progress while a synthetic checkpoint is written: bytes done, bytes total. */
  readonly onProgress?: (doneBytes: number, totalBytes: number) => void;
}

const SYNTH = 'synth:';
/** `demo:NAME`: a trained demo model shipped in models/demo/, assembled into the cache on first use. */
const DEMO = 'demo:';
const SPEC = /^synth:([a-z0-9][a-z0-9-]*)(?:@(\d+))?(?:\?(.*))?$/;
const KEYS: Record<ModelKind, readonly string[]> = { decoder: ['wtype', 'seed'], vision: ['seed'], mmproj: ['dtype', 'seed'] };
const DEFAULT_SEED: Record<ModelKind, number> = { decoder: 1, vision: 0, mmproj: 0 };
const MMPROJ_DTYPES: readonly MmprojDtype[] = ['f32', 'f16'];

/** True for specifiers that name an mmproj: a `.gguf` path or `synth:<preset>-mmproj…`. */
export function isMmprojSpec(spec: string): boolean {
  return typeof spec === 'string' && (spec.endsWith('.gguf') || /^synth:[a-z0-9-]+-mmproj(?:[@?]|$)/.test(spec));
}

/** Resolves `spec` to the path of a model file of `kind`.
 * It writes a synthetic checkpoint into the cache the first time one is named. Idempotent: an existing file is reused. */
export async function resolveModel(spec: string, kind: ModelKind, options: ResolveModelOptions = {}): Promise<string> {
  if (typeof spec !== 'string' || spec.length === 0)
    throw new TypeError(`Expected a non-empty string for the ${kind} model but received ${JSON.stringify(spec)}`);
  if (!(kind in KEYS))
    throw new TypeError(`Expected one of ${Object.keys(KEYS).join(', ')} for the model kind but received ${JSON.stringify(kind)}`);
  const cacheDir = options.cacheDir ?? MODEL_CACHE;
  if (spec.startsWith(DEMO)) return assembleDemoModel(spec.slice(DEMO.length), kind, { cacheDir });
  if (!spec.startsWith(SYNTH)) return existingFile(spec, kind);

  const { name, seed, params } = parseSynthSpec(spec, kind);
  const progress = options.onProgress ? { onProgress: options.onProgress } : {};
  switch (kind) {
    case 'decoder': {
      const wtype = (params.get('wtype') ?? 'q8_0') as WeightType; // synthesize() checks it
      const out = join(cacheDir, `${name}.${wtype}.s${seed}.gguf`);
      return (await synthesize({ preset: name, wtype, seed, out, ...progress })).path;
    }
    case 'vision': {
      const preset = visionPreset(name).name;
      const out = join(cacheDir, `${preset}-s${seed}.onnx`);
      if (!isComplete(out)) synthesizeVision({ preset, out, seed, ...progress });
      return out;
    }
    case 'mmproj': {
      const base = mmprojVisionPreset(name);
      const dtype = params.get('dtype') ?? 'f32';
      if (!(MMPROJ_DTYPES as readonly string[]).includes(dtype)) {
        throw new RangeError(`model spec ${JSON.stringify(spec)}: dtype must be one of ${MMPROJ_DTYPES.join(', ')}, got '${dtype}'`);
      }
      const out = join(cacheDir, `${base}-s${seed}-${dtype}.mmproj.gguf`);
      if (!isComplete(out)) await synthesizeMmproj({ preset: base, out, seed, dtype: dtype as MmprojDtype, ...progress });
      return out;
    }
  }
}

/** The parsed header of the decoder GGUF `spec` names; a `synth:` spec is described in memory, never
 * written (calculators read multi-GB presets this way). */
export async function describeModel(spec: string): Promise<GGUFFile> {
  if (typeof spec !== 'string' || spec.length === 0)
    throw new TypeError(`Expected a non-empty string for the decoder model but received ${JSON.stringify(spec)}`);
  if (spec.startsWith(DEMO)) return readGGUF(await resolveModel(spec, 'decoder'));
  if (!spec.startsWith(SYNTH)) return readGGUF(await existingFile(spec, 'decoder'));
  const { name, seed, params } = parseSynthSpec(spec, 'decoder');
  return describeSynthetic({ preset: name, wtype: (params.get('wtype') ?? 'q8_0') as WeightType, seed });
}

function parseSynthSpec(spec: string, kind: ModelKind): { name: string; seed: number; params: URLSearchParams } {
  const m = SPEC.exec(spec);
  if (!m) throw new RangeError(`bad synthetic model spec ${JSON.stringify(spec)} (expected synth:PRESET[@SEED][?key=value&…])`);
  const params = new URLSearchParams(m[3] ?? '');
  for (const key of params.keys()) {
    if (!KEYS[kind].includes(key))
      throw new RangeError(
        `model spec ${JSON.stringify(spec)}: unknown parameter '${key}' for a ${kind} (expected ${KEYS[kind].join(', ')})`,
      );
  }
  const seedParam = params.get('seed');
  if (m[2] !== undefined && seedParam !== null)
    throw new RangeError(`model spec ${JSON.stringify(spec)}: the seed is given twice (@${m[2]} and ?seed=${seedParam})`);
  const seedText = m[2] ?? seedParam ?? String(DEFAULT_SEED[kind]);
  if (!/^\d+$/.test(seedText) || Number(seedText) > 0xffffffff) {
    throw new RangeError(`model spec ${JSON.stringify(spec)}: seed must be a non-negative integer, got '${seedText}' (at most 2^32 - 1)`);
  }
  return { name: m[1]!, seed: Number(seedText), params };
}

async function existingFile(spec: string, kind: ModelKind): Promise<string> {
  const path = resolve(spec);
  let isFile: boolean;
  try {
    isFile = (await stat(path)).isFile();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT')
      throw new Error(`${kind} model file not found: ${path} (from spec ${JSON.stringify(spec)})`, { cause: err });
    throw err;
  }
  if (!isFile) throw new Error(`${kind} model path ${path} is not a file`);
  return path;
}

/** Synthetic files are written under a temporary name and renamed when complete. */
function isComplete(path: string): boolean {
  return existsSync(path) && statSync(path).size > 0;
}
