// Several cameras on one vision encoder. Each camera's graph gets its own encode stage.
// The stages are handles onto one BatchingEncoder, which encodes frames that arrive together in one call.
// The rule (a bounded wait) and cancel: nodes/README.md#encoder-batching
import type { ImageEmbedding, PixelTensor } from './payloads.ts';
import type { Stage, StageContext, StagePrediction } from '../pipeline/types.ts';

/** The encoder the cameras share: its stage, and its batched call when it has one. */
export interface BatchableEncoder extends Stage<PixelTensor, ImageEmbedding> {
  /** Frames of one image size in one call, embeddings in order. Not abortable. */
  readonly encodeBatch?: (inputs: readonly PixelTensor[]) => Promise<ImageEmbedding[]>;
}

export interface CameraEncoderOptions {
  readonly cameras: number;
  /** How long an idle encoder may hold a frame for other cameras' frames (ms). */
  readonly waitMs: number;
}

export interface BatchingEncoderStats {
  /** Encoder calls, and the frames they encoded (results discarded for abandoned frames included). */
  readonly calls: number;
  readonly frames: number;
  /** The most frames in one call. */
  readonly maxBatch: number;
  /** Frames whose signal fired while their call ran (their result, if any, went nowhere). */
  readonly discarded: number;
  /** The time its calls took, in all (ms). */
  readonly busyMs: number;
}

export interface CameraEncoderStage extends Stage<PixelTensor, ImageEmbedding> {
  stats(): BatchingEncoderStats;
  /** `stage`, this camera's preprocess, with its frames announced.
   * From when it takes a frame until the event-loop turn after it finishes, the encoder knows the frame is coming.
   * By then the graph has handed the frame to this encode stage, or dropped it. */
  announcing<I>(stage: Stage<I, PixelTensor>): Stage<I, PixelTensor>;
}

interface Waiting {
  readonly camera: number;
  readonly input: PixelTensor;
  readonly ctx: StageContext;
  readonly key: string;
  readonly arrivedNs: bigint;
  readonly resolve: (value: ImageEmbedding) => void;
  readonly reject: (reason: unknown) => void;
  readonly onAbort: () => void;
  settled: boolean;
}

/** Frames with equal keys can share a call: same contract, tensor shape, token count and patch grid. */
function sizeKey(input: PixelTensor): string {
  let cols = 0;
  const ids = input.positionIds;
  if (ids) for (let p = 0; p < ids.length && ids[2 * p]! >= 0n; p++) cols = Math.max(cols, Number(ids[2 * p]!) + 1);
  return `${input.contract}/${input.pixelDims.join('x')}/${input.imageTokens}/${cols}`;
}

/**
 * One stage per camera onto `encoder`, which is closed when the last of them is. The stages may run
 * at the same time (one per camera graph); the encoder sees one call at a time.
 */
export function createCameraEncoderStages(encoder: BatchableEncoder, options: CameraEncoderOptions): CameraEncoderStage[] {
  const { cameras, waitMs } = options;
  if (!(Number.isInteger(cameras) && cameras >= 1)) throw new RangeError(`encoder-batch: cameras must be an integer ≥ 1, got ${cameras}`);
  if (!(Number.isFinite(waitMs) && waitMs >= 0)) throw new RangeError(`encoder-batch: waitMs must be a number ≥ 0, got ${waitMs}`);
  const engine = new BatchingEncoder(encoder, cameras, BigInt(Math.round(waitMs * 1e6)));
  let open = cameras;
  return Array.from({ length: cameras }, (_, camera) => {
    let closed = false;
    return {
      name: encoder.name,
      process: (input: PixelTensor, ctx: StageContext) => engine.submit(camera, input, ctx),
      predict: (_deadlineNs: bigint, entering: boolean) => engine.predict(entering),
      stats: () => engine.stats(),
      announcing: <I>(stage: Stage<I, PixelTensor>): Stage<I, PixelTensor> => ({
        ...stage,
        process: async (input: I, ctx: StageContext) => {
          engine.coming(camera, +1);
          try {
            return await stage.process(input, ctx);
          } finally {
            setImmediate(() => engine.coming(camera, -1));
          }
        },
      }),
      async close() {
        if (closed) return;
        closed = true;
        open -= 1;
        if (open === 0) await engine.close();
      },
    };
  });
}

