// `percept bench decode`: decode speed of a model, with and without a schema, against llama-bench.
import { execFile } from 'node:child_process';
import { loadavg } from 'node:os';
import { promisify } from 'node:util';
import { ensurePeerProgram, perLayerEmbeddingsArgs } from '../../native/peers.ts';
import { defaultThreads, LlamaModel, type GrammarIndexInfo, type LlamaContext } from '../../native/llama.ts';
import { attachSpeculation, type SpeculationFlags } from '../../nodes/decoder.ts';
import { resolveModel } from '../../models/resolve.ts';
import { EnergyMeter, checkEnergySource, energyJson, type EnergyJson, type EnergySource } from './energy.ts';
import { median, quantile } from '../stats.ts';
import { resolveSpeculation, schemaGbnf } from '../generate.ts';

const execFileAsync = promisify(execFile);

// ---------------------------------------------------------------------------------------------

export interface BenchDecodeOptions extends SpeculationFlags {
  readonly model: string;
  readonly schema?: string;
  readonly promptTokens: number;
  readonly genTokens: number;
  readonly reps: number;
  readonly gpuLayers: number;
  /** CPU threads. Absent: one per core, as llama-bench's default. */
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
  /** Board energy over the decode (tg) runs. Its tok_per_watt is generated tokens per joule. */
  readonly energy: EnergyJson;
  readonly llama_bench_tg_tok_per_s?: number;
  readonly llama_bench_pp_tok_per_s?: number;
  /** Our rate ÷ llama-bench's, for decode and prefill (tg, pp). */
  readonly ratio_tg?: number;
  readonly ratio_pp?: number;
  /** Same ratios from the best rep of each side (less sensitive to a shared, noisy machine). */
  readonly ratio_tg_best?: number;
  readonly ratio_pp_best?: number;
  /** With --schema: structured-action decoding against unconstrained decoding in the same run. */
  readonly structured?: StructuredDecodeResult;
}

/** Percentiles of a sample (µs). */
export interface Spread {
  readonly p50: number;
  readonly p99: number;
}

export interface StructuredDecodeResult {
  readonly schema: string;
  /** Actions per rep, one seeded random prompt each. Every arm decodes the same prompts. */
  readonly actions_per_rep: number;
  /** The grammar's token index, or null with the reason in `fallback` (decoding then checks the whole vocabulary). */
  readonly index: GrammarIndexInfo | null;
  readonly fallback: string | null;
  /** Worst-case tokens of a complete action (the decoder's default token budget). */
  readonly max_tokens: number | null;
  readonly tokens_per_action: number;
  /** Actions decoded through the index that did not end complete, with a stop reason other than eos. Must be 0. */
  readonly incomplete: number;
  /** Decode tokens/s, median over reps: constrained with and without jump-forward, unconstrained, and the
   * old path. Unconstrained decodes the same lengths, EOS ignored. The old path is llama.cpp's whole-vocabulary check. */
  readonly tok_per_s: {
    readonly jump_forward: number;
    readonly constrained: number;
    readonly unconstrained: number;
    readonly full_vocab_check: number;
  };
  /** Constrained ÷ unconstrained tok/s, the grammar's cost, also with jump-forward. Each is the median of
   * per-prompt ratios, since one prompt's arms run back to back and load drift cancels out. */
  readonly ratio: number;
  readonly ratio_jump_forward: number;
  /** Sampling step cost per token in µs: under the grammar's index, unconstrained, and on the old path. */
  readonly sample_us: { readonly grammar: Spread; readonly unconstrained: Spread; readonly full_vocab_check: Spread };
  /** Tokens jump-forward appended without their own decode, per action, and as a share of all tokens. */
  readonly forced_per_action: number;
  readonly decode_steps_saved: number;
  /** With a speculator, over the constrained arms: drafts verified, accepted, and cut by the grammar before verification. */
  readonly drafts: { readonly drafted: number; readonly accepted: number; readonly cut: number };
  /** 1/5/15-minute load averages at start and end (a shared machine). */
  readonly loadavg: { readonly start: readonly number[]; readonly end: readonly number[] };
}

