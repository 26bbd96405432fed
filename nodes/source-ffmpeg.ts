// source-ffmpeg: live cameras (V4L2), network streams (RTSP, HTTP) and video files, decoded by an ffmpeg child process.
// ffmpeg gets its arguments as an array, never through a shell, and writes JPEG frames to its stdout:
//
//   ffmpeg [-re] [inputOptions…] [-f inputFormat] -i URL -an -copyts
//          -vf [fps=F,][scale=W:H,]showinfo -fps_mode passthrough -c:v mjpeg -q:v 3 -f image2pipe pipe:1
//
// Framing, timestamps and restarts: nodes/README.md#ffmpeg-source
import { spawn, spawnSync, type ChildProcessByStdio } from 'node:child_process';
import type { Readable } from 'node:stream';
import type { Clock } from '../pipeline/clock.ts';
import type { FfmpegSourceConfig } from '../pipeline/config.ts';
import type { FrameSource, SourceIncident, SourceItem, SourceRejection, Stamp } from '../pipeline/types.ts';
import type { CameraFrame } from './payloads.ts';

export type FfmpegSourceOptions = Pick<FfmpegSourceConfig, 'url'> &
  Partial<Omit<FfmpegSourceConfig, 'kind' | 'url'>> & {
    /** FrameSource id (default 'ffmpeg:<url>'). */
    readonly id?: string;
  };

export interface FfmpegSourceCounters {
  readonly frames: number;
  readonly restarts: number;
  /** Frames that came without a timestamp line (yielded with a null source stamp). */
  readonly unstamped: number;
  /** Frames ffmpeg did not finish (yielded as rejected frames). */
  readonly rejected: number;
}

export interface FfmpegSource extends FrameSource<CameraFrame> {
  readonly counters: FfmpegSourceCounters;
  /** The process id of the running ffmpeg, if one runs (tests kill it to check supervision). */
  readonly pid: number | undefined;
  /** ffmpeg's arguments. */
  readonly args: readonly string[];
  frames(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection>;
}

/** Largest JPEG accepted before the stream is considered broken (a missing end marker). */
const MAX_FRAME_BYTES = 64 << 20;
const SHOWINFO = /\] n:\s*(\d+)\s+pts:\s*(-?\d+)\s+pts_time:\s*(-?\d+(?:\.\d+)?)/;

/** FfmpegSourceOptions with every default filled in, as checkFfmpegSourceOptions returns them. */
export type CheckedFfmpegSourceOptions = Required<FfmpegSourceOptions>;

/** Checks `options` and fills in the defaults; throws naming the first bad option. */
export function checkFfmpegSourceOptions(options: FfmpegSourceOptions): CheckedFfmpegSourceOptions {
  if (options === null || typeof options !== 'object') throw new TypeError('createFfmpegSource: expected an options object { url }');
  const {
    url,
    inputFormat = null,
    inputOptions = [],
    fps = 0,
    width = 0,
    height = 0,
    realtime = false,
    restart = 'on-failure',
    maxRestarts = 10,
    backoffMs = 250,
    maxBackoffMs = 5000,
    ffmpegPath = 'ffmpeg',
  } = options;
  if (typeof url !== 'string' || url.length === 0)
    throw new TypeError(`createFfmpegSource: expected a non-empty url but received ${JSON.stringify(url)}`);
  if (!Array.isArray(inputOptions) || !inputOptions.every((o) => typeof o === 'string'))
    throw new TypeError('createFfmpegSource: expected inputOptions to be an array of strings');
  numberAtLeastZero('fps', fps);
  numberAtLeastZero('width', width);
  numberAtLeastZero('height', height);
  numberAtLeastZero('maxRestarts', maxRestarts);
  numberAtLeastZero('backoffMs', backoffMs);
  numberAtLeastZero('maxBackoffMs', maxBackoffMs);
  if (!['on-failure', 'always', 'never'].includes(restart))
    throw new TypeError(`createFfmpegSource: unknown restart policy ${JSON.stringify(restart)}`);
  const id = options.id ?? `ffmpeg:${url}`;
  return { url, inputFormat, inputOptions, fps, width, height, realtime, restart, maxRestarts, backoffMs, maxBackoffMs, ffmpegPath, id };
}

function numberAtLeastZero(name: string, value: unknown): void {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0)
    throw new RangeError(`createFfmpegSource: expected a number >= 0 for ${name} but received ${value}`);
}

/** Checks the options and that ffmpeg runs; the first run starts when frames() is called. */
export function createFfmpegSource(options: FfmpegSourceOptions): FfmpegSource {
  const checked = checkFfmpegSourceOptions(options);
  const probe = spawnSync(checked.ffmpegPath, ['-hide_banner', '-version'], { stdio: 'ignore' });
  if (probe.error)
    throw new Error(
      `ffmpeg source: cannot run ${checked.ffmpegPath} (${probe.error.message}); install ffmpeg (Debian: apt-get install ffmpeg)`,
    );
  return new SupervisedFfmpeg(checked);
}

