// The rungs of a deployment ladder: an unquantized reference GGUF re-quantized into Q8_0, Q4_0 or Q4_K_M.
// llama-quantize or percept's own quantizer makes them. A stamp lets an interrupted ladder resume.
// Quantizers and stamps: models/README.md#quantized-rungs
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, open, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { Worker } from 'node:worker_threads';
import { GGUFWriter, readGGUF, u32, type GGUFFile } from './gguf.ts';
import { GGMLType, dequantize, ggmlTypeName, quantize, type CodecType } from './quant.ts';
import { chooseTypes, type WeightType } from './synth.ts';

export const LADDER_QUANTS = ['q8_0', 'q4_0', 'q4_k_m'] as const;
export type LadderQuant = (typeof LADDER_QUANTS)[number];

interface QuantInfo {
  /** The name llama.cpp prints and llama-quantize takes. */
  readonly label: string;
  /** The mix of synth.ts's chooseTypes. */
  readonly wtype: WeightType;
  /** general.file_type (llama_ftype). */
  readonly fileType: number;
}

export const QUANT_INFO: Readonly<Record<LadderQuant, QuantInfo>> = {
  q8_0: { label: 'Q8_0', wtype: 'q8_0', fileType: 7 },
  q4_0: { label: 'Q4_0', wtype: 'q4_0', fileType: 2 },
  q4_k_m: { label: 'Q4_K_M', wtype: 'q4_k', fileType: 15 },
};

/** llama_ftype names (llama.h) of the file types a ladder meets, for labelling a checkpoint. */
const FILE_TYPE_LABELS: Readonly<Record<number, string>> = {
  0: 'F32',
  1: 'F16',
  2: 'Q4_0',
  3: 'Q4_1',
  7: 'Q8_0',
  8: 'Q5_0',
  9: 'Q5_1',
  10: 'Q2_K',
  11: 'Q3_K_S',
  12: 'Q3_K_M',
  13: 'Q3_K_L',
  14: 'Q4_K_S',
  15: 'Q4_K_M',
  16: 'Q5_K_S',
  17: 'Q5_K_M',
  18: 'Q6_K',
  32: 'BF16',
  38: 'MXFP4_MOE',
};

/** A checkpoint's llama_ftype name (general.file_type), e.g. 'Q4_K_M'. */
export function fileTypeLabel(file: GGUFFile): string {
  const ft = file.get('general.file_type');
  if (typeof ft !== 'number') return 'unknown type';
  return FILE_TYPE_LABELS[ft] ?? `file type ${ft}`;
}

export function checkLadderQuant(name: unknown): LadderQuant {
  const q = typeof name === 'string' ? name.toLowerCase() : name;
  if (typeof q !== 'string' || !(LADDER_QUANTS as readonly string[]).includes(q)) {
    throw new RangeError(`unknown quantization ${JSON.stringify(name)}; expected one of: ${LADDER_QUANTS.join(', ')}`);
  }
  return q as LadderQuant;
}

export const QUANTIZERS = ['percept', 'llama-quantize'] as const;
export type QuantizerKind = (typeof QUANTIZERS)[number];

/** Types a reference's weights may be stored in: the ladder quantizes from full precision only. */
const SOURCE_TYPES: ReadonlySet<number> = new Set([GGMLType.F32, GGMLType.F16, GGMLType.BF16]);

/**
 * The reference's header, checked. Its weights must be unquantized, and it needs a block count to place the layers of the mix.
 * Re-quantizing a quantized file stacks two errors, and would make its agreement meaningless.
 */
export async function readReference(path: string): Promise<GGUFFile> {
  const file = await readGGUF(path);
  const quantized = file.tensors.find((t) => !SOURCE_TYPES.has(t.type));
  if (quantized) {
    throw new Error(
      `${path}: the reference must be unquantized (F32, F16 or BF16 weights) but tensor '${quantized.name}' is ${ggmlTypeName(quantized.type)}`,
    );
  }
  const arch = file.get('general.architecture');
  if (typeof arch !== 'string' || typeof file.get(`${arch}.block_count`) !== 'number') {
    throw new Error(`${path}: no general.architecture and <arch>.block_count: not a llama.cpp model checkpoint`);
  }
  return file;
}

// ---------------------------------------------------------------------------------------------------------
// Block conversion (runs in the workers)

