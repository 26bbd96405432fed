// CLI command implementations over the native binding: `percept generate` and
// `percept bench decode` (wired into commander in app/cli.ts).
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { ADDON_PATH } from '../native/binding.ts';
import { defaultThreads, LlamaModel, type GenerateResult, type LlamaGrammar, type StopReason, type Timings } from '../native/llama.ts';
import { attachSpeculation, type SpeculationFlags } from '../nodes/decoder.ts';
import { resolveModelSpec } from '../models/synth.ts';

const execFileAsync = promisify(execFile);

/** The CLI's speculation flags with `synth:` specifiers resolved to files. */
async function resolveSpeculation(flags: SpeculationFlags): Promise<SpeculationFlags> {
  return {
    ...flags,
    draft: flags.draft ? await resolveModelSpec(flags.draft) : null,
    draftMtp: flags.draftMtp ? await resolveModelSpec(flags.draftMtp) : null,
  };
}

async function loadSchemaGrammar(model: LlamaModel, schemaPath: string): Promise<LlamaGrammar> {
  let text: string;
  try {
    text = await readFile(schemaPath, 'utf8');
  } catch (err) {
    throw new Error(`--schema ${schemaPath}: ${(err as Error).message}`);
  }
  try {
    return model.grammarFromJsonSchema(JSON.parse(text) as object);
  } catch (err) {
    throw new Error(`--schema ${schemaPath}: ${(err as Error).message}`);
  }
}

// ---------------------------------------------------------------------------------------------

export interface GenerateCommandOptions extends SpeculationFlags {
  readonly model: string;
  readonly prompt: string;
  readonly schema?: string;
  readonly maxTokens?: number;
  readonly seed?: number;
  readonly temperature?: number;
  readonly gpuLayers?: number;
  readonly jumpForward?: boolean;
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
  const maxTokens = opts.maxTokens ?? 128;
  const gpuLayers = opts.gpuLayers ?? 0;
  const model = await LlamaModel.load(await resolveModelSpec(opts.model), { gpuLayers });
  let draft: LlamaModel | undefined;
  try {
    const promptTokens = model.tokenize(opts.prompt, { addSpecial: true }).length;
    const ctx = await model.createContext({ nCtx: Math.max(256, promptTokens + maxTokens + 16), nBatch: Math.max(512, promptTokens) });
    draft = await attachSpeculation(ctx, await resolveSpeculation(opts), gpuLayers);
    const grammar = opts.schema ? await loadSchemaGrammar(model, opts.schema) : undefined;
    const onToken = opts.onToken;
    const r: GenerateResult = await ctx.generate([{ text: opts.prompt, addSpecial: true }], {
      maxTokens,
      seed: opts.seed ?? 1,
      temperature: opts.temperature ?? 0,
      ...(opts.temperature ? { topK: 40, topP: 0.95 } : {}),
      ...(grammar ? { grammar, jumpForward: opts.jumpForward ?? true } : {}),
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
  readonly promptTokens?: number;
  readonly genTokens?: number;
  readonly reps?: number;
  readonly gpuLayers?: number;
  readonly threads?: number;
  /** Also run llama-bench (built from the same llama.cpp tree) and report the ratio. */
  readonly peer?: boolean;
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
  readonly llama_bench_tg_tok_per_s?: number;
  readonly llama_bench_pp_tok_per_s?: number;
  /** ours / llama-bench, decode (tg) and prefill (pp). */
  readonly ratio_tg?: number;
  readonly ratio_pp?: number;
  /** Same ratios from the best rep of each side (less sensitive to a shared, noisy machine). */
  readonly ratio_tg_best?: number;
  readonly ratio_pp_best?: number;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** Seeded pseudo-random token ids (like llama-bench's random prompt), away from special tokens. */
function randomTokens(n: number, nVocab: number, seed: number): number[] {
  let s = seed >>> 0 || 1;
  return Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return 1000 + (s % (nVocab - 2000));
  });
}

/** llama-bench from the addon's own build (PERCEPT_NATIVE may point at another build than build/native). */
function findLlamaBench(): string {
  const buildDir = dirname(dirname(ADDON_PATH));
  for (const p of [join(buildDir, 'bin', 'llama-bench'), join(buildDir, 'bin', 'Release', 'llama-bench')]) {
    if (existsSync(p)) return p;
  }
  throw new Error(`llama-bench is not built in ${buildDir}: cmake --build ${buildDir} --target llama-bench (or PERCEPT_PEERS="llama-bench" node tools/build-native.mjs)`);
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
 */
export async function benchDecode(opts: BenchDecodeOptions): Promise<BenchDecodeResult> {
  const promptTokens = opts.promptTokens ?? 64;
  const genTokens = opts.genTokens ?? 128;
  const reps = opts.reps ?? 3;
  const gpuLayers = opts.gpuLayers ?? 0;
  const threads = opts.threads ?? defaultThreads();
  for (const [k, v, min] of [['promptTokens', promptTokens, 1], ['genTokens', genTokens, 2], ['reps', reps, 1]] as const) {
    if (!Number.isInteger(v) || v < min) throw new RangeError(`bench decode: ${k} must be an integer ≥ ${min}, got ${v}`);
  }
  const path = await resolveModelSpec(opts.model);
  const model = await LlamaModel.load(path, { gpuLayers });
  let draft: LlamaModel | undefined;
  try {
    const ctx = await model.createContext({ nCtx: promptTokens + genTokens + 64, nBatch: Math.max(512, promptTokens), threads, flashAttention: 'auto' });
    draft = await attachSpeculation(ctx, await resolveSpeculation(opts), gpuLayers);
    const grammar = opts.schema ? await loadSchemaGrammar(model, opts.schema) : undefined;
    const { bos, nVocab } = model.info;
    const pp = [bos, ...randomTokens(promptTokens - 1, nVocab, 7)];
    const tgPrompt = [bos];
    const genOpts = { maxTokens: genTokens, ignoreEos: grammar === undefined, ...(grammar ? { grammar, jumpForward: true } : {}) };

    // Warm-up (llama-bench does one too): first-touch of weights, graph allocation.
    ctx.clearCache();
    await ctx.generate([{ tokens: pp }], { maxTokens: 2, ignoreEos: true });

    // With --peer, llama-bench (one rep each) runs between our reps, so drifting load on a shared
    // machine hits both sides alike; the ratios use medians and best reps.
    const bench = opts.peer ? findLlamaBench() : undefined;
    const peerArgs = ['-m', path, '-p', String(promptTokens), '-n', String(genTokens), '-r', '1', '-o', 'json', '-t', String(threads), '-ngl', String(gpuLayers), '-fa', 'auto'];
    const peerTg: number[] = [];
    const peerPp: number[] = [];
    const ppRuns: number[] = [];
    const tgRuns: number[] = [];
    const ttft: number[] = [];
    const sampleMs: number[] = [];
    let drafted = 0;
    let accepted = 0;
    let forced = 0;
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
      const g = await ctx.generate([{ tokens: tgPrompt }], genOpts);
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
    await model.dispose();
    await draft?.dispose();
  }
}