/** ffmpeg's arguments for the options: an array, never a shell command line. */
function ffmpegArgs(options: CheckedFfmpegSourceOptions): readonly string[] {
  const { fps, width, height, inputFormat } = options;
  const filters = [
    ...(fps > 0 ? [`fps=${fps}`] : []),
    ...(width > 0 || height > 0 ? [`scale=${width || -2}:${height || -2}`] : []),
    'showinfo',
  ];
  return Object.freeze([
    '-hide_banner',
    '-nostdin',
    '-nostats',
    '-loglevel',
    'info',
    ...(options.realtime ? ['-re'] : []),
    ...options.inputOptions,
    ...(inputFormat ? ['-f', inputFormat] : []),
    '-i',
    options.url,
    '-an',
    '-copyts',
    '-vf',
    filters.join(','),
    '-fps_mode',
    'passthrough',
    '-c:v',
    'mjpeg',
    '-q:v',
    '3',
    '-f',
    'image2pipe',
    'pipe:1',
  ]);
}

/** The source: one ffmpeg run at a time, restarted by the options' policy. */
class SupervisedFfmpeg implements FfmpegSource {
  readonly id: string;
  readonly args: readonly string[];
  readonly #options: CheckedFfmpegSourceOptions;
  readonly #counters = { frames: 0, restarts: 0, unstamped: 0, rejected: 0 };
  #running: FfmpegRun | undefined;

  constructor(options: CheckedFfmpegSourceOptions) {
    this.#options = options;
    this.id = options.id;
    this.args = ffmpegArgs(options);
  }

