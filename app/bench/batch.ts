// `percept bench batch`: the batched decoder alone, measured as llama.cpp's llama-batched-bench does,
// so the two compare on the same GGUF. B sequences run at once, each a random P-token prompt and T new tokens.
// Ours runs B concurrent generate() calls on one context. Its BatchScheduler makes each step one llama_decode
// over all of them, and takes every row's argmax in llama.cpp's graph (--backend-sampling off: on the host).
// The peer decodes the same shapes with no sampling at all.
// With --peer, llama-batched-bench from the same llama.cpp tree runs right after ours for each B.
import { execFile } from 'node:child_process';
import { loadavg } from 'node:os';
import { promisify } from 'node:util';
import { LlamaModel } from '../../native/llama.ts';
import { resolveModel } from '../../models/resolve.ts';
import { randomTokens } from './decode.ts';
import { ensurePeerProgram, perLayerEmbeddingsArgs } from '../../native/peers.ts';

const execFileAsync = promisify(execFile);

export interface BenchBatchOptions {
  readonly model: string;
  /** Sequence counts to measure, e.g. [1, 4, 8, 16]. */
  readonly sequences: readonly number[];
  readonly promptTokens: number;
  readonly genTokens: number;
  readonly gpuLayers: number;
  readonly kvUnified?: boolean;
  readonly threads?: number;
  /** Gemma 4's per-layer embedding table on the GPU, 'on' or 'off' (default: on when every layer is offloaded). */
  readonly perLayerEmbeddingsOnGpu?: 'on' | 'off';
  /** Greedy argmax in llama.cpp's graph (ContextOptions.backendSampling), 'on' (default) or 'off' (on the host). */
  readonly backendSampling?: 'on' | 'off';
  /** Also run llama-batched-bench and report the ratios. */
  readonly peer?: boolean;
}

export interface BatchRow {
  readonly sequences: number;
  /** New tokens per second over all sequences, from the last first token to the end. */
  readonly tg_tok_per_s: number;
  /** Prompt and new tokens per second over the whole run (llama-batched-bench's S). */
  readonly total_tok_per_s: number;
  /** Batched steps the slowest sequence took part in. */
  readonly steps: number;
  /** Per step of ours: llama_decode and its synchronize (the slowest sequence's share of the shared decodes), and
   * the sampling of every sequence's row; the rest of a step is the scheduler's own work. */
  readonly decode_ms_per_step: number;
  readonly sample_ms_per_step: number;
  readonly peer_tg_tok_per_s?: number;
  readonly peer_total_tok_per_s?: number;
  readonly ratio_tg?: number;
}

export interface BenchBatchResult {
  readonly model: string;
  readonly prompt_tokens: number;
  readonly gen_tokens: number;
  readonly kv_unified: boolean;
  /** Whether the per-layer embedding table went to the GPU (LlamaModel info); the peer's `-ot` puts it there too. */
  readonly per_layer_embeddings_on_gpu: boolean;
  /** Whether every sequence's tokens were taken in llama.cpp's graph (backendSampling); false: greedy on the host. */
  readonly backend_sampling: boolean;
  readonly rows: readonly BatchRow[];
  readonly loadavg: { readonly start: number[]; readonly end: number[] };
}

/** The peer's row for (pp, tg, pl), or undefined. */
interface PeerRow {
  readonly pl: number;
  readonly speed_tg: number;
  readonly speed: number;
}

