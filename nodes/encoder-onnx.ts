// Vision encoder stage: an ONNX `vision_encoder` (transformers.js contract) run by onnxruntime-node in a worker thread.
// So the event loop keeps serving the rest of the graph during an encode.
// Contracts, buffers and cancel: nodes/README.md#onnx-encoder
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Worker } from 'node:worker_threads';
import type { ImageEmbedding, PixelTensor } from './payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';
import type { WireTensor, WireValueInfo, WorkerInit, WorkerReply, WorkerRequest } from './encoder-onnx.worker.ts';
import { AbandonableSlot } from '../pipeline/abort.ts';

export type ExecutionProvider = 'cpu' | 'cuda' | 'tensorrt';

/** close(): how long the worker may take to release its session before it is terminated. */
const CLOSE_GRACE_MS = 2000;
/** close(): how long to wait for the worker's exit after it said it closed. */
const EXIT_WAIT_MS = 500;

export interface OnnxEncoderConfig {
  /** Path of vision_encoder.onnx (resolve `synth:<preset>` specifiers before, with models/vision-synth.ts). */
  readonly model: string;
  /** The config's encoder.executionProvider. */
  readonly ep: ExecutionProvider;
  /** The decoder's n_embd: the encoder's output width must equal it. */
  readonly expectedHidden?: number;
  /** ORT intra-op threads (default: ORT's choice, one per core). */
  readonly threads?: number;
  readonly graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /** Let ORT's intra-op threads spin-wait between runs (default false: they would compete with the
   * preprocessing and decoding threads for the same cores). */
  readonly allowSpinning?: boolean;
  /** Copy input arrays instead of transferring them (keeps the caller's PixelTensor usable). */
  readonly copyInputs?: boolean;
}

export interface EncoderContractInfo {
  readonly kind: 'gemma3' | 'gemma4';
  /** Output width (the decoder's n_embd). */
  readonly hidden: number;
  /** gemma3: square input side (896). */
  readonly imageSize?: number;
  /** gemma3: tokens per image when fixed in the model (256). */
  readonly tokens?: number;
  /** gemma4: values per patch (768). */
  readonly patchDim?: number;
  readonly inputs: readonly WireValueInfo[];
  readonly outputs: readonly WireValueInfo[];
}

export interface OnnxEncoderStats {
  readonly runs: number;
  /** Runs whose result arrived after the frame was abandoned (signal fired). */
  readonly discarded: number;
  readonly lastRunMs: number;
}

export interface OnnxEncoderStage extends Stage<PixelTensor, ImageEmbedding> {
  readonly contract: EncoderContractInfo;
  readonly ep: ExecutionProvider;
  stats(): OnnxEncoderStats;
  close(): Promise<void>;
}

const dimsText = (shape: readonly (number | string)[] | undefined): string => `[${(shape ?? []).join(',')}]`;

function fixedDimMismatch(info: WireValueInfo, index: number, expected: number): string | undefined {
  const d = info.shape?.[index];
  return typeof d === 'number' && d !== expected
    ? `${info.name} dim ${index} is ${d}, expected ${expected} (shape ${dimsText(info.shape)})`
    : undefined;
}

/** Checks a model's inputs/outputs against the gemma3/gemma4 contracts. Throws an Error that lists every
 * mismatch. Pure: the tests call it on hand-made metadata too. */