const spread = (xs: readonly number[]): Spread => ({ p50: quantile(xs, 0.5), p99: quantile(xs, 0.99) });

type Arm = 'jump_forward' | 'constrained' | 'unconstrained' | 'full_vocab_check';
const ARMS: readonly Arm[] = ['jump_forward', 'constrained', 'unconstrained', 'full_vocab_check'];

/**
 * Structured actions against free decoding, interleaved on the same prompts. Per prompt the four
 * arms run in a rotating order, so drifting load on a shared machine hits them alike.
 * Unconstrained decodes as many tokens as the constrained run of the same prompt produced.
 */
async function benchStructured(
  ctx: LlamaContext,
  model: LlamaModel,
  schemaPath: string,
  promptTokens: number,
  reps: number,
): Promise<StructuredDecodeResult> {
  const start = loadavg();
  const gbnf = schemaGbnf(schemaPath);
  const grammar = await model.grammar(gbnf);
  // The same grammar without an index, as llama.cpp checks it: what decoding cost before the index.
  const fullVocab = await model.grammar(gbnf, 'root', { maxStates: 1 });
  const actions = 8;
  const sums = new Map<Arm, { tokens: number; ms: number }[]>(ARMS.map((a) => [a, []]));
  const sampleUs = new Map<Arm, number[]>(ARMS.map((a) => [a, []]));
  let tokens = 0;
  let forced = 0;
  let incomplete = 0;
  const drafts = { drafted: 0, accepted: 0, cut: 0 };
  const ratios: number[] = [];
  const ratiosJumpForward: number[] = [];
  for (let rep = 0; rep < reps; rep++) {
    const acc = new Map<Arm, { tokens: number; ms: number }>(ARMS.map((a) => [a, { tokens: 0, ms: 0 }]));
    for (let i = 0; i < actions; i++) {
      const prompt = [{ tokens: [model.info.bos, ...randomTokens(promptTokens - 1, model.info.nVocab, 100 + i)] }];
      let length = 0;
      const promptTps = new Map<Arm, number>();
      const order = ARMS.map((_, k) => ARMS[(k + i + rep) % ARMS.length]!);
      // unconstrained decodes as many tokens as the constrained arm: it runs after it
      order.sort((a, b) => Number(a === 'unconstrained') - Number(b === 'unconstrained'));
      for (const arm of order) {
        ctx.clearCache();
        const r = await ctx.generate(prompt, {
          recordSampleTimes: true,
          ...(arm === 'unconstrained'
            ? { maxTokens: length, ignoreEos: true }
            : arm === 'full_vocab_check'
              ? // llama.cpp's check lets the model spell forced text its own way: the index's bound does not hold there
                { maxTokens: 512, grammar: fullVocab, jumpForward: true }
              : { maxTokens: grammar.worstCaseTokens ?? 512, grammar, jumpForward: arm === 'jump_forward' }),
        });
        const a = acc.get(arm)!;
        a.tokens += r.timings.decodeTokens;
        a.ms += r.timings.decodeMs;
        promptTps.set(arm, r.timings.decodeTokens / r.timings.decodeMs);
        sampleUs.get(arm)!.push(...(r.sampleUs ?? []));
        if (arm === 'constrained') length = r.tokens.length;
        if (arm === 'constrained' || arm === 'jump_forward') {
          if (r.stopReason !== 'eos') incomplete++;
          drafts.drafted += r.drafted;
          drafts.accepted += r.accepted;
          drafts.cut += r.draftsCut;
        }
        if (arm === 'jump_forward') {
          tokens += r.tokens.length;
          forced += r.forced;
        }
      }
      ratios.push(promptTps.get('constrained')! / promptTps.get('unconstrained')!);
      ratiosJumpForward.push(promptTps.get('jump_forward')! / promptTps.get('unconstrained')!);
    }
    for (const arm of ARMS) sums.get(arm)!.push(acc.get(arm)!);
  }
  const tps = (arm: Arm): number => median(sums.get(arm)!.map((x) => x.tokens / (x.ms / 1000)));
  const n = reps * actions;
  return {
    schema: schemaPath,
    actions_per_rep: actions,
    index: grammar.index,
    fallback: grammar.fallback,
    max_tokens: grammar.worstCaseTokens,
    tokens_per_action: tokens / n,
    incomplete,
    tok_per_s: {
      jump_forward: tps('jump_forward'),
      constrained: tps('constrained'),
      unconstrained: tps('unconstrained'),
      full_vocab_check: tps('full_vocab_check'),
    },
    ratio: median(ratios),
    ratio_jump_forward: median(ratiosJumpForward),
    sample_us: {
      grammar: spread([...sampleUs.get('constrained')!, ...sampleUs.get('jump_forward')!]),
      unconstrained: spread(sampleUs.get('unconstrained')!),
      full_vocab_check: spread(sampleUs.get('full_vocab_check')!),
    },
    forced_per_action: forced / n,
    decode_steps_saved: tokens > 0 ? forced / tokens : 0,
    drafts,
    loadavg: { start, end: loadavg() },
  };
}

