// `percept bench ladder` builds the deployment table of one model, rung by rung (F16 → Q8_0 → Q4_K_M → Q4_K_M + speculative).
// Columns: file size, decode and prefill speed, time to first token, KV bytes, agreement, share of the
// bandwidth ceiling, end-to-end latency on a bag and energy.
//
// Agreement is greedy, over fixed chat-templated prompts with T new tokens each. End-of-generation is ignored,
// so every sequence has T positions.
//  - prefix: the share of positions equal to the reference's until the first divergence, summed over the prompts.
//    The rung decodes freely, with speculation where it has it.
//  - top-1: the share of all positions where the rung's greedy token is the reference's, given the reference's
//    tokens before it. After a divergence free-running texts no longer share a context, so comparing them would
//    measure chance. This teacher forcing is llama-perplexity's "same top" for greedy decoding.
// Both are 1 for a rung that decodes exactly as the reference. The reference row measures a fresh load of itself,
// so its 1 checks determinism.
import { stat } from 'node:fs/promises';
import type { SingleBar } from 'cli-progress';
import { availableParallelism, loadavg } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { readGGUF, type GGUFFile } from '../../models/gguf.ts';
import { attentionLayout, kvCacheBytes } from '../../models/kv.ts';
import { DEVICE_PRESETS, roofline } from '../../models/roofline.ts';
import { MODEL_CACHE, resolveModel } from '../../models/resolve.ts';
import {
  QUANT_INFO,
  checkLadderQuant,
  fileTypeLabel,
  makeRung,
  readReference,
  type LadderQuant,
  type QuantizerKind,
  type QuantizerSpec,
} from '../../models/quantize-rungs.ts';
import { LlamaModel, type LlamaContext } from '../../native/llama.ts';
import { loadActionSchema, type ActionSchema } from '../../nodes/action-schema.ts';
import { attachSpeculation, type SpeculationFlags } from '../../nodes/decoder.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { loadConfig, type PerceptConfig } from '../../pipeline/config.ts';
import { createGraph } from '../../pipeline/graph/graph.ts';
import type { RunSummary } from '../../pipeline/telemetry/events.ts';
import { encoderSection } from './frame.ts';
import { benchDecode } from './decode.ts';
import { ensurePeerProgram, findPeerProgram } from '../../native/peers.ts';
import { EnergyMeter, checkEnergySource, energyJson, type EnergyJson, type EnergyReading, type EnergySource } from './energy.ts';
import { DEFAULT_CONFIG, createStages, parseSourceSpec } from '../run/run.ts';
import { createSource } from '../run/stages.ts';

/** The fixed prompts of the agreement measure: what a robot's decoder is asked. */
export const AGREEMENT_PROMPTS: readonly string[] = [
  'Describe what is directly in front of the robot.',
  'Is the path to the door clear? Answer, then explain why.',
  'List the objects on the table from left to right.',
  'A person is walking toward the robot. What should the robot do next?',
  'Give the next navigation action as JSON with the fields action and target.',
  'How far away is the nearest obstacle, in meters?',
  'The gripper holds a red cup. Where should the robot put it down?',
  'Summarize the scene for a remote operator in one sentence.',
];

const MiB = 1024 * 1024;