export function checkEncoderContract(
  inputs: readonly WireValueInfo[],
  outputs: readonly WireValueInfo[],
  expectedHidden?: number,
  source = 'vision encoder',
): EncoderContractInfo {
  const problems: string[] = [];
  const byName = (list: readonly WireValueInfo[], name: string): WireValueInfo | undefined => list.find((v) => v.name === name);
  const pixels = byName(inputs, 'pixel_values');
  const positions = byName(inputs, 'pixel_position_ids');
  const features = byName(outputs, 'image_features');
  const names = (l: readonly WireValueInfo[]): string =>
    l.map((v) => `${v.name}:${v.type ?? '?'}${dimsText(v.shape)}`).join(', ') || 'none';
  if (!pixels) problems.push(`missing input 'pixel_values' (inputs: ${names(inputs)})`);
  if (!features) problems.push(`missing output 'image_features' (outputs: ${names(outputs)})`);
  const extra = inputs.filter((v) => v.name !== 'pixel_values' && v.name !== 'pixel_position_ids');
  if (extra.length)
    problems.push(
      `unexpected input(s) ${extra.map((v) => `'${v.name}'`).join(', ')} (the contract has pixel_values and, for gemma4, pixel_position_ids)`,
    );
  const kind: 'gemma3' | 'gemma4' = positions ? 'gemma4' : 'gemma3';
  const check = (v: WireValueInfo | undefined, type: string, ranks: readonly number[]): boolean => {
    if (!v) return false;
    if (!v.isTensor) {
      problems.push(`${v.name} is not a tensor`);
      return false;
    }
    if (v.type !== type) problems.push(`${v.name} has dtype ${v.type}, expected ${type}`);
    const rank = v.shape?.length ?? 0;
    if (rank && !ranks.includes(rank)) {
      problems.push(`${v.name} has rank ${rank} ${dimsText(v.shape)}, expected rank ${ranks.join(' or ')}`);
      return false;
    }
    return rank > 0;
  };
  let imageSize: number | undefined;
  let tokens: number | undefined;
  let patchDim: number | undefined;
  if (kind === 'gemma3') {
    if (check(pixels, 'float32', [4]) && pixels) {
      const c = fixedDimMismatch(pixels, 1, 3);
      if (c) problems.push(c);
      const h = pixels.shape![2];
      const w = pixels.shape![3];
      if (typeof h === 'number' && typeof w === 'number') {
        if (h !== w) problems.push(`pixel_values is ${h}×${w}, expected a square image`);
        imageSize = h;
      }
    }
    if (check(features, 'float32', [3]) && features) {
      const t = features.shape![1];
      if (typeof t === 'number') tokens = t;
    }
  } else {
    if (check(pixels, 'float32', [3]) && pixels) {
      const d = pixels.shape![2];
      if (typeof d === 'number') {
        if (d !== 768) problems.push(`pixel_values dim 2 is ${d}, expected 768 (16×16×3 patches)`);
        patchDim = d;
      }
    }
    if (check(positions, 'int64', [3]) && positions) {
      const m = fixedDimMismatch(positions, 2, 2);
      if (m) problems.push(m);
    }
    check(features, 'float32', [2, 3]);
  }
  const outShape = features?.shape ?? [];
  const last = outShape[outShape.length - 1];
  const hidden = typeof last === 'number' ? last : undefined;
  if (features && outShape.length && hidden === undefined)
    problems.push(`image_features width is symbolic (${dimsText(outShape)}); the contract needs a fixed hidden size`);
  if (hidden !== undefined && expectedHidden !== undefined && hidden !== expectedHidden) {
    problems.push(`image_features width is ${hidden}, but the decoder's n_embd is ${expectedHidden}`);
  }
  if (problems.length) throw new Error(`${source}: not a ${kind} vision_encoder: ${problems.join('; ')}`);
  return {
    kind,
    hidden: hidden ?? expectedHidden ?? 0,
    ...(imageSize !== undefined ? { imageSize } : {}),
    ...(tokens !== undefined ? { tokens } : {}),
    ...(patchDim !== undefined ? { patchDim } : {}),
    inputs,
    outputs,
  };
}

/** ORT provider names and the shared libraries each needs next to the onnxruntime-node binding. */
const PROVIDERS: Record<ExecutionProvider, { ort: string; libs: readonly string[] }> = {
  cpu: { ort: 'cpu', libs: [] },
  cuda: { ort: 'cuda', libs: ['libonnxruntime_providers_shared.so', 'libonnxruntime_providers_cuda.so'] },
  tensorrt: { ort: 'tensorrt', libs: ['libonnxruntime_providers_shared.so', 'libonnxruntime_providers_tensorrt.so'] },
};

function ortBinaryDir(): string {
  const require = createRequire(import.meta.url);
  const pkg = dirname(require.resolve('onnxruntime-node/package.json'));
  return join(pkg, 'bin', 'napi-v6', process.platform, process.arch);
}

/** Fails early, with a clear message, when a GPU provider's libraries are not installed. */
export function checkExecutionProvider(ep: ExecutionProvider): void {
  const p = PROVIDERS[ep];
  if (!p) throw new RangeError(`encoder-onnx: execution provider must be one of ${Object.keys(PROVIDERS).join(', ')}, got ${String(ep)}`);
  if (!p.libs.length) return;
  const dir = ortBinaryDir();
  const missing = p.libs.filter((lib) => !existsSync(join(dir, lib)));
  if (missing.length) {
    throw new Error(
      `encoder-onnx: execution provider '${ep}' is not available: ${missing.join(', ')} not found in ${dir}. ` +
        `onnxruntime-node downloads its GPU providers in its install script (linux-x64 only), which cannot run offline; use ep 'cpu' or install them.`,
    );
  }
}