/** `n` values stored as `srcType` (F32, F16 or BF16) → floats. */
function toFloats(bytes: Uint8Array, srcType: number, n: number): Float32Array {
  switch (srcType) {
    case GGMLType.F32:
    case GGMLType.F16:
      return dequantize(srcType, bytes, n);
    case GGMLType.BF16: {
      // bf16 is the top half of an f32.
      const out = new Float32Array(n);
      const bits = new Uint32Array(out.buffer);
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      for (let i = 0; i < n; i++) bits[i] = view.getUint16(i * 2, true) << 16;
      return out;
    }
    default:
      throw new RangeError(`cannot read ${ggmlTypeName(srcType)} weights (expected F32, F16 or BF16)`);
  }
}

/** Re-encodes `n` values from `srcType` to `dstType` (a type models/quant.ts can write). */
export function convertBlocks(bytes: Uint8Array, srcType: number, dstType: number, n: number): Uint8Array {
  return quantize(dstType as CodecType, toFloats(bytes, srcType, n));
}

export interface ConvertJob {
  readonly offset: number;
  readonly byteLength: number;
  readonly srcType: number;
  readonly dstType: number;
  readonly n: number;
}

// ---------------------------------------------------------------------------------------------------------
// Worker pool

type PoolReply = { readonly id: number; readonly data: Uint8Array } | { readonly id: number; readonly error: string };

/** Worker threads that each read a range of the source file and convert it (quantize-rungs.worker.ts). */
class ConvertPool {
  readonly size: number;
  readonly #workers: Worker[] = [];
  readonly #idle: Worker[] = [];
  readonly #queue: { job: ConvertJob; id: number }[] = [];
  readonly #pending = new Map<number, { resolve: (d: Uint8Array) => void; reject: (e: Error) => void }>();
  #nextId = 0;
  #failure: Error | undefined;