export interface BenchLadderOptions {
  /** Reference checkpoint: an unquantized GGUF, or synth:PRESET, made in F16 unless ?wtype= says otherwise. */
  readonly model: string;
  /** Rungs below the reference. A quantization (q8_0, q4_0, q4_k_m) is made here, a GGUF file elsewhere. */
  readonly quants?: readonly string[];
  /** Draft for the speculative rung (a same-vocabulary GGUF, or a Gemma 4 MTP assistant), or synth:PRESET. */
  readonly draft?: string;
  /** Bag replayed through the real stages for end-to-end latency and energy per frame. */
  readonly bag?: string;
  /** Config whose stages the bag runs through, by default the embedded configs/default.json. Each rung is its decoder. */
  readonly config?: string;
  /** Encoder override for the bag run: 'projection', an .onnx, an mmproj .gguf, or synth:PRESET. */
  readonly encoder?: string;
  /** auto, the default, uses llama-quantize when it is built, else percept's. */
  readonly quantizer?: 'auto' | QuantizerKind;
  /** Folder of the rung files (default .cache/ladder). */
  readonly outDir?: string;
  readonly promptTokens?: number;
  readonly genTokens?: number;
  readonly reps?: number;
  /** New tokens per agreement prompt (default 32). */
  readonly agreementTokens?: number;
  /** Contexts (tokens) the KV columns are given at. */
  readonly kvCtx?: readonly number[];
  readonly bandwidthGbs?: number;
  readonly device?: string;
  readonly gpuLayers?: number;
  readonly energy?: EnergySource;
  /** Progress bars on stderr. */
  readonly progress?: boolean;
}

export interface LadderRow {
  readonly rung: string;
  readonly status: 'ok' | 'failed';
  /** The step that failed and why. The steps after it are not measured, so their columns are null. */
  readonly error: string | null;
  readonly file: string | null;
  readonly file_bytes: number | null;
  /** Who made the file: the reference itself, a quantizer, or 'given' for a file named in --quants. */
  readonly quantizer: 'reference' | QuantizerKind | 'given' | null;
  readonly speculation: 'draft-simple' | 'draft-mtp' | null;
  readonly decode_tok_s: number | null;
  readonly prefill_tok_s: number | null;
  readonly ttft_ms: number | null;
  /** KV-cache bytes per context (the draft's own cache included on a speculative rung). */
  readonly kv_bytes: Readonly<Record<string, number>> | null;
  readonly agreement: { readonly prefix: number; readonly top1: number } | null;
  readonly roofline: { readonly bytes_per_token: number; readonly ceiling_tok_s: number | null; readonly fraction: number | null } | null;
  readonly bag: {
    readonly frames_in: number;
    readonly frames_out: number;
    readonly dropped: number;
    /** Every dropped frame has a reason (stale, conflated, invalid, …). */
    readonly dropped_by_reason: Readonly<Record<string, number>>;
    readonly e2e_p50_ms: number | null;
    readonly e2e_p99_ms: number | null;
  } | null;
  /** Board energy over the decode runs as tok_per_watt, and over the bag as joules_per_frame. */
  readonly energy: { readonly decode: EnergyJson | null; readonly bag: EnergyJson | null };
}

export interface LadderResult {
  readonly reference: string;
  readonly draft: string | null;
  readonly bag: string | null;
  readonly config: string | null;
  readonly gpu_layers: number;
  readonly threads: number;
  /** 1-minute load average when the ladder started and ended (the machine may be shared). */
  readonly load_avg: readonly [number, number];
  readonly decode: { readonly prompt_tokens: number; readonly gen_tokens: number; readonly reps: number };
  readonly agreement: { readonly prompts: number; readonly tokens: number };
  readonly kv: { readonly ctx: readonly number[]; readonly type: 'f16'; readonly swa_full: true };
  readonly roofline: { readonly device: string | null; readonly bandwidth_gbs: number | null; readonly ctx: number };
  readonly rungs: readonly LadderRow[];
  readonly failed: number;
}

// ---------------------------------------------------------------------------------------------------------
// Progress

/** cli-progress bars on stderr. On a pipe they print a line every few seconds (noTTYOutput). */
class Progress {
  readonly #make: (() => SingleBar) | undefined;
  #bar: SingleBar | undefined;

  private constructor(make: (() => SingleBar) | undefined) {
    this.#make = make;
  }

  static async create(enabled: boolean): Promise<Progress> {
    if (!enabled) return new Progress(undefined);
    const { SingleBar, Presets } = (await import('cli-progress')).default;
    return new Progress(
      () =>
        new SingleBar(
          {
            format: 'ladder [{bar}] {percentage}% {task}',
            stream: process.stderr,
            noTTYOutput: true,
            notTTYSchedule: 5000,
            hideCursor: true,
          },
          Presets.shades_classic,
        ),
    );
  }