interface RunReply {
  readonly outputs: Record<string, WireTensor>;
  readonly runMs: number;
}

interface PendingRun {
  readonly resolve: (reply: RunReply) => void;
  readonly reject: (e: Error) => void;
  /** Hands the input's pixel_values back to the preprocessor once the worker returns it. */
  readonly recycle: ((pixelValues: Float32Array) => void) | undefined;
}

function transferable(a: Float32Array | BigInt64Array, copy: boolean): { data: Float32Array | BigInt64Array; transfer?: ArrayBuffer } {
  if (copy || !(a.buffer instanceof ArrayBuffer) || a.byteOffset !== 0 || a.byteLength !== a.buffer.byteLength) {
    // A SharedArrayBuffer is shared, not copied, by postMessage; a view into a larger buffer is copied.
    if (!copy && !(a.buffer instanceof ArrayBuffer)) return { data: a };
    const c = a.slice();
    return { data: c, transfer: c.buffer as ArrayBuffer };
  }
  return { data: a, transfer: a.buffer };
}

/** Loads the model in a worker, checks its contract, and returns the stage. */
export async function createOnnxEncoderStage(cfg: OnnxEncoderConfig): Promise<OnnxEncoderStage> {
  if (typeof cfg?.model !== 'string' || cfg.model.length === 0)
    throw new TypeError('encoder-onnx: cfg.model must be the path of an .onnx file');
  if (cfg.model.endsWith('.gguf'))
    throw new Error(`encoder-onnx: ${cfg.model} is a GGUF (mmproj): that needs the llama.cpp mtmd encoder, not onnxruntime`);
  if (!existsSync(cfg.model)) throw new Error(`encoder-onnx: model ${cfg.model} does not exist`);
  const { ep } = cfg;
  checkExecutionProvider(ep);
  if (cfg.threads !== undefined && !(Number.isInteger(cfg.threads) && cfg.threads >= 1))
    throw new RangeError(`encoder-onnx: threads must be a positive integer, got ${cfg.threads}`);
  if (cfg.expectedHidden !== undefined && !(Number.isInteger(cfg.expectedHidden) && cfg.expectedHidden > 0)) {
    throw new RangeError(`encoder-onnx: expectedHidden must be a positive integer, got ${cfg.expectedHidden}`);
  }

  const init: WorkerInit = {
    modelPath: cfg.model,
    executionProviders: ep === 'cpu' ? ['cpu'] : [PROVIDERS[ep].ort, 'cpu'],
    graphOptimizationLevel: cfg.graphOptimizationLevel ?? 'all',
    allowSpinning: cfg.allowSpinning === true,
    ...(cfg.threads !== undefined ? { intraOpNumThreads: cfg.threads } : {}),
  };
  // The worker is TypeScript, so a small .mjs entry registers tsx inside the worker thread first.
  // Node 20 does not apply the parent's `--import tsx` hooks to a worker's entry module.
  const worker = new Worker(new URL('./encoder-onnx.worker.mjs', import.meta.url), { workerData: init });

  const ready = await new Promise<{ inputs: WireValueInfo[]; outputs: WireValueInfo[] }>((resolve, reject) => {
    const onMessage = (msg: WorkerReply): void => {
      cleanup();
      if (msg.type === 'ready') resolve({ inputs: msg.inputs, outputs: msg.outputs });
      else if (msg.type === 'load-error') reject(new Error(`encoder-onnx: cannot load ${cfg.model} with ep '${ep}': ${msg.message}`));
      else reject(new Error(`encoder-onnx: unexpected worker message '${msg.type}' during load`));
    };
    const onError = (err: Error): void => {
      cleanup();
      reject(new Error(`encoder-onnx: worker failed while loading ${cfg.model}: ${err.message}`));
    };
    const onExit = (code: number): void => {
      cleanup();
      reject(new Error(`encoder-onnx: worker exited (code ${code}) while loading ${cfg.model}`));
    };
    const cleanup = (): void => {
      worker.off('message', onMessage);
      worker.off('error', onError);
      worker.off('exit', onExit);
    };
    worker.on('message', onMessage);
    worker.on('error', onError);
    worker.on('exit', onExit);
  }).catch(async (err: unknown) => {
    await worker.terminate();
    throw err;
  });

  let contract: EncoderContractInfo;
  try {
    contract = checkEncoderContract(ready.inputs, ready.outputs, cfg.expectedHidden, cfg.model);
  } catch (err) {
    await worker.terminate();
    throw err;
  }
  return new OnnxEncoder(worker, contract, ep, cfg.copyInputs === true);
}

