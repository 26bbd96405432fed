// CLI command implementations over the native binding: `percept generate` and
// `percept bench decode` (wired into commander in app/cli.ts).
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { LlamaModel, type GenerateResult, type LlamaGrammar, type StopReason, type Timings } from '../native/llama.ts';
import { loadActionSchema } from '../nodes/action-schema.ts';
import { SAMPLING, attachSpeculation, type SpeculationFlags } from '../nodes/decoder.ts';
import { resolveModel } from '../models/resolve.ts';
import { EnergyMeter, checkEnergySource, energyJson, type EnergyJson, type EnergySource } from './energy.ts';
import { median } from './stats.ts';

const execFileAsync = promisify(execFile);
const ROOT = resolve(import.meta.dirname ?? new URL('.', import.meta.url).pathname, '..');

/** The CLI's speculation flags with `synth:` specifiers resolved to files. */
async function resolveSpeculation(flags: SpeculationFlags): Promise<SpeculationFlags> {
  return {
    ...flags,
    draft: flags.draft ? await resolveModel(flags.draft, 'decoder') : null,
    draftMtp: flags.draftMtp ? await resolveModel(flags.draftMtp, 'decoder') : null,
  };
}

/** The decoding grammar of an action schema file (--schema), through the same loader the pipeline uses. */
function schemaGrammar(model: LlamaModel, schemaPath: string): LlamaGrammar {
  try {
    return model.grammarFromJsonSchema(loadActionSchema(schemaPath).schema);
  } catch (err) {
    throw new Error(`--schema ${schemaPath}: ${(err as Error).message}`, { cause: err });
  }
}

// ---------------------------------------------------------------------------------------------

export interface GenerateCommandOptions extends SpeculationFlags {
  readonly model: string;
  readonly prompt: string;
  readonly schema?: string;
  readonly maxTokens: number;
  readonly seed: number;
  readonly temperature: number;
  readonly gpuLayers: number;
  /** Streams decoded text pieces (CLI prints them). */
  readonly onToken?: ((piece: string) => void) | undefined;
}

export interface GenerateCommandResult {
  readonly text: string;
  readonly tokens: readonly number[];
  readonly stopReason: StopReason;
  readonly promptTokens: number;
  readonly drafted: number;
  readonly accepted: number;
  readonly forced: number;
  readonly timings: Timings;
}

/** `percept generate`: one prompt through the model (optionally schema-constrained and speculative). */
export async function generate(opts: GenerateCommandOptions): Promise<GenerateCommandResult> {
  if (typeof opts.prompt !== 'string') throw new TypeError('--prompt is required');
  const { maxTokens, gpuLayers } = opts;
  const model = await LlamaModel.load(await resolveModel(opts.model, 'decoder'), { gpuLayers });
  let draft: LlamaModel | undefined;
  try {
    const promptTokens = model.tokenize(opts.prompt, { addSpecial: true }).length;
    const ctx = await model.createContext({ nCtx: Math.max(256, promptTokens + maxTokens + 16), nBatch: Math.max(512, promptTokens) });
    draft = await attachSpeculation(ctx, await resolveSpeculation(opts), gpuLayers);
    const grammar = opts.schema ? schemaGrammar(model, opts.schema) : undefined;
    const onToken = opts.onToken;
    const r: GenerateResult = await ctx.generate([{ text: opts.prompt, addSpecial: true }], {
      maxTokens,
      seed: opts.seed,
      temperature: opts.temperature,
      ...(opts.temperature > 0 ? SAMPLING : {}),
      ...(grammar ? { grammar, jumpForward: true } : {}),
      ...(onToken ? { onTokens: (t: Int32Array) => onToken(model.detokenize(t)) } : {}),
    });
    return {
      text: r.text,
      tokens: r.tokens,
      stopReason: r.stopReason,
      promptTokens: r.promptTokens,
      drafted: r.drafted,
      accepted: r.accepted,
      forced: r.forced,
      timings: r.timings,
    };
  } finally {
    await model.dispose();
    await draft?.dispose();
  }
}

// ---------------------------------------------------------------------------------------------