  constructor(sourcePath: string, size: number) {
    this.size = size;
    for (let i = 0; i < size; i++) {
      const w = new Worker(new URL('./quantize-rungs.worker.mjs', import.meta.url), { workerData: { sourcePath } });
      w.on('message', (msg: PoolReply) => {
        const p = this.#pending.get(msg.id);
        this.#pending.delete(msg.id);
        if ('error' in msg) p?.reject(new Error(msg.error));
        else p?.resolve(msg.data);
        this.#idle.push(w);
        this.#dispatch();
      });
      w.on('error', (err) => this.#fail(new Error(`quantizer worker failed: ${err.message}`, { cause: err })));
      w.on('exit', (code) => {
        if (code !== 0) this.#fail(new Error(`quantizer worker exited with code ${code}`));
      });
      this.#workers.push(w);
      this.#idle.push(w);
    }
  }

  run(job: ConvertJob): Promise<Uint8Array> {
    if (this.#failure) return Promise.reject(this.#failure);
    const id = this.#nextId++;
    const p = new Promise<Uint8Array>((resolve, reject) => this.#pending.set(id, { resolve, reject }));
    this.#queue.push({ job, id });
    this.#dispatch();
    return p;
  }

  #dispatch(): void {
    while (this.#idle.length > 0 && this.#queue.length > 0) {
      const { job, id } = this.#queue.shift()!;
      this.#idle.pop()!.postMessage({ id, ...job });
    }
  }

  #fail(err: Error): void {
    this.#failure ??= err;
    for (const p of this.#pending.values()) p.reject(this.#failure);
    this.#pending.clear();
    this.#queue.length = 0;
  }

  async close(): Promise<void> {
    this.#failure ??= new Error('quantizer pool closed');
    await Promise.all(this.#workers.map((w) => w.terminate()));
  }
}

/** Elements per conversion job: big enough to amortize a message, small enough to spread a tensor. */
const JOB_ELEMENTS = 1 << 21;
const COPY_CHUNK = 4 << 20;

// ---------------------------------------------------------------------------------------------------------
// percept's quantizer

export interface QuantizeOptions {
  readonly source: string;
  readonly out: string;
  readonly quant: LadderQuant;
  /** Worker threads (default: every core). */
  readonly workers?: number;
  readonly onProgress?: (bytesWritten: number, totalBytes: number) => void;
}

/** Writes `source` re-quantized as `quant`: same metadata (file type updated), same tensors in the same order. */
export async function quantizeGGUF(options: QuantizeOptions): Promise<{ path: string; bytes: number }> {
  const quant = checkLadderQuant(options.quant);
  const info = QUANT_INFO[quant];
  const workers = options.workers ?? availableParallelism();
  if (!Number.isInteger(workers) || workers < 1) throw new RangeError(`workers must be an integer ≥ 1, got ${String(workers)}`);
  const src = await readReference(options.source);
  const layers = src.get(`${String(src.get('general.architecture'))}.block_count`) as number;
  const types = chooseTypes(src.tensors, info.wtype, layers);

  const w = new GGUFWriter({ alignment: src.alignment });
  for (const kv of src.kvs) {
    // A synthetic checkpoint's stamp describes the source's bytes, not these.
    if (kv.key === 'general.alignment' || kv.key.startsWith('percept.synth.')) continue;
    w.set(kv.key, kv.key === 'general.file_type' ? u32(info.fileType) : kv.asValue());
  }
  if (!src.kv('general.file_type')) w.set('general.file_type', u32(info.fileType));
  if (!src.kv('general.quantization_version')) w.set('general.quantization_version', u32(2));
  src.tensors.forEach((t, i) => w.addTensor({ name: t.name, type: types[i]!, shape: t.shape }));

  const pool = new ConvertPool(resolve(options.source), workers);
  const fh = await open(options.source, 'r');
  try {
    const copy = async function* (offset: number, length: number): AsyncGenerator<Uint8Array> {
      for (let done = 0; done < length; done += COPY_CHUNK) {
        const n = Math.min(COPY_CHUNK, length - done);
        const buf = Buffer.allocUnsafe(n);
        const { bytesRead } = await fh.read(buf, 0, n, offset + done);
        if (bytesRead !== n) throw new Error(`${options.source}: truncated at byte ${offset + done + bytesRead}`);
        yield buf;
      }
    };
    // Jobs of whole rows, converted in order with a bounded number in flight.
    const convert = async function* (jobs: ConvertJob[]): AsyncGenerator<Uint8Array> {
      const inFlight: Promise<Uint8Array>[] = [];
      let next = 0;
      const submit = () => {
        const p = pool.run(jobs[next++]!);
        p.catch(() => undefined); // awaited in order below; a failure surfaces there
        inFlight.push(p);
      };
      while (next < jobs.length && inFlight.length < 2 * pool.size) submit();
      while (inFlight.length > 0) {
        const data = await inFlight.shift()!;
        if (next < jobs.length) submit();
        yield data;
      }
    };
    return await w.write(
      options.out,
      (planned, i) => {
        const t = src.tensors[i]!;
        const offset = src.dataOffset + t.offset;
        if (planned.type === t.type) return copy(offset, t.byteLength);
        const rowElements = t.shape[0]!;
        const rows = t.shape.slice(1).reduce((a, b) => a * b, 1);
        const rowBytes = t.byteLength / rows;
        const rowsPerJob = Math.max(1, Math.floor(JOB_ELEMENTS / rowElements));
        const jobs: ConvertJob[] = [];
        for (let r = 0; r < rows; r += rowsPerJob) {
          const nRows = Math.min(rowsPerJob, rows - r);
          jobs.push({
            offset: offset + r * rowBytes,
            byteLength: nRows * rowBytes,
            srcType: t.type,
            dstType: planned.type,
            n: nRows * rowElements,
          });
        }
        return convert(jobs);
      },
      options.onProgress ? { onProgress: options.onProgress } : {},
    );
  } finally {
    await fh.close();
    await pool.close();
  }
}

// ---------------------------------------------------------------------------------------------------------
// llama-quantize

export interface LlamaQuantizeOptions {
  readonly binary: string;
  readonly source: string;
  readonly out: string;
  readonly quant: LadderQuant;
  readonly threads?: number;
  /** Tensors done of the total, from its `[ i/ n]` lines. */
  readonly onProgress?: (done: number, total: number) => void;
}

/** Runs `llama-quantize SOURCE OUT TYPE THREADS` into a temporary file, renamed into place when it succeeds. */
export async function runLlamaQuantize(options: LlamaQuantizeOptions): Promise<{ path: string; bytes: number }> {
  const quant = checkLadderQuant(options.quant);
  await readReference(options.source);
  const tmp = `${options.out}.tmp-${process.pid}`;
  const threads = options.threads ?? availableParallelism();
  const args = [options.source, tmp, QUANT_INFO[quant].label, String(threads)];
  try {
    await new Promise<void>((resolvePromise, reject) => {
      const child = spawn(options.binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
      let tail = '';
      const onData = (chunk: Buffer) => {
        const text = chunk.toString('utf8');
        tail = (tail + text).slice(-4000);
        for (const m of text.matchAll(/\[\s*(\d+)\s*\/\s*(\d+)\s*\]/g)) options.onProgress?.(Number(m[1]), Number(m[2]));
      };
      child.stdout.on('data', onData);
      child.stderr.on('data', onData);
      child.on('error', (err) => reject(new Error(`${options.binary}: ${err.message}`, { cause: err })));
      child.on('close', (code, signal) => {
        if (code === 0) resolvePromise();
        else {
          const last = tail.trim().split('\n').slice(-5).join('\n');
          reject(new Error(`llama-quantize ${args.join(' ')} failed (${signal ?? `exit code ${code}`}): ${last}`));
        }
      });
    });
    await rename(tmp, options.out);
  } finally {
    await rm(tmp, { force: true });
  }
  return { path: options.out, bytes: (await stat(options.out)).size };
}

// ---------------------------------------------------------------------------------------------------------
// Rungs, made once

export type QuantizerSpec =
  | { readonly kind: 'percept'; readonly workers?: number }
  | { readonly kind: 'llama-quantize'; readonly binary: string; readonly threads?: number };

export interface MakeRungOptions {
  readonly source: string;
  readonly quant: LadderQuant;
  /** Folder of the rung files. */
  readonly dir: string;
  readonly quantizer: QuantizerSpec;
  readonly onProgress?: (done: number, total: number) => void;
}

export interface RungFile {
  readonly path: string;
  readonly bytes: number;
  readonly quantizer: QuantizerKind;
  /** True when a file made by an earlier run (same stamp) was used. */
  readonly reused: boolean;
}

/** Bump when the bytes percept's quantizer writes change. */
const RUNG_VERSION = 1;

interface RungStamp {
  readonly version: number;
  readonly source: string;
  readonly sourceBytes: number;
  readonly sourceMtimeMs: number;
  readonly quant: LadderQuant;
  readonly quantizer: QuantizerKind;
  readonly bytes: number;
}

/** Where the rung of `source` in `quant` by `quantizer` lives: named after the source, told apart by its path. */
export function rungPath(dir: string, source: string, quant: LadderQuant, quantizer: QuantizerKind): string {
  const abs = resolve(source);
  const tag = createHash('sha256').update(abs).digest('hex').slice(0, 8);
  return join(dir, `${basename(abs).replace(/\.gguf$/i, '')}-${tag}.${quant}.${quantizer}.gguf`);
}

/** The rung file of `source` in `quant`: reused when an earlier run made it from the same source, else made now. */
export async function makeRung(options: MakeRungOptions): Promise<RungFile> {
  const quant = checkLadderQuant(options.quant);
  const kind = options.quantizer.kind;
  const source = resolve(options.source);
  const path = rungPath(options.dir, source, quant, kind);
  const s = await stat(source);
  const expect = { version: RUNG_VERSION, source, sourceBytes: s.size, sourceMtimeMs: s.mtimeMs, quant, quantizer: kind };
  const stampPath = `${path}.stamp.json`;
  try {
    const stamp = JSON.parse(await readFile(stampPath, 'utf8')) as RungStamp;
    const same = Object.entries(expect).every(([k, v]) => stamp[k as keyof RungStamp] === v);
    if (same && (await stat(path)).size === stamp.bytes) return { path, bytes: stamp.bytes, quantizer: kind, reused: true };
  } catch {
    // no stamp, or no file: make it
  }
  await mkdir(options.dir, { recursive: true });
  await rm(stampPath, { force: true });
  const q = options.quantizer;
  const made =
    q.kind === 'percept'
      ? await quantizeGGUF({
          source,
          out: path,
          quant,
          ...(q.workers ? { workers: q.workers } : {}),
          ...(options.onProgress ? { onProgress: options.onProgress } : {}),
        })
      : await runLlamaQuantize({
          binary: q.binary,
          source,
          out: path,
          quant,
          ...(q.threads ? { threads: q.threads } : {}),
          ...(options.onProgress ? { onProgress: options.onProgress } : {}),
        });
  const stamp: RungStamp = { ...expect, bytes: made.bytes };
  await writeFile(stampPath, `${JSON.stringify(stamp, null, 2)}\n`);
  return { path, bytes: made.bytes, quantizer: kind, reused: false };
}