  begin(total: number, task: string): void {
    this.end();
    this.#bar = this.#make?.();
    this.#bar?.start(total, 0, { task });
  }

  update(value: number, task?: string, total?: number): void {
    if (total !== undefined) this.#bar?.setTotal(total);
    this.#bar?.update(value, task === undefined ? undefined : { task });
  }

  end(): void {
    this.#bar?.stop();
    this.#bar = undefined;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Agreement

interface Reference {
  readonly prompts: readonly number[][];
  readonly tokens: readonly number[][];
}

/** The prompt's tokens as the model's chat template renders a user turn. */
function chatTokens(model: LlamaModel, text: string): number[] {
  const segments = model.chatPrompt([{ role: 'user', content: text }]);
  return segments.flatMap((s) => ('text' in s ? [...model.tokenize(s.text, { addSpecial: s.addSpecial ?? false })] : []));
}

/** Runs `fn` on a context of `path` with room for the prompts and `n` new tokens, speculation attached. */
async function withContext<T>(
  path: string,
  gpuLayers: number,
  speculation: SpeculationFlags,
  room: { prompts: readonly number[][]; n: number },
  fn: (ctx: LlamaContext) => Promise<T>,
): Promise<T> {
  const model = await LlamaModel.load(path, { gpuLayers });
  let draft: LlamaModel | undefined;
  try {
    const ctx = await model.createContext({ nCtx: Math.max(...room.prompts.map((p) => p.length)) + room.n + 16, nBatch: 512 });
    draft = await attachSpeculation(ctx, speculation, gpuLayers);
    return await fn(ctx);
  } finally {
    await model.dispose();
    await draft?.dispose();
  }
}

/** The agreement prompts in the reference's chat template, and its greedy tokens for each. */
async function referenceTokens(path: string, n: number, gpuLayers: number): Promise<Reference> {
  const vocab = await LlamaModel.load(path, { vocabOnly: true });
  let prompts: number[][];
  try {
    prompts = AGREEMENT_PROMPTS.map((p) => chatTokens(vocab, p));
  } finally {
    await vocab.dispose();
  }
  return withContext(path, gpuLayers, {}, { prompts, n }, async (ctx) => {
    const tokens: number[][] = [];
    for (const p of prompts) tokens.push([...(await ctx.generate([{ tokens: p }], { maxTokens: n, ignoreEos: true })).tokens]);
    return { prompts, tokens };
  });
}

/** Agreement of a rung with the reference (the definitions are at the top of this file). */
async function measureAgreement(
  path: string,
  ref: Reference,
  speculation: SpeculationFlags,
  gpuLayers: number,
): Promise<{ prefix: number; top1: number }> {
  const n = ref.tokens[0]!.length;
  return withContext(path, gpuLayers, speculation, { prompts: ref.prompts, n }, async (ctx) => {
    let prefix = 0;
    let top1 = 0;
    for (let i = 0; i < ref.prompts.length; i++) {
      const prompt = ref.prompts[i]!;
      const want = ref.tokens[i]!;
      const got = (await ctx.generate([{ tokens: prompt }], { maxTokens: n, ignoreEos: true })).tokens;
      let d = 0;
      while (d < n && got[d] === want[d]) d++;
      prefix += d;
      top1 += d;
      // Up to d the contexts were the reference's, so those positions agree and position d does not.
      // After it, the rung's next token is asked on the reference's context. The shared prefix's KV
      // is reused, so each position decodes one token.
      for (let k = d + 1; k < n; k++) {
        const r = await ctx.generate([{ tokens: [...prompt, ...want.slice(0, k)] }], { maxTokens: 1, ignoreEos: true, speculative: false });
        if (r.tokens[0] === want[k]) top1++;
      }
    }
    const positions = ref.prompts.length * n;
    return { prefix: prefix / positions, top1: top1 / positions };
  });
}

// ---------------------------------------------------------------------------------------------------------
// Bag

interface BagRun {
  readonly bag: NonNullable<LadderRow['bag']>;
  readonly energy: EnergyJson;
}

/** The bag run: the config with everything but the decoder set, and its action schema, loaded once. */
interface BagSetup {
  readonly config: PerceptConfig;
  readonly actionSchema: ActionSchema;
}

/**
 * The bag run's config: `configPath` with the bag as its source and the encoder override applied.
 * It is validated now, so a bad one is refused before anything runs. Its paths are relative to its folder.
 */
async function bagSetup(configPath: string, bag: string, encoder: string | undefined, gpuLayers: number): Promise<BagSetup> {
  if (!(await stat(bag).catch(() => undefined))?.isFile()) throw new Error(`--bag ${bag}: no such file`);
  const base = loadConfig(configPath);
  const config = loadConfig({
    ...base,
    source: parseSourceSpec(`bag:${bag}`, base.source),
    ...(encoder ? { encoder: encoderSection(encoder, gpuLayers) } : {}),
    telemetry: { ...base.telemetry, liveTable: 'off' },
  });
  return { config, actionSchema: loadActionSchema(config.actions.schema) };
}

/** The bag through the stages of `setup` with `model` (and the draft) as the decoder. */
async function runBag(
  setup: BagSetup,
  opts: { model: string; speculation: SpeculationFlags; gpuLayers: number; energy: EnergySource },
): Promise<BagRun> {
  const config = loadConfig({
    ...setup.config,
    decoder: {
      ...setup.config.decoder,
      model: opts.model,
      draft: opts.speculation.draft ?? null,
      draftMtp: opts.speculation.draftMtp ?? null,
      gpuLayers: opts.gpuLayers,
    },
  });
  const source = await createSource(config.source, config.preprocess.maxPixels);
  let stages: Awaited<ReturnType<typeof createStages>>;
  try {
    stages = await createStages(config, setup.actionSchema, { publish: false });
  } catch (err) {
    await source.close?.();
    throw err;
  }
  const meter = await EnergyMeter.start({ source: opts.energy, device: opts.gpuLayers !== 0 ? 'gpu' : 'cpu' });
  let summary: RunSummary;
  let reading: EnergyReading;
  try {
    meter.begin();
    summary = await createGraph({ source, stages: stages.chain, clock: new RealClock(), config }).run();
    meter.end();
  } finally {
    reading = await meter.stop();
  }
  return {
    bag: {
      frames_in: summary.frames.in,
      frames_out: summary.frames.out,
      dropped: summary.frames.dropped,
      dropped_by_reason: summary.drops.byReason as Record<string, number>,
      e2e_p50_ms: summary.endToEnd.p50Ms,
      e2e_p99_ms: summary.endToEnd.p99Ms,
    },
    energy: energyJson(reading, { frames: summary.frames.out }),
  };
}

// ---------------------------------------------------------------------------------------------------------
// The ladder

interface RungPlan {
  readonly rung: string;
  readonly quantizer: LadderRow['quantizer'];
  /** The rung's file, or why there is none. */
  readonly file: { path: string; bytes: number } | { error: string };
  readonly speculation: SpeculationFlags;
  readonly speculationType: LadderRow['speculation'];
}

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));