export interface BenchDecodeOptions extends SpeculationFlags {
  readonly model: string;
  readonly schema?: string;
  readonly promptTokens: number;
  readonly genTokens: number;
  readonly reps: number;
  readonly gpuLayers: number;
  /** CPU threads (absent: one per core, as llama-bench's default). */
  readonly threads?: number;
  /** Also run llama-bench (built from the same llama.cpp tree) and report the ratio. */
  readonly peer?: boolean;
  /** Board-power source sampled during the decode runs (default auto). */
  readonly energy?: EnergySource;
}

export interface BenchDecodeResult {
  readonly model: string;
  readonly threads: number;
  readonly prompt_tokens: number;
  readonly gen_tokens: number;
  readonly reps: number;
  /** Decode tokens per second (after the first token), median over reps. */
  readonly tok_per_s: number;
  readonly tok_per_s_runs: readonly number[];
  readonly prefill_tok_per_s: number;
  readonly ttft_ms: number;
  readonly sample_ms_per_token: number;
  readonly drafted: number;
  readonly accepted: number;
  readonly acceptance: number | null;
  readonly forced: number;
  readonly speculation: string | null;
  /** Board energy over the decode (tg) runs; tok_per_watt = generated tokens per joule. */
  readonly energy: EnergyJson;
  readonly llama_bench_tg_tok_per_s?: number;
  readonly llama_bench_pp_tok_per_s?: number;
  /** ours / llama-bench, decode (tg) and prefill (pp). */
  readonly ratio_tg?: number;
  readonly ratio_pp?: number;
  /** Same ratios from the best rep of each side (less sensitive to a shared, noisy machine). */
  readonly ratio_tg_best?: number;
  readonly ratio_pp_best?: number;
}

/** Seeded pseudo-random token ids (like llama-bench's random prompt), away from special tokens. */
function randomTokens(n: number, nVocab: number, seed: number): number[] {
  let s = seed >>> 0 || 1;
  return Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return 1000 + (s % (nVocab - 2000));
  });
}

/** A llama.cpp program built from the addon's tree (tools/build-native.mjs, PERCEPT_PEERS), or undefined. */
export function findPeerProgram(name: string): string | undefined {
  return [join(ROOT, 'build', 'native', 'bin', name), join(ROOT, 'build', 'native', 'bin', 'Release', name)].find((p) => existsSync(p));
}

function findLlamaBench(): string {
  const path = findPeerProgram('llama-bench');
  if (path) return path;
  throw new Error(
    'llama-bench is not built: cmake --build build/native --target llama-bench (or PERCEPT_PEERS="llama-bench" node tools/build-native.mjs)',
  );
}

interface LlamaBenchRow {
  readonly n_prompt: number;
  readonly n_gen: number;
  readonly avg_ts: number;
}

/**
 * `percept bench decode`. Methodology matches llama-bench: a warm-up run, then `reps` runs;
 * prefill (pp) = promptTokens random tokens decoded from an empty cache; decode (tg) = genTokens
 * tokens one at a time from an empty cache, EOS ignored. Ours also samples (greedy argmax) each
 * token, which llama-bench does not: that cost is part of our loop and stays in the number.
 * Board power is sampled during the decode (tg) runs only (app/energy.ts).
 */
