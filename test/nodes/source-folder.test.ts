import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { createFolderSource } from '../../nodes/source-folder.ts';
import { encodePatternFrame } from '../../nodes/source-pattern.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { isRejection, type SourceItem, type SourceRejection } from '../../pipeline/types.ts';
import { MS, isItem, root, takeAll } from '../support/sources.ts';

const cache = join(root, '.cache/test-source-folder');

before(() => {
  rmSync(cache, { recursive: true, force: true });
  mkdirSync(cache, { recursive: true });
});

describe('folder source', () => {
  test('JPEG and PNG files in numeric name order, typed by content; a file that is not an image is a rejected frame', async () => {
    const dir = join(cache, 'frames');
    mkdirSync(dir, { recursive: true });
    const jpeg = await encodePatternFrame(2, 64, 64);
    const png = await sharp(Buffer.alloc(64 * 64 * 3, 90), { raw: { width: 64, height: 64, channels: 3 } })
      .png()
      .toBuffer();
    writeFileSync(join(dir, 'frame10.jpg'), jpeg);
    writeFileSync(join(dir, 'frame2.png'), png);
    writeFileSync(join(dir, 'frame1.JPEG'), jpeg);
    writeFileSync(join(dir, 'frame3.jpg'), 'not really a jpeg');
    writeFileSync(join(dir, 'notes.txt'), 'ignored');
    const issues: string[] = [];
    const source = await createFolderSource({ path: dir, fps: 5, onIssue: (i) => issues.push(i.file) });
    assert.deepEqual(source.files, ['frame1.JPEG', 'frame2.png', 'frame3.jpg', 'frame10.jpg']);
    const clock = new VirtualClock();
    const items = await takeAll(source, clock, 100);
    assert.deepEqual(
      items.map((it) => (isRejection(it) ? it.rejected : it.payload.encoding)),
      ['jpeg', 'png', 'not a JPEG or PNG file', 'jpeg'],
    );
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 200n * MS, 400n * MS, 600n * MS],
      'the rejected file keeps its slot',
    );
    assert.match((items[2] as SourceRejection).detail!, /frame3\.jpg: not a JPEG or PNG file \(17 bytes, starts 6e6f7420\)/);
    assert.deepEqual(Buffer.from((items[1] as SourceItem<CameraFrame>).payload.data), png);
    assert.deepEqual(issues, ['frame3.jpg']);
    assert.deepEqual(source.counters, { read: 4, yielded: 3, bad: 1 });
    assert.equal(items[0].sourceId, `folder:${dir}`);
  });

  test('loops, and stops on the signal', async () => {
    const dir = join(cache, 'loop');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'a.jpg'), await encodePatternFrame(0, 64, 64));
    writeFileSync(join(dir, 'b.jpg'), await encodePatternFrame(1, 64, 64));
    const source = await createFolderSource({ path: dir, fps: 10, loop: true, id: 'loop' });
    const controller = new AbortController();
    const items: SourceItem<CameraFrame>[] = [];
    for await (const item of source.frames(new VirtualClock(), controller.signal)) {
      assert.ok(isItem(item));
      items.push(item);
      if (items.length === 5) controller.abort();
    }
    assert.equal(items.length, 5);
    assert.deepEqual(
      items.map((it) => it.captureNs),
      [0n, 100n, 200n, 300n, 400n].map((ms) => ms * MS),
    );
    assert.deepEqual(items[2].payload.data, items[0].payload.data);
  });

  test('fatal folder errors name the path', async () => {
    await assert.rejects(createFolderSource({ path: join(cache, 'nope'), fps: 1 }), /cannot list .*nope/);
    const empty = join(cache, 'empty');
    mkdirSync(empty, { recursive: true });
    await assert.rejects(createFolderSource({ path: empty, fps: 1 }), /empty has no \.jpg, \.jpeg or \.png files/);
    await assert.rejects(createFolderSource({ path: empty, fps: -1 }), /finite number > 0 for fps/);
  });
});