class OnnxEncoder implements OnnxEncoderStage {
  readonly name = 'encode';
  readonly contract: EncoderContractInfo;
  readonly ep: ExecutionProvider;
  readonly #worker: Worker;
  readonly #copyInputs: boolean;
  readonly #pending = new Map<number, PendingRun>();
  readonly #slot = new AbandonableSlot();
  #nextId = 1;
  #failure: Error | undefined;
  #closing: Promise<void> | undefined;
  #runs = 0;
  #lastRunMs = 0;

  constructor(worker: Worker, contract: EncoderContractInfo, ep: ExecutionProvider, copyInputs: boolean) {
    this.#worker = worker;
    this.contract = contract;
    this.ep = ep;
    this.#copyInputs = copyInputs;
    worker.on('message', (msg: WorkerReply) => this.#onMessage(msg));
    worker.on('error', (err) => this.#fail(new Error(`encoder-onnx: worker crashed: ${err.message}`)));
    worker.on('exit', (code) => {
      if (!this.#closing) this.#fail(new Error(`encoder-onnx: worker exited unexpectedly (code ${code})`));
    });
  }

  stats(): OnnxEncoderStats {
    return { runs: this.#runs, discarded: this.#slot.abandoned, lastRunMs: this.#lastRunMs };
  }

  #onMessage(msg: WorkerReply): void {
    if (msg.type !== 'result' && msg.type !== 'run-error') return;
    const run = this.#pending.get(msg.id);
    if (!run) return;
    this.#pending.delete(msg.id);
    if (msg.pixelValues) run.recycle?.(msg.pixelValues);
    if (msg.type === 'result') {
      this.#runs++;
      this.#lastRunMs = msg.runMs;
      run.resolve({ outputs: msg.outputs, runMs: msg.runMs });
    } else {
      run.reject(new Error(`encoder-onnx: run failed: ${msg.message}`));
    }
  }

  #fail(err: Error): void {
    this.#failure ??= err;
    this.#rejectPending(err);
  }

  #rejectPending(err: Error): void {
    for (const run of this.#pending.values()) run.reject(err);
    this.#pending.clear();
  }

  #validate(input: PixelTensor): void {
    const c = this.contract;
    if (input?.contract !== c.kind) throw new Error(`encoder-onnx: got a ${String(input?.contract)} tensor, the model is ${c.kind}`);
    const count = (dims: readonly number[]): number => dims.reduce((a, b) => a * b, 1);
    if (input.jpeg)
      throw new Error('encoder-onnx: got an undecoded JPEG (for an encoder that decodes on its GPU); this one takes pixel values');
    if (!(input.pixelValues instanceof Float32Array)) throw new TypeError('encoder-onnx: pixelValues must be a Float32Array');
    if (input.pixelValues.buffer.byteLength === 0)
      throw new Error('encoder-onnx: pixelValues is detached (its buffer was already handed to the encoder)');
    if (count(input.pixelDims) !== input.pixelValues.length) {
      throw new RangeError(
        `encoder-onnx: pixelDims [${input.pixelDims.join(',')}] need ${count(input.pixelDims)} values, got ${input.pixelValues.length}`,
      );
    }
    if (c.kind === 'gemma3') {
      const s = c.imageSize;
      if (
        input.pixelDims.length !== 4 ||
        input.pixelDims[1] !== 3 ||
        (s !== undefined && (input.pixelDims[2] !== s || input.pixelDims[3] !== s))
      ) {
        throw new RangeError(`encoder-onnx: gemma3 pixelDims must be [N,3,${s ?? 'S'},${s ?? 'S'}], got [${input.pixelDims.join(',')}]`);
      }
    } else {
      if (input.pixelDims.length !== 3 || input.pixelDims[2] !== 768)
        throw new RangeError(`encoder-onnx: gemma4 pixelDims must be [N,P,768], got [${input.pixelDims.join(',')}]`);
      const pd = input.positionDims;
      if (!(input.positionIds instanceof BigInt64Array) || !pd)
        throw new TypeError('encoder-onnx: gemma4 tensors need positionIds (BigInt64Array) and positionDims');
      if (
        pd.length !== 3 ||
        pd[0] !== input.pixelDims[0] ||
        pd[1] !== input.pixelDims[1] ||
        pd[2] !== 2 ||
        count(pd) !== input.positionIds.length
      ) {
        throw new RangeError(
          `encoder-onnx: positionDims [${pd.join(',')}] do not match pixelDims [${input.pixelDims.join(',')}] / ${input.positionIds.length} ids`,
        );
      }
    }
  }

  async process(input: PixelTensor, ctx: StageContext): Promise<ImageEmbedding> {
    if (this.#closing) throw new Error('encoder-onnx: stage is closed');
    if (this.#failure) throw this.#failure;
    this.#validate(input);
    const reply = await this.#slot.run(() => this.#post(input), ctx.signal);
    return this.#toEmbedding(reply.outputs, input);
  }

  /** Hands one run to the worker (the input arrays are transferred unless copyInputs). */
  #post(input: PixelTensor): Promise<RunReply> {
    if (this.#failure) return Promise.reject(this.#failure);
    const feeds: Record<string, WireTensor> = {};
    const transfer: ArrayBuffer[] = [];
    const pv = transferable(input.pixelValues, this.#copyInputs);
    feeds.pixel_values = { type: 'float32', data: pv.data, dims: input.pixelDims };
    if (pv.transfer) transfer.push(pv.transfer);
    if (this.contract.kind === 'gemma4') {
      const pos = transferable(input.positionIds!, this.#copyInputs);
      feeds.pixel_position_ids = { type: 'int64', data: pos.data, dims: input.positionDims! };
      if (pos.transfer) transfer.push(pos.transfer);
    }
    const id = this.#nextId++;
    const reply = new Promise<RunReply>((resolve, reject) => this.#pending.set(id, { resolve, reject, recycle: input.recycle }));
    const request: WorkerRequest = { type: 'run', id, feeds };
    this.#worker.postMessage(request, transfer);
    return reply;
  }

  #toEmbedding(outputs: Record<string, WireTensor>, input: PixelTensor): ImageEmbedding {
    const f = outputs.image_features;
    if (!f || !(f.data instanceof Float32Array)) throw new Error('encoder-onnx: the model returned no float32 image_features');
    const dims = f.dims;
    const nEmbd = dims[dims.length - 1]!;
    const batch = dims.length === 3 ? dims[0]! : 1;
    if (batch !== 1) throw new Error(`encoder-onnx: image_features has batch ${batch}; one image per frame is supported`);
    const nTokens = dims.length === 3 ? dims[1]! : dims[0]!;
    if (nEmbd !== this.contract.hidden && this.contract.hidden !== 0)
      throw new Error(`encoder-onnx: image_features width ${nEmbd} != ${this.contract.hidden}`);
    if (nTokens !== input.imageTokens) {
      throw new Error(
        `encoder-onnx: the encoder produced ${nTokens} tokens but the preprocessor announced ${input.imageTokens} (image_features [${dims.join(',')}])`,
      );
    }
    return { data: f.data, nTokens, nEmbd };
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#rejectPending(new Error('encoder-onnx: stage closed during the run'));
      const exited = new Promise<void>((resolve) => this.#worker.once('exit', () => resolve()));
      const closed = new Promise<void>((resolve) => {
        const onMsg = (m: WorkerReply): void => {
          if (m.type === 'closed') {
            this.#worker.off('message', onMsg);
            resolve();
          }
        };
        this.#worker.on('message', onMsg);
      });
      try {
        this.#worker.postMessage({ type: 'close' } satisfies WorkerRequest);
      } catch {
        // already gone
      }
      // Give the session a moment to release cleanly; a stuck native run is terminated.
      const timer = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), CLOSE_GRACE_MS).unref());
      const outcome = await Promise.race([closed.then(() => 'closed' as const), exited.then(() => 'exited' as const), timer]);
      if (outcome !== 'exited') {
        const done = await Promise.race([
          exited.then(() => true),
          new Promise<boolean>((r) => setTimeout(() => r(false), EXIT_WAIT_MS).unref()),
        ]);
        if (!done) await this.#worker.terminate();
      }
    })();
    return this.#closing;
  }
}
