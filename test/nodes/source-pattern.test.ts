import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPatternSource, encodePatternFrame, readPatternCounter } from '../../nodes/source-pattern.ts';
import { RealClock, VirtualClock } from '../../pipeline/clock.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import type { SourceItem } from '../../pipeline/types.ts';
import { MS, decodeRgb, take } from '../support/sources.ts';

describe('pattern source', () => {
  test('on a VirtualClock: frames at i/fps, clock advanced, counter readable, JPEG decodes at size', async () => {
    const clock = new VirtualClock(1_000n, 1_700_000_000_000);
    const source = createPatternSource({ fps: 10, frames: 5, width: 320, height: 180, id: 'pat' });
    const seen: bigint[] = [];
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of source.frames(clock, new AbortController().signal)) {
      seen.push(clock.nowNs());
      items.push(item);
    }
    assert.equal(items.length, 5, 'stops at `frames`');
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 100n, 200n, 300n, 400n].map((ms) => 1_000n + ms * MS),
    );
    assert.deepEqual(
      seen,
      items.map((it) => it.captureNs),
      'the clock is at the capture time when the item is yielded',
    );
    assert.deepEqual(
      items.map((it) => it.captureWallMs),
      [0, 100, 200, 300, 400].map((ms) => 1_700_000_000_000 + ms),
    );
    for (const [i, item] of items.entries()) {
      assert.equal(item.sourceId, 'pat');
      assert.equal(item.payload.encoding, 'jpeg');
      const rgb = await decodeRgb(item.payload);
      assert.deepEqual([rgb.width, rgb.height], [320, 180]);
      assert.equal(readPatternCounter(rgb.data, rgb.width, rgb.height), i);
    }
    assert.deepEqual(source.counters, { yielded: 5, late: 0 });
  });

  test('on a VirtualClock that a slow consumer moved past the due time, capture stamps stay at the due time', async () => {
    const clock = new VirtualClock(0n, 1_000);
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of createPatternSource({ fps: 10, frames: 3, width: 64, height: 64 }).frames(
      clock,
      new AbortController().signal,
    )) {
      items.push(item);
      clock.advance(250n * MS); // the consumer spends 250 ms of virtual time per frame
    }
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 100n * MS, 200n * MS],
    );
    assert.deepEqual(
      items.map((it) => it.captureWallMs),
      [1_000, 1_100, 1_200],
    );
  });

  test('each frame is encoded ahead, while the one before it is consumed: it exists at its capture time', async () => {
    const clock = new VirtualClock(0n, 0);
    const readyNs: bigint[] = [];
    const encode = (i: number, w: number, h: number, q: number): Promise<Buffer> =>
      encodePatternFrame(i, w, h, q).then((data) => {
        clock.advance(30n * MS); // the encode takes 30 ms of this clock
        readyNs[i] = clock.nowNs();
        return data;
      });
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of createPatternSource({ fps: 10, frames: 4, width: 64, height: 64 }, encode).frames(
      clock,
      new AbortController().signal,
    )) {
      items.push(item);
    }
    // The schedule starts once frame 0 exists (30 ms); each later frame was encoded during the wait
    // for its due time, so its capture is its due time and its bytes were there by then (encoded
    // after the capture, as this source used to, frame i would be ready 30 ms after it).
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [30n, 130n, 230n, 330n].map((ms) => ms * MS),
    );
    items.forEach((it, i) => assert.ok(readyNs[i]! <= it.captureNs, `frame ${i} ready at ${readyNs[i]}, captured at ${it.captureNs}`));
    for (const [i, item] of items.entries()) {
      const rgb = await decodeRgb(item.payload);
      assert.equal(readPatternCounter(rgb.data, rgb.width, rgb.height), i);
    }
  });

  test('stopped early, the frame encoded ahead settles and its failure is not raised', async () => {
    const controller = new AbortController();
    const encode = (i: number, w: number, h: number, q: number): Promise<Buffer> =>
      i === 0 ? encodePatternFrame(i, w, h, q) : Promise.reject(new Error(`frame ${i} was never needed`));
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of createPatternSource({ fps: 10, frames: 5, width: 64, height: 64 }, encode).frames(
      new VirtualClock(),
      controller.signal,
    )) {
      items.push(item);
      controller.abort();
    }
    assert.equal(items.length, 1);
    // Not stopped, the same failure ends the source with it.
    const all = createPatternSource({ fps: 10, frames: 5, width: 64, height: 64 }, encode).frames(
      new VirtualClock(),
      new AbortController().signal,
    );
    await assert.rejects(async () => {
      for await (const item of all) items.push(item);
    }, /frame 1 was never needed/);
  });

  test('frame i is deterministic, and consecutive frames differ (the box moves)', async () => {
    const a = await encodePatternFrame(7, 320, 180);
    const b = await encodePatternFrame(7, 320, 180);
    const c = await encodePatternFrame(8, 320, 180);
    assert.deepEqual(a, b);
    assert.notDeepEqual(a, c);
    const rgb = await decodeRgb({ encoding: 'jpeg', data: await encodePatternFrame(40_000, 640, 360) });
    assert.equal(readPatternCounter(rgb.data, 640, 360), 40_000);
  });

  test('on a RealClock: paced from the start time, never early', async () => {
    const clock = new RealClock();
    const fps = 100;
    const period = 10n * MS;
    const startNs = clock.nowNs();
    const items = await take(createPatternSource({ fps, frames: 8, width: 64, height: 64 }), clock, 100);
    assert.equal(items.length, 8);
    items.forEach((it, i) => {
      // The schedule starts at the first pull (>= startNs), so each frame is due no earlier than this.
      assert.ok(
        it.captureNs >= startNs + BigInt(i) * period,
        `frame ${i} captured ${it.captureNs - startNs - BigInt(i) * period} ns early`,
      );
    });
  });

  test('stops when the signal fires', async () => {
    const controller = new AbortController();
    const source = createPatternSource({ fps: 1000, frames: Infinity, width: 64, height: 64 });
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of source.frames(new RealClock(), controller.signal)) {
      items.push(item);
      if (items.length === 3) controller.abort();
    }
    assert.equal(items.length, 3);
  });

  test('validates its options', () => {
    const ok = { fps: 10, frames: 5, width: 320, height: 180 };
    const cases: Array<[object, RegExp]> = [
      [{ ...ok, fps: 0 }, /finite number > 0 for fps/],
      [{ ...ok, frames: 1.5 }, /positive integer or Infinity for frames/],
      [{ ...ok, width: 10 }, /between 64 and 8192 for width/],
      [{ ...ok, quality: 101 }, /between 1 and 100 for quality/],
      [{ ...ok, id: '' }, /non-empty string for id/],
    ];
    for (const [options, re] of cases) assert.throws(() => createPatternSource(options as never), re);
  });
});
