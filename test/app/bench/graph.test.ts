// benchGraph's result is well-formed and counts what it ran (its speed belongs to the benchmark).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { benchGraph } from '../../../app/bench/graph.ts';

test('benchGraph runs every frame through every no-op stage and reports per-hop figures', async () => {
  const result = await benchGraph({ hz: 2000, frames: 200, stages: 3, warmupFrames: 20 });
  assert.equal(result.frames_out + result.frames_dropped, 200);
  assert.ok(result.measured_frames > 0 && result.measured_frames <= result.frames_out - 20, 'warm-up frames are left out');
  for (const key of [
    'hop_overhead_us_p50',
    'hop_overhead_us_p99',
    'stage_wrapper_us_p50',
    'hop_total_us_p99',
    'end_to_end_us_p99',
  ] as const) {
    assert.ok(Number.isFinite(result[key]) && result[key] >= 0, `${key} = ${result[key]}`);
  }
  assert.ok(result.hop_overhead_us_p50 <= result.hop_overhead_us_p99 && result.hop_overhead_us_p99 <= result.hop_overhead_us_max);
  assert.ok(result.hop_total_us_p50 >= result.hop_overhead_us_p50, 'a hop total includes the hop overhead');
  assert.equal(result.meets_goal, result.hop_overhead_us_p99 <= result.goal_hop_overhead_us_p99);
  await assert.rejects(benchGraph({ stages: 1 }), /expected 2 ≤ stages ≤ 64 but received 1/);
});
