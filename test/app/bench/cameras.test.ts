// `percept bench cameras` as a user runs it, on the tiny decoder with the projection encoder: its JSON and its printed table carry the
// engine's ceiling for the run's shape (ceiling_actions_per_s raw and capped, ceiling_share), positive and
// finite, with share = actions/s ÷ the capped ceiling; and where the decoder's time went, over one lane or two. No speed is asserted: the machine may be loaded.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { promisify } from 'node:util';
import { describe, test } from 'node:test';
import type { BenchCamerasResult } from '../../../app/bench/cameras.ts';
import { ceilingActionsPerS } from '../../../app/bench/ceiling.ts';
import { CUDA_PATCH_DEFAULTS, cudaMatmuls } from '../../../native/binding.ts';
import { REPO_ROOT } from '../../support/fixtures.ts';

const run = promisify(execFile);
// A budget far above any decode, so even a loaded machine completes actions (the ceiling needs one).
const ARGS = ['--cameras', '2', '--fps', '4', '--seconds', '3', '--image-tokens', '70', '--budget-ms', '10000'];

async function benchCameras(extra: string[]): Promise<string> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', 'app/cli.ts', 'bench', 'cameras', ...ARGS, ...extra], {
    cwd: REPO_ROOT,
    timeout: 300_000,
    maxBuffer: 16 << 20,
  });
  return stdout;
}

const positive = (x: unknown, what: string): number => {
  assert.ok(typeof x === 'number' && Number.isFinite(x) && x > 0, `${what} is ${String(x)}`);
  return x;
};

