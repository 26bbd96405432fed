// Helpers of the source tests (test/nodes/source-*.test.ts): reading a source's items, decoding a frame.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import sharp from 'sharp';
import type { Clock } from '../../pipeline/clock.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { isRejection, type FrameSource, type SourceIncident, type SourceItem, type SourceRejection } from '../../pipeline/types.ts';

export const root = new URL('../..', import.meta.url).pathname;
export const sampleBag = join(root, 'bags/sample.mcap');
export const MS = 1_000_000n;

/** Up to `max` items of a source (frames and rejections, in order). */
export async function takeAll<T>(
  source: FrameSource<T>,
  clock: Clock,
  max: number,
  controller = new AbortController(),
  incidents: SourceIncident[] = [],
): Promise<(SourceItem<T> | SourceRejection)[]> {
  const out: (SourceItem<T> | SourceRejection)[] = [];
  for await (const item of source.frames(clock, controller.signal, (i) => incidents.push(i))) {
    out.push(item);
    if (out.length >= max) break;
  }
  return out;
}

/** Up to `max` frames of a source; a rejection fails the test. */
export async function take<T>(
  source: FrameSource<T>,
  clock: Clock,
  max: number,
  controller = new AbortController(),
  incidents: SourceIncident[] = [],
): Promise<SourceItem<T>[]> {
  const items = await takeAll(source, clock, max, controller, incidents);
  const rejected = items.filter(isRejection);
  assert.deepEqual(rejected, [], 'no rejections expected');
  return items.filter(isItem);
}

export async function decodeRgb(frame: CameraFrame): Promise<{ data: Buffer; width: number; height: number }> {
  const { data, info } = await sharp(frame.data).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  return { data, width: info.width, height: info.height };
}

export const isItem = <T>(item: SourceItem<T> | SourceRejection): item is SourceItem<T> => !isRejection(item);
