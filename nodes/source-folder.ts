// source-folder: the JPEG and PNG files of one folder at a fixed fps, in numeric-aware name order (frame2 before frame10).
// It can loop. A file's type is read from its first bytes, not its extension.
// A file that vanished or is not an image is a rejected frame. A missing folder, or one without images, is fatal.
// Pacing as source-pattern: frame i is due at start + i/fps, without drift; a VirtualClock is advanced.
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Clock } from '../pipeline/clock.ts';
import type { CameraFrame } from './payloads.ts';
import type { FrameSource, SourceItem, SourceRejection } from '../pipeline/types.ts';
import { waitUntilDue, wallMsAt } from '../pipeline/pacing.ts';

export interface FolderSourceOptions {
  readonly path: string;
  readonly fps: number;
  readonly loop?: boolean;
  /** FrameSource id (default 'folder:<path>'). */
  readonly id?: string;
  readonly onIssue?: (issue: FolderIssue) => void;
}

export interface FolderIssue {
  readonly file: string;
  readonly reason: string;
}

export interface FolderSourceCounters {
  readonly read: number;
  readonly yielded: number;
  readonly bad: number;
}

export interface FolderSource extends FrameSource<CameraFrame> {
  readonly path: string;
  /** The image files (names) in replay order. */
  readonly files: readonly string[];
  readonly counters: FolderSourceCounters;
  readonly issues: readonly FolderIssue[];
  frames(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection>;
}

const IMAGE_NAME = /\.(jpe?g|png)$/i;
// A fixed locale so the order does not depend on the machine's settings.
const byName = new Intl.Collator('en', { numeric: true, sensitivity: 'variant' }).compare;
const MAX_KEPT_ISSUES = 100;

export async function createFolderSource(options: FolderSourceOptions): Promise<FolderSource> {
  if (options === null || typeof options !== 'object') throw new TypeError('createFolderSource: expected an options object { path, fps }');
  const { path, fps, loop = false, onIssue } = options;
  if (typeof path !== 'string' || path.length === 0)
    throw new TypeError(`createFolderSource: expected a non-empty path but received ${JSON.stringify(path)}`);
  if (typeof fps !== 'number' || !Number.isFinite(fps) || fps <= 0)
    throw new RangeError(`createFolderSource: expected finite number > 0 for fps but received ${fps}`);
  if (typeof loop !== 'boolean') throw new TypeError(`createFolderSource: expected boolean for loop but received ${JSON.stringify(loop)}`);
  let names: string[];
  try {
    names = (await readdir(path, { withFileTypes: true })).filter((e) => e.isFile() && IMAGE_NAME.test(e.name)).map((e) => e.name);
  } catch (err) {
    throw new Error(`folder source: cannot list ${path}: ${(err as Error).message}`, { cause: err });
  }
  if (names.length === 0) throw new Error(`folder source: ${path} has no .jpg, .jpeg or .png files`);
  names.sort(byName);
  const files = Object.freeze(names);
  const id = options.id ?? `folder:${path}`;
  const periodNs = BigInt(Math.round(1e9 / fps));
  const counters = { read: 0, yielded: 0, bad: 0 };
  const issues: FolderIssue[] = [];

  const report = (issue: FolderIssue): void => {
    counters.bad += 1;
    if (issues.length < MAX_KEPT_ISSUES) issues.push(issue);
    onIssue?.(issue);
  };

  async function* generate(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection> {
    const startNs = clock.nowNs();
    let slot = 0;
    do {
      const yieldedBefore = counters.yielded;
      for (const name of files) {
        if (signal.aborted) return;
        counters.read += 1;
        let payload: CameraFrame | undefined;
        let problem: FolderIssue | undefined;
        try {
          payload = toFrame(await readFile(join(path, name)));
        } catch (err) {
          problem = { file: name, reason: (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'file vanished' : (err as Error).message };
          report(problem);
        }
        const dueNs = startNs + BigInt(slot++) * periodNs;
        const captureNs = await waitUntilDue(clock, dueNs, signal);
        if (captureNs === null) return;
        const captureWallMs = wallMsAt(clock, captureNs);
        if (problem) {
          const [cause] = problem.reason.split(' (', 1);
          yield { sourceId: id, captureNs, captureWallMs, rejected: cause!, detail: `${join(path, name)}: ${problem.reason}` };
          continue;
        }
        counters.yielded += 1;
        yield { sourceId: id, captureNs, captureWallMs, payload: payload! };
      }
      // A pass without one good image would loop forever without producing a frame.
      if (counters.yielded === yieldedBefore) return;
    } while (loop && !signal.aborted);
  }

  return {
    id,
    path,
    files,
    get counters(): FolderSourceCounters {
      return { ...counters };
    },
    issues,
    frames: generate,
  };
}

function toFrame(data: Buffer): CameraFrame {
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return { encoding: 'jpeg', data };
  if (data.length >= 8 && data.readUInt32BE(0) === 0x89504e47 && data.readUInt32BE(4) === 0x0d0a1a0a) return { encoding: 'png', data };
  throw new Error(`not a JPEG or PNG file (${data.length} bytes, starts ${data.subarray(0, 4).toString('hex') || '(empty)'})`);
}
