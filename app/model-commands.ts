// `percept models …` is one front for both kinds of synthetic checkpoints: decoder GGUFs and ONNX
// vision encoders. They come from models/synth.ts and models/vision-synth.ts.
import { listPresets, parseWeightType, synthesize } from '../models/synth.ts';
import { listVisionPresets, synthesizeVision } from '../models/vision-synth.ts';
import { listMmprojPresets, synthesizeMmproj, type MmprojDtype } from '../models/mmproj-synth.ts';

export interface PresetListing {
  readonly name: string;
  readonly kind: 'decoder' | 'vision' | 'mmproj';
  readonly description: string;
}

export async function listAllPresets(): Promise<PresetListing[]> {
  return [
    ...listPresets().map((p) => ({ name: p.name, kind: 'decoder' as const, description: p.description })),
    ...listVisionPresets().map((p) => ({ name: p.name, kind: 'vision' as const, description: p.description })),
    ...listMmprojPresets().map((p) => ({ name: p.name, kind: 'mmproj' as const, description: p.description })),
  ];
}

export interface SynthOptions {
  readonly preset: string;
  readonly out: string;
  readonly wtype?: string;
  readonly seed?: number;
}

export async function synthesizeAny(opts: SynthOptions): Promise<Record<string, unknown>> {
  const { SingleBar, Presets } = (await import('cli-progress')).default;
  const bar = new SingleBar(
    { format: `${opts.preset} [{bar}] {percentage}% {value}/{total} MiB`, noTTYOutput: true, notTTYSchedule: 5000 },
    Presets.shades_classic,
  );
  let started = false;
  const onProgress = (done: number, total: number) => {
    const mib = (n: number) => Math.round(n / 2 ** 20);
    if (!started) {
      bar.start(mib(total), 0);
      started = true;
    }
    bar.update(mib(done));
  };
  try {
    if (listVisionPresets().some((p) => p.name === opts.preset)) {
      const r = await synthesizeVision({ preset: opts.preset, out: opts.out, seed: opts.seed, onProgress });
      return { ...r };
    }
    if (listMmprojPresets().some((p) => p.name === opts.preset)) {
      const r = await synthesizeMmproj({
        preset: opts.preset,
        out: opts.out,
        seed: opts.seed,
        ...(opts.wtype !== undefined ? { dtype: mmprojDtype(opts.wtype) } : {}),
        onProgress,
      });
      return { ...r };
    }
    if (!listPresets().some((p) => p.name === opts.preset)) {
      const names = (await listAllPresets()).map((p) => p.name).join(', ');
      throw new Error(`unknown preset '${opts.preset}'; presets: ${names}`);
    }
    const wtype = opts.wtype !== undefined ? { wtype: parseWeightType(opts.wtype) } : {};
    const r = await synthesize({ preset: opts.preset, out: opts.out, ...wtype, seed: opts.seed, onProgress });
    return { ...r };
  } finally {
    if (started) bar.stop();
  }
}

/** An mmproj stores its matrices in f32 or f16; the other weight types are for decoder GGUFs. */
function mmprojDtype(wtype: string): MmprojDtype {
  if (wtype !== 'f32' && wtype !== 'f16') throw new RangeError(`--wtype ${wtype}: an mmproj is written in f32 or f16`);
  return wtype;
}