  get counters(): FfmpegSourceCounters {
    return { ...this.#counters };
  }

  get pid(): number | undefined {
    return this.#running?.pid;
  }

  async *frames(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection> {
    const { url, restart, maxRestarts, backoffMs, maxBackoffMs, ffmpegPath } = this.#options;
    const counters = this.#counters;
    const id = this.id;
    let inARow = 0;
    let delayMs = backoffMs;
    while (!signal.aborted) {
      const run = (this.#running = new FfmpegRun(ffmpegPath, this.args, signal));
      try {
        for (;;) {
          const next = await run.next();
          if (next.kind === 'exit' || signal.aborted) break;
          if (next.kind === 'rejected') {
            counters.rejected += 1;
            yield {
              sourceId: id,
              captureNs: clock.nowNs(),
              captureWallMs: clock.wallMs(),
              rejected: next.cause,
              detail: `${url}: ${next.detail}`,
            };
            continue;
          }
          inARow = 0;
          delayMs = backoffMs;
          counters.frames += 1;
          if (next.stamp === null) counters.unstamped += 1;
          const captureNs = clock.nowNs();
          yield {
            sourceId: id,
            captureNs,
            captureWallMs: clock.wallMs(),
            sourceStamp: next.stamp,
            payload: { encoding: 'jpeg', data: next.data },
          };
        }
      } finally {
        // Also when the consumer stops early (return()): never leave an ffmpeg behind.
        await run.stop();
        this.#running = undefined;
      }
      if (signal.aborted) return;
      const { code, signalName, lastError } = run.exitStatus!;
      const how = signalName ? `was killed (${signalName})` : `exited with code ${code}`;
      const failed = signalName !== null || code !== 0;
      if (restart === 'never' || (!failed && restart === 'on-failure')) {
        report?.({ kind: 'exit', detail: `ffmpeg ${how}${lastError ? `: ${lastError}` : ''}` });
        if (failed) throw new Error(`ffmpeg source ${url}: ffmpeg ${how}${lastError ? `: ${lastError}` : ''}`);
        return;
      }
      inARow += 1;
      if (inARow > maxRestarts) {
        throw new Error(
          `ffmpeg source ${url}: ffmpeg ${how} ${inARow} times in a row without a frame${lastError ? `; last error: ${lastError}` : ''}`,
        );
      }
      counters.restarts += 1;
      report?.({
        kind: 'restart',
        detail: `ffmpeg ${how}${lastError ? ` (${lastError})` : ''}; restart ${counters.restarts} in ${delayMs} ms`,
      });
      if (!(await sleep(delayMs, signal))) return;
      delayMs = Math.min(maxBackoffMs, Math.max(delayMs * 2, 1));
    }
  }

  async close(): Promise<void> {
    await this.#running?.stop();
  }
}

/** A frame ffmpeg began but did not finish. */
interface Unfinished {
  readonly cause: string;
  readonly detail: string;
}

type RunEvent =
  | { readonly kind: 'frame'; readonly data: Buffer; readonly stamp: Stamp | null }
  | ({ readonly kind: 'rejected' } & Unfinished)
  | { readonly kind: 'exit' };

/** One ffmpeg process: its JPEGs (and unfinished frames) paired with its showinfo timestamps, then its exit. */
class FfmpegRun {
  readonly #proc: ChildProcessByStdio<null, Readable, Readable>;
  readonly #signal: AbortSignal;
  readonly #jpegs: (Buffer | Unfinished)[] = [];
  #stopping = false;
  readonly #stamps: (Stamp | null)[] = [];
  #pending: Buffer = Buffer.alloc(0);
  #stderr = '';
  #wake: (() => void) | undefined;
  #exited: Promise<void>;
  exitStatus: { code: number | null; signalName: NodeJS.Signals | null; lastError: string } | undefined;
  #lastError = '';

  constructor(ffmpegPath: string, args: readonly string[], signal: AbortSignal) {
    this.#signal = signal;
    this.#proc = spawn(ffmpegPath, args, { stdio: ['ignore', 'pipe', 'pipe'], signal });
    this.#proc.stdout.on('data', (chunk: Buffer) => this.#onStdout(chunk));
    this.#proc.stderr.setEncoding('utf8').on('data', (text: string) => this.#onStderr(text));
    this.#proc.on('error', (err) => {
      // An abort kills the process through `signal`; anything else is ffmpeg failing to start.
      if (err.name !== 'AbortError') this.#lastError = err.message;
    });
    this.#exited = new Promise((resolve) =>
      this.#proc.on('close', (code, signalName) => {
        this.#flushStderr();
        // Bytes of a frame left when ffmpeg ended by itself: a frame it did not finish.
        if (this.#pending.length > 0 && !this.#stopping && !this.#signal.aborted) {
          this.#jpegs.push({ cause: 'unfinished JPEG', detail: `ffmpeg ended ${this.#pending.length} bytes into a frame` });
        }
        this.#pending = Buffer.alloc(0);
        this.exitStatus = { code, signalName, lastError: this.#lastError };
        resolve();
        this.#notify();
      }),
    );
  }

  get pid(): number | undefined {
    return this.#proc.exitCode === null ? this.#proc.pid : undefined;
  }

  async next(): Promise<RunEvent> {
    for (;;) {
      if (this.#jpegs.length > 0 && (this.#stamps.length > 0 || this.exitStatus)) {
        const jpeg = this.#jpegs.shift()!;
        const stamp = this.#stamps.length > 0 ? this.#stamps.shift()! : null;
        return Buffer.isBuffer(jpeg) ? { kind: 'frame', data: jpeg, stamp } : { kind: 'rejected', ...jpeg };
      }
      if (this.exitStatus) return { kind: 'exit' };
      await new Promise<void>((resolve) => (this.#wake = resolve));
    }
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    if (!this.exitStatus) this.#proc.kill('SIGTERM');
    await this.#exited;
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  #onStdout(chunk: Buffer): void {
    let data: Buffer = this.#pending.length ? Buffer.concat([this.#pending, chunk]) : chunk;
    let found = false;
    for (;;) {
      const end = data.indexOf(EOI, 2);
      if (end < 0) break;
      const start = data.indexOf(SOI);
      if (start >= 0 && start < end) this.#jpegs.push(Buffer.from(data.subarray(start, end + 2)));
      data = data.subarray(end + 2);
      found = true;
    }
    if (data.length > MAX_FRAME_BYTES) {
      this.#lastError = `a frame of more than ${MAX_FRAME_BYTES} bytes without a JPEG end marker`;
      this.#jpegs.push({ cause: 'unfinished JPEG', detail: this.#lastError });
      found = true;
      this.#proc.kill('SIGKILL');
      data = Buffer.alloc(0);
    }
    this.#pending = data;
    if (found) this.#notify();
  }

  #onStderr(text: string): void {
    this.#stderr += text;
    const lines = this.#stderr.split('\n');
    this.#stderr = lines.pop() ?? '';
    let found = false;
    for (const line of lines) found = this.#onLine(line) || found;
    if (found) this.#notify();
  }

  #flushStderr(): void {
    if (this.#stderr) this.#onLine(this.#stderr);
    this.#stderr = '';
  }

  /** A showinfo line becomes the next stamp; other non-empty lines are kept as the last error. */
  #onLine(line: string): boolean {
    const m = SHOWINFO.exec(line);
    if (m) {
      this.#stamps.push(secondsToStamp(m[3]!));
      return true;
    }
    const text = line.trim();
    if (text && /error|invalid|failed|refused|not found|no such|unable|could not/i.test(text)) this.#lastError = text.slice(0, 300);
    return false;
  }
}

const SOI = Buffer.from([0xff, 0xd8]);
const EOI = Buffer.from([0xff, 0xd9]);

/** '12.345678' → { sec: 12, nanosec: 345678000 }, exactly (no float). */
function secondsToStamp(text: string): Stamp {
  const negative = text.startsWith('-');
  const [whole = '0', fraction = ''] = (negative ? text.slice(1) : text).split('.');
  const nanos = BigInt(whole) * 1_000_000_000n + BigInt((fraction + '000000000').slice(0, 9));
  const total = negative ? -nanos : nanos;
  const sec = total >= 0n ? total / 1_000_000_000n : -((-total + 999_999_999n) / 1_000_000_000n);
  return { sec: Number(sec), nanosec: Number(total - sec * 1_000_000_000n) };
}

/** Resolves true after `ms`, or false as soon as `signal` fires. */
function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve(true);
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
