// The ffmpeg source on Debian's ffmpeg: a generated video file (frames and stream timestamps), a
// local MJPEG stream served over HTTP by a second ffmpeg on loopback, a killed ffmpeg that is
// restarted (counted, reported), one that keeps failing until the source gives up, and a frame
// ffmpeg did not finish (a rejected frame).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import sharp from 'sharp';
import { createFfmpegSource, type FfmpegSource } from '../../nodes/source-ffmpeg.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { isRejection, type SourceIncident, type SourceItem, type SourceRejection } from '../../pipeline/types.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { freePort } from '../support/fixtures.ts';

const root = new URL('../..', import.meta.url).pathname;
const dir = join(root, '.cache', 'source-ffmpeg');
const video = join(dir, 'testsrc-10fps-2s.mkv');

/** Reads a source until `until` says stop (or it ends), collecting frames, rejections and incidents. */
async function read(
  source: FfmpegSource,
  until: (items: SourceItem<CameraFrame>[], incidents: SourceIncident[]) => boolean,
): Promise<{ items: SourceItem<CameraFrame>[]; rejections: SourceRejection[]; incidents: SourceIncident[] }> {
  const abort = new AbortController();
  const items: SourceItem<CameraFrame>[] = [];
  const rejections: SourceRejection[] = [];
  const incidents: SourceIncident[] = [];
  for await (const item of source.frames(new RealClock(), abort.signal, (i) => incidents.push(i))) {
    if (isRejection(item)) rejections.push(item);
    else items.push(item);
    if (until(items, incidents)) abort.abort();
  }
  return { items, rejections, incidents };
}