function positiveInts(name: string, values: readonly number[]): number[] {
  for (const v of values) if (!Number.isInteger(v) || v < 1) throw new RangeError(`${name} must be integers ≥ 1, got ${String(v)}`);
  return [...values];
}

/** synth:PRESET → its F16 checkpoint unless a wtype is asked for; anything else as it is. */
async function resolveReference(spec: string, onProgress: (done: number, total: number) => void): Promise<string> {
  const query = spec.indexOf('?');
  if (!spec.startsWith('synth:') || (query >= 0 && new URLSearchParams(spec.slice(query + 1)).has('wtype'))) {
    return resolveModel(spec, 'decoder', { onProgress });
  }
  return resolveModel(`${spec}${query >= 0 ? '&' : '?'}wtype=f16`, 'decoder', { onProgress });
}

async function chooseQuantizer(kind: BenchLadderOptions['quantizer']): Promise<QuantizerSpec> {
  switch (kind ?? 'auto') {
    case 'auto': {
      const binary = findPeerProgram('llama-quantize');
      return binary ? { kind: 'llama-quantize', binary } : { kind: 'percept' };
    }
    case 'percept':
      return { kind: 'percept' };
    case 'llama-quantize':
      return {
        kind: 'llama-quantize',
        binary: await ensurePeerProgram('llama-quantize', (msg) => process.stderr.write(`percept: ${msg}\n`)),
      };
    default:
      throw new RangeError(`--quantizer must be auto, percept or llama-quantize, got '${String(kind)}'`);
  }
}