describe('bench cameras: the engine ceiling', () => {
  test('the JSON has the ceiling, raw and capped, and actions/s as a share of it', async () => {
    const r = JSON.parse(await benchCameras(['--json'])) as BenchCamerasResult;
    const capped = positive(r.ceiling_actions_per_s, 'ceiling_actions_per_s');
    const raw = positive(r.ceiling_actions_per_s_uncapped, 'ceiling_actions_per_s_uncapped');
    const share = positive(r.ceiling_share, 'ceiling_share');
    const c = r.ceiling!;
    for (const key of [
      'prompt_tokens',
      'action_steps',
      'action_tokens',
      'ubatch',
      'prefill_ms',
      'step_ms',
      'prefill_tok_per_s',
      'offered_per_s',
    ] as const)
      positive(c[key], `ceiling.${key}`);
    assert.equal(c.cameras, 2);
    assert.ok(c.prompt_tokens > 70, 'a frame prefills its image rows and its text');
    assert.ok(c.offered_per_s >= 2 * 4, 'the offered rate is at least cameras × fps');
    assert.equal(c.actions_per_s, capped);
    assert.equal(c.actions_per_s_uncapped, raw);
    // The formula, to the figures' rounding.
    const formula = ceilingActionsPerS(c.cameras, c.prefill_ms, c.step_ms, c.action_steps);
    assert.ok(Math.abs(formula - raw) <= 1e-3 * Math.max(1, raw), `${formula} against ${raw}`);
    assert.ok(Math.abs(capped - Math.min(raw, c.offered_per_s)) <= 1e-3, `capped ${capped}, raw ${raw}, offered ${c.offered_per_s}`);
    assert.ok(Math.abs(share - r.actions_per_s / capped) <= 1e-3, `share ${share} against ${r.actions_per_s} / ${capped}`);
    // Where the shared decoder's time went: its steps are its parts, and with its holds they fit the run's wall time.
    const t = r.decoder_time_ms!;
    for (const key of ['wall', 'steps', 'step_count', 'groups', 'token_decode'] as const) positive(t[key], `decoder_time_ms.${key}`);
    assert.ok(t.groups <= t.step_count, 'a group takes a step at least');
    const parts = t.image_decode + t.token_decode + t.sample + t.other_in_step;
    assert.ok(Math.abs(parts - t.steps) <= 0.5, `parts ${parts} against steps ${t.steps}`);
    assert.ok(t.image_decode >= 0 && t.sample >= 0 && t.other_in_step >= -0.5 && t.hold >= 0, JSON.stringify(t));
    assert.ok(Math.abs(t.steps + t.hold + t.idle - t.wall) <= 0.5 || t.idle === 0, JSON.stringify(t));
    // What the decodes bought: each token decode covers a sequence at least and a row for each.
    positive(t.image_decodes, 'image_decodes');
    assert.ok(t.image_decodes <= t.step_count && t.token_decodes <= t.step_count, JSON.stringify(t));
    assert.ok(positive(t.token_seqs_mean!, 'token_seqs_mean') <= t.token_rows_mean!, JSON.stringify(t));
    assert.ok(t.token_seqs_mean! <= 2, 'two cameras at most in a token decode');
    assert.ok(t.token_reused <= t.token_decodes, JSON.stringify(t));
    assert.ok(Math.abs(t.image_decode_mean! * t.image_decodes - t.image_decode) <= 0.05 * t.image_decodes + 0.5, JSON.stringify(t));
    // Steps are not mixed by default (test/native/batch.test.ts mixes them).
    assert.equal(r.mix_steps, false, 'batching.mixSteps is off by default');
    assert.equal(r.join_running, true, 'batching.joinRunning is on by default');
    assert.deepEqual([t.mixed_decodes, t.mixed_token_rows_mean], [0, null], JSON.stringify(t));
    positive(r.encoder_busy_ms, 'encoder_busy_ms');
    const a = r.action_steps!;
    assert.ok(positive(a.p50, 'action_steps.p50') <= a.p90 && a.p90 <= a.max, JSON.stringify(a));
    assert.ok(c.action_steps <= a.max, `the ceiling's steps, their mean rounded up (${c.action_steps}), at most the longest`);
    assert.equal(r.decoder_threads, availableParallelism(), "the decoder's threads: every core unless --threads names them");
    // No layer on a GPU: the per-layer embedding table stays in host memory, in the run and in its ceiling.
    assert.deepEqual([r.per_layer_embeddings_on_gpu, c.per_layer_embeddings_on_gpu], [false, false]);
    // The matmul paths it ran under: the loader's defaults where this environment names none.
    const env = process.env;
    assert.deepEqual(
      r.cuda_matmuls,
      cudaMatmuls(Object.fromEntries(Object.entries(CUDA_PATCH_DEFAULTS).map(([name, value]) => [name, env[name] ?? value]))),
    );
  });

  test('the printed table has the same fields', async () => {
    const table = await benchCameras([]);
    const line = (key: string): number => {
      const found = table.split('\n').find((l) => l.startsWith(`${key} `));
      assert.ok(found, `no line ${key} in:\n${table}`);
      return Number(found.slice(key.length).trim());
    };
    const share = positive(line('ceiling_share'), 'ceiling_share');
    const capped = positive(line('ceiling_actions_per_s'), 'ceiling_actions_per_s');
    positive(line('ceiling_actions_per_s_uncapped'), 'ceiling_actions_per_s_uncapped');
    // The table prints three decimals.
    assert.ok(Math.abs(share - line('actions_per_s') / capped) <= 2e-3 * Math.max(1, share));
  });

  test('with --step-rows, every token decode is padded to a row per camera and a multiple of the rows, and reuses its graph (groups not joined)', async () => {
    const r = JSON.parse(
      await benchCameras(['--json', '--no-ceiling', '--cameras', '4', '--step-rows', '8', '--threads', '1', '--join-running', 'off']),
    ) as BenchCamerasResult;
    assert.equal(r.step_rows, 8);
    assert.equal(r.join_running, false, '--join-running off sets batching.joinRunning');
    assert.equal(r.decoder_time_ms!.joins, 0, 'no frame went in beside a running group');
    assert.equal(r.decoder_threads, 1, '--threads sets decoder.threads');
    for (const [id, c] of Object.entries(r.per_camera)) positive(c.frames_out, `camera ${id} frames_out`);
    const t = r.decoder_time_ms!;
    // The rows count the padding; the cameras a decode covers do not.
    assert.ok(t.token_rows_mean! >= 8, `rows a decode: ${t.token_rows_mean}`);
    assert.ok(positive(t.token_seqs_mean!, 'token_seqs_mean') <= 4, JSON.stringify(t));
    // A frame's image decode between two token decodes makes the next one build anew, and how often frames come between
    // steps depends on the machine's load; so only that some reuse happens is asserted.
    assert.ok(
      t.token_reused > 0 && t.token_reused <= t.token_decodes,
      `${t.token_reused} of ${t.token_decodes} token decodes reused the graph`,
    );
  });

  test('with --admit adaptive, the decoder weighs each admission beside a running group and counts what it chose', async () => {
    const r = JSON.parse(await benchCameras(['--json', '--no-ceiling', '--cameras', '4', '--admit', 'adaptive'])) as BenchCamerasResult;
    assert.equal(r.admit, 'adaptive');
    for (const [id, c] of Object.entries(r.per_camera)) positive(c.frames_out, `camera ${id} frames_out`);
    const t = r.decoder_time_ms!;
    // Four cameras at 4 fps keep the tiny decoder busy: frames arrive while others generate, and each such step is weighed.
    positive(t.tail_joins + t.tail_holds, `tail joins ${t.tail_joins} + holds ${t.tail_holds}`);
  });

  test('with lanes, each lane decodes its own cameras, and the times are summed over the lanes', async () => {
    const r = JSON.parse(await benchCameras(['--json', '--no-ceiling', '--cameras', '4', '--lanes', '2'])) as BenchCamerasResult;
    assert.equal(r.lanes, 2);
    assert.equal(Object.keys(r.per_camera).length, 4);
    for (const [id, c] of Object.entries(r.per_camera)) positive(c.frames_out, `camera ${id} frames_out`);
    const t = r.decoder_time_ms!;
    assert.ok(t.token_seqs_mean! <= 2, `two cameras a lane, so two at most in a token decode: ${t.token_seqs_mean}`);
    assert.ok(Math.abs(t.steps + t.hold + t.idle - 2 * t.wall) <= 1 || t.idle === 0, JSON.stringify(t));
  });
});
