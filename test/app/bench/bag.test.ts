// benchBag's result is well-formed and counts what it ran (its speed belongs to the benchmark).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { benchBag } from '../../../app/bench/bag.ts';

test('benchBag replays every frame of its bag, records every frame it was fed, and reports rates', async () => {
  const result = await benchBag({
    frames: 6,
    width: 320,
    height: 240,
    fps: 20,
    seconds: 0.5,
    reps: 1,
    dir: join(import.meta.dirname, '../../..', '.cache', 'test-bench-bag'),
  });
  assert.equal(result.replay_frames, 6);
  assert.equal(result.record_frames + result.record_frames_not_recorded, 10, 'every frame fed is recorded or counted');
  assert.ok(result.record_chunks >= 1);
  for (const key of [
    'jpeg_kb',
    'replay_fps',
    'replay_mb_s',
    'peer_fps',
    'peer_mb_s',
    'replay_vs_peer',
    'record_max_fps',
    'record_max_mb_s',
  ] as const) {
    assert.ok(Number.isFinite(result[key]) && result[key] > 0, `${key} = ${result[key]}`);
  }
  await assert.rejects(benchBag({ frames: 0 }), /integer >= 1 for frames/);
});