/** Default KV contexts: 4K, 32K and 128K up to the trained context, and the trained context itself. */
function defaultKvContexts(file: GGUFFile): number[] {
  const trained = file.get(`${String(file.get('general.architecture'))}.context_length`);
  const limit = typeof trained === 'number' && trained > 0 ? trained : 131072;
  return [...new Set([...[4096, 32768, 131072].filter((c) => c <= limit), limit])].sort((a, b) => a - b);
}

function kvBytes(files: readonly GGUFFile[], contexts: readonly number[]): Record<string, number> {
  // As percept's decoder allocates it: f16, flash attention, sliding layers holding the whole context.
  const layouts = files.map((f) => attentionLayout(f));
  return Object.fromEntries(
    contexts.map((ctx) => [String(ctx), layouts.reduce((sum, l) => sum + kvCacheBytes(l, { ctx, swaFull: true }).totalBytes, 0)]),
  );
}

export async function benchLadder(opts: BenchLadderOptions): Promise<LadderResult> {
  const loadStart = loadavg()[0]!;
  const gpuLayers = opts.gpuLayers ?? 0;
  const promptTokens = opts.promptTokens ?? 64;
  const genTokens = opts.genTokens ?? 128;
  const reps = opts.reps ?? 3;
  const agreementTokens = opts.agreementTokens ?? 32;
  const energy = checkEnergySource(opts.energy ?? 'auto');
  for (const [k, v, min] of [
    ['agreementTokens', agreementTokens, 1],
    ['genTokens', genTokens, 2],
    ['promptTokens', promptTokens, 1],
    ['reps', reps, 1],
  ] as const) {
    if (!Number.isInteger(v) || v < min) throw new RangeError(`bench ladder: ${k} must be an integer ≥ ${min}, got ${v}`);
  }
  if (opts.bandwidthGbs !== undefined && opts.device !== undefined) throw new Error('give one of --bandwidth-gbs or --device, not both');
  if (opts.device !== undefined && !Object.hasOwn(DEVICE_PRESETS, opts.device)) {
    throw new Error(`unknown --device '${opts.device}'; expected one of: ${Object.keys(DEVICE_PRESETS).join(', ')}`);
  }
  const bandwidth = opts.device !== undefined ? DEVICE_PRESETS[opts.device]!.bandwidthGBs : (opts.bandwidthGbs ?? null);
  const quantizer = await chooseQuantizer(opts.quantizer);
  const wanted = (opts.quants ?? ['q8_0', 'q4_k_m']).map((q) => q.trim()).filter(Boolean);
  // A known quantization name, or else a path to a rung made elsewhere.
  const rungSpecs = wanted.map((q): { quant: LadderQuant } | { given: string } => {
    try {
      return { quant: checkLadderQuant(q) };
    } catch (err) {
      if (/\.gguf$/i.test(q)) return { given: resolve(q) };
      throw err;
    }
  });
  const configPath = opts.bag ? resolve(opts.config ?? DEFAULT_CONFIG) : null;
  const bag = opts.bag && configPath ? await bagSetup(configPath, opts.bag, opts.encoder, gpuLayers) : null;
  const outDir = resolve(opts.outDir ?? join(MODEL_CACHE, '..', 'ladder'));
  const progress = await Progress.create(opts.progress ?? false);

  try {
    // 1. The reference and the rungs' files.
    progress.begin(1, `reference ${opts.model}`);
    const refPath = await resolveReference(opts.model, (done, total) => progress.update(done, undefined, total));
    const refFile = await readReference(refPath);
    const contexts = positiveInts('--kv-ctx', opts.kvCtx ?? defaultKvContexts(refFile));
    let draftPath: string | null = null;
    let speculation: SpeculationFlags = {};
    let speculationType: LadderRow['speculation'] = null;
    if (opts.draft) {
      draftPath = await resolveModel(opts.draft, 'decoder');
      const mtp = (await readGGUF(draftPath)).get('general.architecture') === 'gemma4-assistant';
      speculation = mtp ? { draftMtp: draftPath } : { draft: draftPath };
      speculationType = mtp ? 'draft-mtp' : 'draft-simple';
    }

    const plans: RungPlan[] = [
      {
        rung: fileTypeLabel(refFile),
        quantizer: 'reference',
        file: { path: refPath, bytes: refFile.fileSize },
        speculation: {},
        speculationType: null,
      },
    ];
    for (const spec of rungSpecs) {
      if ('given' in spec) {
        let rung = basename(spec.given);
        let file: RungPlan['file'];
        try {
          const f = await readGGUF(spec.given);
          rung = fileTypeLabel(f);
          file = { path: spec.given, bytes: f.fileSize };
        } catch (err) {
          file = { error: `${spec.given}: ${errorText(err)}` };
        }
        plans.push({ rung, quantizer: 'given', file, speculation: {}, speculationType: null });
        continue;
      }
      const label = QUANT_INFO[spec.quant].label;
      progress.begin(1, `${label}: quantizing (${quantizer.kind})`);
      let file: RungPlan['file'];
      try {
        const made = await makeRung({
          source: refPath,
          quant: spec.quant,
          dir: outDir,
          quantizer,
          onProgress: (done, total) => progress.update(done, undefined, total),
        });
        file = { path: made.path, bytes: made.bytes };
      } catch (err) {
        file = { error: `quantizing to ${label}: ${errorText(err)}` };
      }
      plans.push({ rung: label, quantizer: quantizer.kind, file, speculation: {}, speculationType: null });
    }
    if (draftPath) {
      const base = plans[plans.length - 1]!;
      const file: RungPlan['file'] = 'error' in base.file ? { error: `its base rung ${base.rung} failed` } : base.file;
      plans.push({
        rung: `${base.rung} + ${speculationType === 'draft-mtp' ? 'MTP' : 'draft'}`,
        quantizer: base.quantizer,
        file,
        speculation,
        speculationType,
      });
    }

    // 2. The reference's tokens, then each rung measured.
    const perRung = 3 + (bag ? 1 : 0);
    const total = 1 + plans.length * perRung;
    let done = 0;
    progress.begin(total, 'reference tokens');
    const ref = await referenceTokens(refPath, agreementTokens, gpuLayers).catch((err: unknown) => {
      throw new Error(`reference ${refPath}: ${errorText(err)}`, { cause: err });
    });
    progress.update(++done);
    const draftFile = draftPath ? await readGGUF(draftPath) : undefined;

    const rows: LadderRow[] = [];
    for (const plan of plans) {
      // The first step that fails ends the rung's measurement (a file that does not load fails them all).
      let failure: string | null = null;
      const step = async <T>(name: string, fn: () => Promise<T>): Promise<T | null> => {
        if (failure !== null) {
          progress.update(++done);
          return null;
        }
        progress.update(done, `${plan.rung}: ${name}`);
        try {
          return await fn();
        } catch (err) {
          failure = `${name}: ${errorText(err)}`;
          return null;
        } finally {
          progress.update(++done);
        }
      };
      if ('error' in plan.file) {
        done += perRung;
        progress.update(done);
        rows.push(emptyRow(plan, plan.file.error));
        continue;
      }
      const { path, bytes } = plan.file;
      const header = await step('header', async () => {
        const file = await readGGUF(path);
        return { file, kv: kvBytes(plan.speculationType === null || !draftFile ? [file] : [file, draftFile], contexts) };
      });
      const agreement = await step('agreement', () => measureAgreement(path, ref, plan.speculation, gpuLayers));
      const decode = await step('decode', () =>
        benchDecode({ model: path, ...plan.speculation, promptTokens, genTokens, reps, gpuLayers, energy }),
      );
      const bagRun = bag ? await step('bag', () => runBag(bag, { model: path, speculation: plan.speculation, gpuLayers, energy })) : null;
      // Bytes read per token come from the same calculation whether or not a bandwidth was given;
      // the ceiling and the fraction only with one.
      const rl =
        header && decode
          ? roofline(header.file, { bandwidthGBs: bandwidth ?? 1, ctx: Math.round(genTokens / 2), measuredTokS: decode.tok_per_s })
          : null;
      rows.push({
        rung: plan.rung,
        status: failure === null ? 'ok' : 'failed',
        error: failure,
        file: path,
        file_bytes: bytes,
        quantizer: plan.quantizer,
        speculation: plan.speculationType,
        decode_tok_s: decode?.tok_per_s ?? null,
        prefill_tok_s: decode?.prefill_tok_per_s ?? null,
        ttft_ms: decode?.ttft_ms ?? null,
        kv_bytes: header?.kv ?? null,
        agreement,
        roofline: rl
          ? {
              bytes_per_token: Math.round(rl.bytesPerToken),
              ceiling_tok_s: bandwidth === null ? null : rl.ceilingTokS,
              fraction: bandwidth === null ? null : rl.fractionOfCeiling,
            }
          : null,
        bag: bagRun?.bag ?? null,
        energy: { decode: decode?.energy ?? null, bag: bagRun?.energy ?? null },
      });
    }
    progress.end();
    return {
      reference: refPath,
      draft: draftPath,
      bag: opts.bag ? resolve(opts.bag) : null,
      config: configPath,
      gpu_layers: gpuLayers,
      threads: availableParallelism(),
      load_avg: [loadStart, loadavg()[0]!],
      decode: { prompt_tokens: promptTokens, gen_tokens: genTokens, reps },
      agreement: { prompts: AGREEMENT_PROMPTS.length, tokens: agreementTokens },
      kv: { ctx: contexts, type: 'f16', swa_full: true },
      roofline: { device: opts.device ?? null, bandwidth_gbs: bandwidth, ctx: Math.round(genTokens / 2) },
      rungs: rows,
      failed: rows.filter((r) => r.status === 'failed').length,
    };
  } finally {
    progress.end();
  }
}