export async function benchDecode(opts: BenchDecodeOptions): Promise<BenchDecodeResult> {
  const { promptTokens, genTokens, reps, gpuLayers } = opts;
  const threads = opts.threads ?? availableParallelism();
  for (const [k, v, min] of [
    ['promptTokens', promptTokens, 1],
    ['genTokens', genTokens, 2],
    ['reps', reps, 1],
  ] as const) {
    if (!Number.isInteger(v) || v < min) throw new RangeError(`bench decode: ${k} must be an integer ≥ ${min}, got ${v}`);
  }
  const energySource = checkEnergySource(opts.energy ?? 'auto');
  const path = await resolveModel(opts.model, 'decoder');
  const model = await LlamaModel.load(path, { gpuLayers });
  let draft: LlamaModel | undefined;
  let meter: EnergyMeter | undefined;
  try {
    const ctx = await model.createContext({
      nCtx: promptTokens + genTokens + 64,
      nBatch: Math.max(512, promptTokens),
      threads,
      flashAttention: 'auto',
    });
    draft = await attachSpeculation(ctx, await resolveSpeculation(opts), gpuLayers);
    const grammar = opts.schema ? schemaGrammar(model, opts.schema) : undefined;
    const { bos, nVocab } = model.info;
    const pp = [bos, ...randomTokens(promptTokens - 1, nVocab, 7)];
    const tgPrompt = [bos];
    const genOpts = { maxTokens: genTokens, ignoreEos: grammar === undefined, ...(grammar ? { grammar, jumpForward: true } : {}) };

    // Warm-up (llama-bench does one too): first-touch of weights, graph allocation.
    ctx.clearCache();
    await ctx.generate([{ tokens: pp }], { maxTokens: 2, ignoreEos: true });
    meter = await EnergyMeter.start({ source: energySource, device: gpuLayers !== 0 ? 'gpu' : 'cpu' });

    // With --peer, llama-bench (one rep each) runs between our reps, so drifting load on a shared
    // machine hits both sides alike; the ratios use medians and best reps.
    const bench = opts.peer ? findLlamaBench() : undefined;
    const peerArgs = [
      '-m',
      path,
      '-p',
      String(promptTokens),
      '-n',
      String(genTokens),
      '-r',
      '1',
      '-o',
      'json',
      '-t',
      String(threads),
      '-ngl',
      String(gpuLayers),
      '-fa',
      'auto',
    ];
    const peerTg: number[] = [];
    const peerPp: number[] = [];
    const ppRuns: number[] = [];
    const tgRuns: number[] = [];
    const ttft: number[] = [];
    const sampleMs: number[] = [];
    let drafted = 0;
    let accepted = 0;
    let forced = 0;
    let generated = 0;
    for (let r = 0; r < reps; r++) {
      if (bench) {
        // The peer process just ran: warm caches again, as llama-bench warms up before measuring.
        ctx.clearCache();
        await ctx.generate([{ tokens: pp }], { maxTokens: 4, ignoreEos: true });
      }
      ctx.clearCache();
      const p = await ctx.generate([{ tokens: pp }], { maxTokens: 1, ignoreEos: true });
      ppRuns.push(p.timings.prefillTokens / (p.timings.prefillMs / 1000));
      ttft.push(p.timings.ttftMs);
      ctx.clearCache();
      meter.begin();
      const g = await ctx.generate([{ tokens: tgPrompt }], genOpts);
      meter.end();
      generated += g.tokens.length;
      tgRuns.push(g.timings.decodeTokens / (g.timings.decodeMs / 1000));
      sampleMs.push(g.timings.sampleMs / Math.max(1, g.tokens.length));
      drafted += g.drafted;
      accepted += g.accepted;
      forced += g.forced;
      if (bench) {
        const { stdout } = await execFileAsync(bench, peerArgs, { maxBuffer: 16 << 20 });
        const rows = JSON.parse(stdout) as LlamaBenchRow[];
        const tgRow = rows.find((x) => x.n_gen > 0 && x.n_prompt === 0);
        const ppRow = rows.find((x) => x.n_prompt > 0 && x.n_gen === 0);
        if (!tgRow || !ppRow) throw new Error(`llama-bench output had no pp/tg rows: ${stdout.slice(0, 400)}`);
        peerTg.push(tgRow.avg_ts);
        peerPp.push(ppRow.avg_ts);
      }
    }
    const speculation = ctx.speculator?.type ?? null;
    const energy = energyJson(await meter.stop(), { tokens: generated });
    await ctx.dispose();
    const result: BenchDecodeResult = {
      model: path,
      threads,
      prompt_tokens: promptTokens,
      gen_tokens: genTokens,
      reps,
      tok_per_s: median(tgRuns),
      tok_per_s_runs: tgRuns,
      prefill_tok_per_s: median(ppRuns),
      ttft_ms: median(ttft),
      sample_ms_per_token: median(sampleMs),
      drafted,
      accepted,
      acceptance: drafted > 0 ? accepted / drafted : null,
      forced,
      speculation,
      energy,
    };
    if (!bench) return result;
    return {
      ...result,
      llama_bench_tg_tok_per_s: median(peerTg),
      llama_bench_pp_tok_per_s: median(peerPp),
      ratio_tg: result.tok_per_s / median(peerTg),
      ratio_pp: result.prefill_tok_per_s / median(peerPp),
      ratio_tg_best: Math.max(...tgRuns) / Math.max(...peerTg),
      ratio_pp_best: Math.max(...ppRuns) / Math.max(...peerPp),
    };
  } finally {
    await meter?.stop();
    await model.dispose();
    await draft?.dispose();
  }
}