/** Calls whose time per frame predicts the next ones (Stage.predict). */
const RECENT_CALLS = 16;

class BatchingEncoder {
  readonly #encoder: BatchableEncoder;
  readonly #cameras: number;
  readonly #waitNs: bigint;
  readonly #lastCallNs = new Map<string, bigint>();
  /** The last RECENT_CALLS calls' time per frame (ms), oldest first; their median (0: no call yet); the running call. */
  readonly #msPerFrame: number[] = [];
  #medianMsPerFrame = 0;
  #runningSince: { readonly startNs: bigint; readonly frames: number; readonly clock: StageContext['clock'] } | undefined;
  /** Per camera: frames its preprocess is working on (announced); null: nothing announces. */
  #coming: number[] | null = null;
  #waiting: Waiting[] = [];
  #running: Promise<void> | undefined;
  #timer: NodeJS.Timeout | undefined;
  #calls = 0;
  #frames = 0;
  #maxBatch = 0;
  #discarded = 0;
  #busyNs = 0n;
  #closed = false;

  constructor(encoder: BatchableEncoder, cameras: number, waitNs: bigint) {
    this.#encoder = encoder;
    this.#cameras = cameras;
    this.#waitNs = waitNs;
  }

  stats(): BatchingEncoderStats {
    const busyMs = Number(this.#busyNs) / 1e6;
    return { calls: this.#calls, frames: this.#frames, maxBatch: this.#maxBatch, discarded: this.#discarded, busyMs };
  }

  /**
   * A frame entering now (`entering`), or entering preprocess now: the running call's rest (waitMs), then one call
   * with every frame ahead of it (ownMs), each at the median time per frame of the recent calls. Without encodeBatch
   * the frames ahead take a call each, in the wait. 0 and 0 before any call has been timed.
   */
  predict(entering: boolean): StagePrediction {
    const perFrameMs = this.#medianMsPerFrame;
    if (perFrameMs === 0) return { waitMs: 0, ownMs: 0 };
    const running = this.#runningSince;
    const restMs = running ? Math.max(0, running.frames * perFrameMs - Number(running.clock.nowNs() - running.startNs) / 1e6) : 0;
    // Ahead of a frame at encode entry: the frames waiting. At preprocess entry, also those other cameras preprocess.
    const coming = entering ? 0 : (this.#coming?.reduce((a, b) => a + b, 0) ?? 0);
    const ahead = this.#waiting.length + coming;
    if (!this.#encoder.encodeBatch) return { waitMs: restMs + ahead * perFrameMs, ownMs: perFrameMs };
    return { waitMs: restMs, ownMs: Math.min(this.#cameras, ahead + 1) * perFrameMs };
  }

  /** A camera's preprocess took (+1) or let go of (−1) a frame. */
  coming(camera: number, delta: 1 | -1): void {
    this.#coming ??= new Array<number>(this.#cameras).fill(0);
    this.#coming[camera] = Math.max(0, this.#coming[camera]! + delta);
    if (delta < 0) this.#schedule();
  }

  submit(camera: number, input: PixelTensor, ctx: StageContext): Promise<ImageEmbedding> {
    if (this.#closed) return Promise.reject(new Error('encoder-batch: the encoder is closed'));
    if (ctx.signal.aborted) return Promise.reject(ctx.signal.reason);
    return new Promise<ImageEmbedding>((resolve, reject) => {
      const w: Waiting = {
        camera,
        input,
        ctx,
        key: sizeKey(input),
        arrivedNs: ctx.clock.nowNs(),
        resolve,
        reject,
        settled: false,
        onAbort: () => {
          if (w.settled) return;
          w.settled = true;
          const at = this.#waiting.indexOf(w);
          if (at >= 0) this.#waiting.splice(at, 1);
          else this.#discarded += 1; // inside a running call: its result goes nowhere
          reject(ctx.signal.reason);
        },
      };
      ctx.signal.addEventListener('abort', w.onAbort, { once: true });
      this.#waiting.push(w);
      this.#schedule();
    });
  }

  /** Starts the next call now, or arms the timer for the moment the held frames must go. */
  #schedule(): void {
    if (this.#running || this.#waiting.length === 0) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    const first = this.#waiting[0]!;
    if (!this.#encoder.encodeBatch) return this.#run([first]);
    const group = this.#sameSize();
    const cameras = new Set(group.map((w) => w.camera));
    const everyCamera = cameras.size >= this.#cameras;
    // Announced: nothing more is coming for this call.
    const complete = this.#coming !== null && this.#coming.every((n, camera) => n === 0 || cameras.has(camera));
    if (everyCamera || complete || this.#waitNs === 0n) return this.#run(group);
    // Nothing is held before a call of this size has been timed (the warm-up times one).
    const callNs = this.#lastCallNs.get(first.key);
    if (callNs === undefined) return this.#run(group);
    let untilNs = first.arrivedNs + this.#waitNs;
    for (const w of group) {
      const slackNs = w.ctx.stageDeadlineNs - 2n * callNs - w.arrivedNs;
      const latestNs = w.arrivedNs + slackNs / 2n;
      if (latestNs < untilNs) untilNs = latestNs;
    }
    const nowNs = first.ctx.clock.nowNs();
    if (untilNs <= nowNs) return this.#run(group);
    this.#timer = setTimeout(
      () => {
        this.#timer = undefined;
        if (!this.#running && this.#waiting.length > 0) this.#run(this.#sameSize());
      },
      Math.ceil(Number(untilNs - nowNs) / 1e6),
    );
  }

  /** The oldest waiting frame and every other of its size. */
  #sameSize(): Waiting[] {
    const key = this.#waiting[0]!.key;
    return this.#waiting.filter((w) => w.key === key);
  }

  #run(group: Waiting[]): void {
    this.#waiting = this.#waiting.filter((w) => !group.includes(w));
    this.#calls += 1;
    this.#frames += group.length;
    this.#maxBatch = Math.max(this.#maxBatch, group.length);
    const clock = group[0]!.ctx.clock;
    const startNs = clock.nowNs();
    this.#runningSince = { startNs, frames: group.length, clock };
    // One frame: the encoder's own call, which honours the frame's signal.
    const encode = async (): Promise<ImageEmbedding[]> =>
      group.length === 1 || !this.#encoder.encodeBatch
        ? [await this.#encoder.process(group[0]!.input, group[0]!.ctx)]
        : this.#encoder.encodeBatch(group.map((w) => w.input));
    this.#running = (async () => {
      let outcome: { ok: true; out: ImageEmbedding[] } | { ok: false; error: unknown };
      try {
        outcome = { ok: true, out: await encode() };
        const callNs = clock.nowNs() - startNs;
        this.#lastCallNs.set(group[0]!.key, callNs);
        this.#msPerFrame.push(Number(callNs) / 1e6 / group.length);
        if (this.#msPerFrame.length > RECENT_CALLS) this.#msPerFrame.shift();
        this.#medianMsPerFrame = [...this.#msPerFrame].sort((a, b) => a - b)[this.#msPerFrame.length >> 1]!;
      } catch (error) {
        outcome = { ok: false, error };
      }
      this.#busyNs += clock.nowNs() - startNs;
      group.forEach((w, i) => {
        w.ctx.signal.removeEventListener('abort', w.onAbort);
        if (w.settled) return;
        w.settled = true;
        if (outcome.ok) w.resolve(outcome.out[i]!);
        else w.reject(outcome.error);
      });
    })();
    void this.#running.finally(() => {
      this.#running = undefined;
      this.#runningSince = undefined;
      this.#schedule();
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    for (const w of this.#waiting.splice(0)) {
      w.settled = true;
      w.reject(new Error('encoder-batch: the encoder closed'));
    }
    await this.#running;
    await this.#encoder.close?.();
  }
}