function emptyRow(plan: RungPlan, error: string): LadderRow {
  return {
    rung: plan.rung,
    status: 'failed',
    error,
    file: null,
    file_bytes: null,
    quantizer: plan.quantizer,
    speculation: plan.speculationType,
    decode_tok_s: null,
    prefill_tok_s: null,
    ttft_ms: null,
    kv_bytes: null,
    agreement: null,
    roofline: null,
    bag: null,
    energy: { decode: null, bag: null },
  };
}

// ---------------------------------------------------------------------------------------------------------
// The printed table

const fixed = (digits: number) => (x: number | null | undefined) => (x === null || x === undefined ? 'n/a' : x.toFixed(digits));

/** The deployment table as text: one row per rung, every number from `result`, the --json output. */
export function formatLadderTable(result: LadderResult): string {
  const columns: [string, (r: LadderRow) => string][] = [
    ['rung', (r) => r.rung],
    ['quantizer', (r) => r.quantizer ?? 'n/a'],
    ['size MiB', (r) => fixed(1)(r.file_bytes === null ? null : r.file_bytes / MiB)],
    ['decode tok/s', (r) => fixed(1)(r.decode_tok_s)],
    ['prefill tok/s', (r) => fixed(1)(r.prefill_tok_s)],
    ['TTFT ms', (r) => fixed(1)(r.ttft_ms)],
    ...result.kv.ctx.map((ctx): [string, (r: LadderRow) => string] => [
      `KV@${ctx} MiB`,
      (r) => fixed(1)(r.kv_bytes ? r.kv_bytes[String(ctx)]! / MiB : null),
    ]),
    ['agree prefix', (r) => fixed(3)(r.agreement?.prefix)],
    ['agree top-1', (r) => fixed(3)(r.agreement?.top1)],
    ['roofline %', (r) => fixed(1)(r.roofline?.fraction === null || r.roofline === null ? null : r.roofline.fraction * 100)],
    ...(result.bag
      ? ([
          ['frames out/in', (r) => (r.bag ? `${r.bag.frames_out}/${r.bag.frames_in}` : 'n/a')],
          ['e2e p99 ms', (r) => fixed(1)(r.bag?.e2e_p99_ms)],
          ['J/frame', (r) => fixed(3)(r.energy.bag?.joules_per_frame)],
        ] as [string, (r: LadderRow) => string][])
      : []),
    ['tok/s/W', (r) => fixed(2)(r.energy.decode?.tok_per_watt)],
    // One line per rung, so an error's own line breaks (llama.cpp's log lines, config issues) become spaces.
    ['status', (r) => (r.status === 'ok' ? 'ok' : `FAILED: ${r.error?.replace(/\s*\n\s*/g, ' ')}`)],
  ];
  const cells = [columns.map(([h]) => h), ...result.rungs.map((r) => columns.map(([, f]) => f(r)))];
  const widths = columns.map((_, i) => Math.max(...cells.map((row) => row[i]!.length)));
  const lines = cells.map((row) =>
    row
      .map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd(),
  );
  const energyReason = result.rungs.map((r) => r.energy.decode).find((e) => e && !e.available)?.reason;
  const notes = [
    `reference  ${result.reference}${result.draft ? `; draft ${result.draft}` : ''}`,
    `decode     llama-bench's method: ${result.decode.prompt_tokens}-token prefill, ${result.decode.gen_tokens} generated tokens, median of ${result.decode.reps}; ${result.threads} threads, gpu layers ${result.gpu_layers}; load average ${result.load_avg[0].toFixed(2)} → ${result.load_avg[1].toFixed(2)}`,
    `agreement  greedy, ${result.agreement.prompts} prompts × ${result.agreement.tokens} tokens: prefix = positions equal until the first divergence, top-1 = positions whose next token matches on the reference's context`,
    `KV         f16 cache as percept's decoder allocates it (sliding layers hold the whole context), draft's own cache included`,
    result.roofline.bandwidth_gbs === null
      ? 'roofline   n/a: give --device or --bandwidth-gbs'
      : `roofline   decode tok/s ÷ (${result.roofline.bandwidth_gbs} GB/s${result.roofline.device ? ` ${result.roofline.device}` : ''} ÷ bytes read per token at context ${result.roofline.ctx}); a speculative rung can pass 100 %`,
    ...(result.bag
      ? [
          `bag        ${result.bag} through the stages of ${result.config}; dropped frames by reason: ${result.rungs
            .filter((r) => r.bag)
            .map(
              (r) =>
                `${r.rung} ${
                  Object.entries(r.bag!.dropped_by_reason)
                    .map(([k, v]) => `${k} ${v}`)
                    .join(', ') || 'none'
                }`,
            )
            .join('; ')}`,
        ]
      : []),
    ...(energyReason ? [`energy     not available: ${energyReason}`] : []),
  ];
  return `${lines.join('\n')}\n\n${notes.join('\n')}\n`;
}