export async function benchBatch(opts: BenchBatchOptions): Promise<BenchBatchResult> {
  const sequences = [...opts.sequences].sort((a, b) => a - b);
  if (sequences.length === 0 || sequences.some((n) => !(Number.isInteger(n) && n >= 1 && n <= 256)))
    throw new RangeError(`--sequences must be integers in [1, 256], got ${opts.sequences.join(',')}`);
  const { promptTokens: pp, genTokens: tg } = opts;
  const path = await resolveModel(opts.model, 'decoder');
  const start = loadavg();
  const model = await LlamaModel.load(path, {
    gpuLayers: opts.gpuLayers,
    ...(opts.perLayerEmbeddingsOnGpu !== undefined ? { perLayerEmbeddingsOnGpu: opts.perLayerEmbeddingsOnGpu === 'on' } : {}),
  });
  const perLayerEmbeddingsOnGpu = model.info.perLayerEmbeddingsOnGpu;
  const maxSeq = sequences.at(-1)!;
  const nCtx = pp + tg + 8;
  const nBatch = Math.max(2048, maxSeq);
  const rows: BatchRow[] = [];
  let backendSampled = true;
  try {
    const ctx = await model.createContext({
      nCtx,
      nBatch,
      nUbatch: 512,
      nSeq: Math.max(2, maxSeq),
      prefillChunk: nBatch,
      kvUnified: opts.kvUnified ?? false,
      backendSampling: opts.backendSampling !== 'off',
      ...(opts.threads !== undefined ? { threads: opts.threads } : {}),
    });
    const run = async (n: number) => {
      for (let s = 0; s < ctx.info.nSeq; s++) ctx.clearCache(s);
      const t0 = performance.now();
      const results = await Promise.all(
        Array.from({ length: n }, (_, s) =>
          ctx.generate([{ tokens: randomTokens(pp, model.info.nVocab, 1 + s) }], { maxTokens: tg, ignoreEos: true, seq: s }),
        ),
      );
      const totalMs = performance.now() - t0;
      const lastFirstMs = Math.max(...results.map((r) => r.timings.ttftMs));
      backendSampled &&= results.every((r) => r.batch?.backendSampled === true);
      const slowest = results.reduce((a, b) => ((b.batch?.steps ?? 0) > (a.batch?.steps ?? 0) ? b : a));
      const calls = Math.max(1, slowest.timings.decodeCalls);
      return {
        tg: (n * (tg - 1)) / ((totalMs - lastFirstMs) / 1000),
        total: (n * (pp + tg)) / (totalMs / 1000),
        steps: slowest.batch?.steps ?? 0,
        decodeMsPerStep: slowest.timings.llamaDecodeMs / calls,
        sampleMsPerStep: results.reduce((sum, r) => sum + r.timings.sampleMs, 0) / calls,
      };
    };
    await run(Math.min(2, maxSeq)); // warm-up: first touch of the weights, graph allocation
    const peer = opts.peer ? await ensurePeerProgram('llama-batched-bench', (msg) => process.stderr.write(`percept: ${msg}\n`)) : undefined;
    for (const n of sequences) {
      const ours = await run(n);
      const row: BatchRow = {
        sequences: n,
        tg_tok_per_s: round(ours.tg),
        total_tok_per_s: round(ours.total),
        steps: ours.steps,
        decode_ms_per_step: round2(ours.decodeMsPerStep),
        sample_ms_per_step: round2(ours.sampleMsPerStep),
      };
      if (!peer) {
        rows.push(row);
        continue;
      }
      const args = ['-m', path, '-c', String(nCtx * n), '-b', String(nBatch), '-ub', '512', '-npp', String(pp), '-ntg', String(tg)];
      args.push('-npl', String(n), '-ngl', String(opts.gpuLayers), '--output-format', 'jsonl');
      if (opts.kvUnified) args.push('-kvu');
      args.push(...perLayerEmbeddingsArgs(perLayerEmbeddingsOnGpu));
      if (opts.threads !== undefined) args.push('-t', String(opts.threads));
      const { stdout, stderr } = await execFileAsync(peer, args, { maxBuffer: 16 << 20 });
      const line = `${stdout}\n${stderr}`.split('\n').find((l) => l.startsWith('{') && l.includes('"speed_tg"'));
      if (!line) throw new Error(`llama-batched-bench printed no result row: ${stderr.slice(-400)}`);
      const p = JSON.parse(line) as PeerRow;
      rows.push({
        ...row,
        peer_tg_tok_per_s: round(p.speed_tg),
        peer_total_tok_per_s: round(p.speed),
        ratio_tg: round(ours.tg / p.speed_tg),
      });
    }
  } finally {
    await model.dispose();
  }
  return {
    model: opts.model,
    prompt_tokens: pp,
    gen_tokens: tg,
    kv_unified: opts.kvUnified ?? false,
    per_layer_embeddings_on_gpu: perLayerEmbeddingsOnGpu,
    backend_sampling: backendSampled,
    rows,
    loadavg: { start, end: loadavg() },
  };
}

const round = (x: number): number => Math.round(x * 10) / 10;
const round2 = (x: number): number => Math.round(x * 100) / 100;
