// Worker thread that owns one onnxruntime-node InferenceSession.
// session.run() does its native work synchronously, so on the main thread it would stall the event loop for the whole encode.
// Protocol, in plain objects (WorkerRequest and WorkerReply below):
//   in : workerData = WorkerInit, then 'run' (buffers transferred) and 'close'
//   out: 'ready' or 'load-error', then 'result' or 'run-error' per run, and 'closed'
// 'result' and 'run-error' hand the input's pixelValues back for reuse.
import { parentPort, workerData } from 'node:worker_threads';
import ort from 'onnxruntime-node';

export interface WorkerInit {
  readonly modelPath: string;
  readonly executionProviders: readonly string[];
  readonly intraOpNumThreads?: number;
  readonly graphOptimizationLevel: 'disabled' | 'basic' | 'extended' | 'all';
  /** ORT's intra-op threads spin after a run by default.
   * On a small shared CPU, that spinning steals time from preprocessing and the decoder. */
  readonly allowSpinning: boolean;
}

export interface WireTensor {
  readonly type: 'float32' | 'int64';
  readonly data: Float32Array | BigInt64Array;
  readonly dims: readonly number[];
}

export interface WireValueInfo {
  readonly name: string;
  readonly isTensor: boolean;
  readonly type?: string;
  /** Numbers for fixed dims, strings for symbolic ones; empty when unknown. */
  readonly shape?: readonly (number | string)[];
}

export type WorkerRequest =
  { readonly type: 'run'; readonly id: number; readonly feeds: Readonly<Record<string, WireTensor>> } | { readonly type: 'close' };

export type WorkerReply =
  | { readonly type: 'ready'; readonly inputs: WireValueInfo[]; readonly outputs: WireValueInfo[] }
  | { readonly type: 'load-error'; readonly message: string }
  | {
      readonly type: 'result';
      readonly id: number;
      readonly outputs: Record<string, WireTensor>;
      readonly runMs: number;
      readonly pixelValues?: Float32Array;
    }
  | { readonly type: 'run-error'; readonly id: number; readonly message: string; readonly pixelValues?: Float32Array }
  | { readonly type: 'closed' };

const port = parentPort;
if (!port) throw new Error('encoder-onnx.worker: must run as a worker thread');
const init = workerData as WorkerInit;

const post = (msg: WorkerReply, transfer: ArrayBuffer[] = []): void => port.postMessage(msg, transfer);
const describe = (m: ort.InferenceSession.ValueMetadata): WireValueInfo =>
  m.isTensor ? { name: m.name, isTensor: true, type: m.type, shape: [...m.shape] } : { name: m.name, isTensor: false };

async function main(): Promise<void> {
  let session: ort.InferenceSession;
  try {
    session = await ort.InferenceSession.create(init.modelPath, {
      executionProviders: [...init.executionProviders],
      graphOptimizationLevel: init.graphOptimizationLevel,
      ...(init.intraOpNumThreads !== undefined ? { intraOpNumThreads: init.intraOpNumThreads } : {}),
      extra: { session: { intra_op: { allow_spinning: init.allowSpinning ? '1' : '0' } } },
    });
  } catch (err) {
    post({ type: 'load-error', message: err instanceof Error ? err.message : String(err) });
    port!.close();
    return;
  }
  post({ type: 'ready', inputs: session.inputMetadata.map(describe), outputs: session.outputMetadata.map(describe) });

  port!.on('message', (req: WorkerRequest) => {
    if (req.type === 'close') {
      void session.release().finally(() => {
        post({ type: 'closed' });
        port!.close();
      });
      return;
    }
    void run(session, req.id, req.feeds);
  });
}

/** The transferred pixel_values input, to send back once the session no longer reads it. */
function inputToReturn(feeds: Readonly<Record<string, WireTensor>>): { pixelValues?: Float32Array; transfer: ArrayBuffer[] } {
  const data = feeds.pixel_values?.data;
  if (!(data instanceof Float32Array) || !(data.buffer instanceof ArrayBuffer)) return { transfer: [] };
  return { pixelValues: data, transfer: [data.buffer] };
}

async function run(session: ort.InferenceSession, id: number, feeds: Readonly<Record<string, WireTensor>>): Promise<void> {
  try {
    const ortFeeds: Record<string, ort.Tensor> = {};
    for (const [name, t] of Object.entries(feeds)) ortFeeds[name] = new ort.Tensor(t.type, t.data, [...t.dims]);
    const t0 = performance.now();
    const results = await session.run(ortFeeds);
    const runMs = performance.now() - t0;
    const outputs: Record<string, WireTensor> = {};
    const transfer: ArrayBuffer[] = [];
    for (const [name, value] of Object.entries(results)) {
      if (value.type !== 'float32' && value.type !== 'int64') continue;
      let data = value.data as Float32Array | BigInt64Array;
      // Transfer when the array owns its whole buffer; otherwise copy once (still no copy on the way back).
      if (!(data.buffer instanceof ArrayBuffer) || data.byteOffset !== 0 || data.byteLength !== data.buffer.byteLength) data = data.slice();
      outputs[name] = { type: value.type, data, dims: [...value.dims] };
      transfer.push(data.buffer as ArrayBuffer);
    }
    const back = inputToReturn(feeds);
    try {
      post({ type: 'result', id, outputs, runMs, ...back }, [...transfer, ...back.transfer]);
    } catch {
      // A buffer owned by native code cannot be detached: send copies.
      for (const o of Object.values(outputs)) (o as { data: Float32Array | BigInt64Array }).data = o.data.slice();
      post({ type: 'result', id, outputs, runMs, ...back }, back.transfer);
    }
  } catch (err) {
    const back = inputToReturn(feeds);
    post({ type: 'run-error', id, message: err instanceof Error ? err.message : String(err), ...back }, back.transfer);
  }
}

void main();