/** Seeded pseudo-random token ids (like llama-bench's random prompt), away from special tokens. */
export function randomTokens(n: number, nVocab: number, seed: number): number[] {
  let s = seed >>> 0 || 1;
  return Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return 1000 + (s % (nVocab - 2000));
  });
}

interface LlamaBenchRow {
  readonly n_prompt: number;
  readonly n_gen: number;
  readonly avg_ts: number;
}

/**
 * `percept bench decode`, with llama-bench's method: a warm-up run, then `reps` runs from an empty cache.
 *   prefill (pp)  promptTokens random tokens decoded;
 *   decode (tg)   genTokens tokens one at a time, EOS ignored.
 * Ours also samples each token by greedy argmax, which llama-bench does not. That cost stays in the number.
 * Board power is sampled during the decode runs only (app/bench/energy.ts).
 */
export async function benchDecode(opts: BenchDecodeOptions): Promise<BenchDecodeResult> {
  const { promptTokens, genTokens, reps, gpuLayers } = opts;
  const threads = opts.threads ?? defaultThreads();
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
    // With --schema an action may take up to the grammar's worst case (a few hundred tokens at most for bounded schemas).
    const ctx = await model.createContext({
      nCtx: promptTokens + Math.max(genTokens, opts.schema ? 1024 : 0) + 64,
      nBatch: Math.max(512, promptTokens),
      threads,
      flashAttention: 'auto',
    });
    draft = await attachSpeculation(ctx, await resolveSpeculation(opts), gpuLayers);
    const { bos, nVocab } = model.info;
    const pp = [bos, ...randomTokens(promptTokens - 1, nVocab, 7)];
    const tgPrompt = [bos];
    const genOpts = { maxTokens: genTokens, ignoreEos: true };

    // Warm-up, as llama-bench does too: first-touch of weights, graph allocation.
    ctx.clearCache();
    await ctx.generate([{ tokens: pp }], { maxTokens: 2, ignoreEos: true });
    meter = await EnergyMeter.start({ source: energySource, device: gpuLayers !== 0 ? 'gpu' : 'cpu' });

    // With --peer, one llama-bench rep runs between our reps, so drifting load on a shared
    // machine hits both sides alike. The ratios use medians and best reps.
    const bench = opts.peer ? await ensurePeerProgram('llama-bench', (msg) => process.stderr.write(`percept: ${msg}\n`)) : undefined;
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
      ...perLayerEmbeddingsArgs(model.info.perLayerEmbeddingsOnGpu),
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
    const structured = opts.schema ? await benchStructured(ctx, model, opts.schema, promptTokens, reps) : undefined;
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
      ...(structured ? { structured } : {}),
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