describe('ffmpeg source', () => {
  const children: ChildProcess[] = [];
  before(() => {
    mkdirSync(dir, { recursive: true });
    const made = spawnSync(
      'ffmpeg',
      ['-hide_banner', '-loglevel', 'error', '-y', '-f', 'lavfi', '-i', 'testsrc=size=160x120:rate=10', '-t', '2', '-c:v', 'mpeg4', video],
      { encoding: 'utf8' },
    );
    assert.equal(made.status, 0, `ffmpeg could not make the test video (is Debian's ffmpeg installed?): ${made.stderr}`);
  });
  after(() => {
    for (const child of children) child.kill('SIGKILL');
  });

  test('a video file: every frame as a JPEG with the stream time as its stamp; a clean end ends the source', async () => {
    const source = createFfmpegSource({ url: video, width: 80 });
    const { items, rejections, incidents } = await read(source, () => false);
    assert.equal(items.length, 20);
    assert.deepEqual(rejections, []);
    assert.deepEqual(
      items.map((i) => i.sourceStamp),
      items.map((_, k) => ({ sec: Math.floor(k / 10), nanosec: (k % 10) * 100_000_000 })),
    );
    const meta = await sharp(items[0]!.payload.data).metadata();
    assert.deepEqual([meta.format, meta.width, meta.height], ['jpeg', 80, 60]);
    assert.equal(items[0]!.sourceId, `ffmpeg:${video}`);
    assert.deepEqual(
      incidents.map((i) => i.kind),
      ['exit'],
    );
    assert.deepEqual(source.counters, { frames: 20, restarts: 0, unstamped: 0, rejected: 0 });
    assert.equal(source.pid, undefined, 'no ffmpeg left running');
  });

  test('a local MJPEG stream over HTTP from a second ffmpeg (the source retries until the server listens)', async () => {
    const port = await freePort();
    const url = `http://127.0.0.1:${port}/camera`;
    const server = spawn(
      'ffmpeg',
      [
        '-hide_banner',
        '-loglevel',
        'error',
        '-re',
        '-f',
        'lavfi',
        '-i',
        'testsrc=size=160x120:rate=15',
        '-c:v',
        'mjpeg',
        '-q:v',
        '5',
        '-f',
        'mpjpeg',
        '-listen',
        '1',
        url,
      ],
      { stdio: 'ignore' },
    );
    children.push(server);
    const source = createFfmpegSource({
      url,
      inputFormat: 'mpjpeg',
      restart: 'always',
      backoffMs: 100,
      maxBackoffMs: 400,
      maxRestarts: 50,
    });
    const { items } = await read(source, (got) => got.length === 10);
    assert.equal(items.length, 10);
    for (const item of items) assert.deepEqual([...item.payload.data.subarray(0, 2)], [0xff, 0xd8]);
    const stamps = items.map((i) => i.sourceStamp!.sec * 1e9 + i.sourceStamp!.nanosec);
    assert.ok(
      stamps.every((s, k) => k === 0 || s > stamps[k - 1]!),
      `stamps increase: ${stamps.join(', ')}`,
    );
    server.kill('SIGKILL');
  });

  test('a killed ffmpeg is restarted: counted, reported as an incident, and frames resume', async () => {
    const source = createFfmpegSource({
      url: 'testsrc=size=160x120:rate=20',
      inputFormat: 'lavfi',
      realtime: true,
      backoffMs: 50,
    });
    let killed: number | undefined;
    const { items, incidents } = await read(source, (got, seen) => {
      if (got.length === 5) {
        killed = source.pid;
        process.kill(killed!, 'SIGKILL');
      }
      return seen.length > 0 && got.length >= 10;
    });
    assert.ok(killed);
    assert.equal(incidents.length, 1);
    assert.equal(incidents[0]!.kind, 'restart');
    assert.match(incidents[0]!.detail, /ffmpeg was killed \(SIGKILL\).*restart 1 in 50 ms/);
    assert.equal(source.counters.restarts, 1);
    assert.ok(items.length >= 10);
    assert.equal(source.pid, undefined, 'stopping the source stops its ffmpeg');
  });

  test('an input that keeps failing: restarts with backoff, then the source fails naming the cause', async () => {
    const source = createFfmpegSource({ url: join(dir, 'missing.mkv'), maxRestarts: 2, backoffMs: 10 });
    const incidents: SourceIncident[] = [];
    await assert.rejects(
      (async () => {
        for await (const _ of source.frames(new RealClock(), new AbortController().signal, (i) => incidents.push(i)))
          assert.fail('no frame expected');
      })(),
      /exited with code 1 3 times in a row without a frame; last error: .*No such file or directory/,
    );
    assert.deepEqual(
      incidents.map((i) => i.kind),
      ['restart', 'restart'],
    );
    assert.match(incidents[0]!.detail, /^ffmpeg exited with code 1 \(.*No such file or directory\); restart 1 in 10 ms$/);
    assert.match(incidents[1]!.detail, /; restart 2 in 20 ms$/, 'the backoff doubles');
  });

  test('a frame ffmpeg did not finish is a rejected frame, not lost', async () => {
    // A stand-in for ffmpeg: one whole JPEG, then the start of another, then an error exit.
    const frames = join(dir, 'whole-and-half.bin');
    const whole = await sharp({ create: { width: 8, height: 8, channels: 3, background: '#808080' } })
      .jpeg()
      .toBuffer();
    writeFileSync(frames, Buffer.concat([whole, whole.subarray(0, 100)]));
    const fake = join(dir, 'fake-ffmpeg.sh');
    writeFileSync(fake, `#!/bin/sh\ncase "$*" in *-version*) exit 0 ;; esac\ncat '${frames}'\nexit 1\n`);
    chmodSync(fake, 0o755);
    const source = createFfmpegSource({ url: 'camera.mkv', ffmpegPath: fake, restart: 'never' });
    const items: (SourceItem<CameraFrame> | SourceRejection)[] = [];
    const incidents: SourceIncident[] = [];
    await assert.rejects(async () => {
      for await (const item of source.frames(new RealClock(), new AbortController().signal, (i) => incidents.push(i))) items.push(item);
    }, /ffmpeg exited with code 1/);
    assert.deepEqual(
      items.map((i) => (isRejection(i) ? i.rejected : i.payload.encoding)),
      ['jpeg', 'unfinished JPEG'],
    );
    assert.equal((items[1] as SourceRejection).detail, 'camera.mkv: ffmpeg ended 100 bytes into a frame');
    assert.deepEqual(
      incidents.map((i) => i.kind),
      ['exit'],
    );
    assert.deepEqual(source.counters, { frames: 1, restarts: 0, unstamped: 1, rejected: 1 });
  });
});
