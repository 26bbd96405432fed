// `percept run` with a recording that fails for real: a 64 KiB tmpfs fills up (ENOSPC). The failure is said at
// once (an error event of stage 'recorder' on the events topic, the log), the run stops by default with exit
// code 1 and the reason, or runs on unrecorded with recorder.onError "continue"; either way the summary's
// `recorder` says when it failed and what was written and lost. A start that fails loading the models leaves
// no recording behind. Needs mount(8) for the tmpfs (root or CAP_SYS_ADMIN): those tests skip, saying so, without it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Subscriber } from 'zeromq';
import { freePort } from '../support/fixtures.ts';

const root = new URL('../..', import.meta.url).pathname;
const dir = join(root, '.cache', 'test-recorder-failure');
const mnt = join(dir, 'tiny-fs');
const bin = join(root, 'tools/percept.mjs');

function config(endpoint: string, recorder: Record<string, unknown>): Record<string, unknown> {
  return {
    encoder: { kind: 'projection', seed: 1, tokens: 16 },
    decoder: { model: 'synth:gemma4-tiny', nCtx: 2048 },
    actions: { schema: join(root, 'configs/actions/robot-action.schema.json') },
    publisher: { endpoint, topic: 'actions' },
    budgets: { endToEndMs: 3_600_000, stages: {}, dropPredictedMiss: false },
    edges: { default: { policy: 'latest' } },
    ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 128, draft: true, frameSkip: 0 }, rungs: [] },
    telemetry: { liveTable: 'off', intervalMs: 200 },
    recorder: { enabled: true, chunkMs: 50, ...recorder },
  };
}

/** Runs `percept run` to its exit, with a subscriber on every topic from before it starts. */
async function run(name: string, recorder: Record<string, unknown>, source: string, extra: Record<string, unknown> = {}) {
  const endpoint = `tcp://127.0.0.1:${await freePort()}`;
  const configPath = join(dir, `${name}.json`);
  writeFileSync(configPath, JSON.stringify({ ...config(endpoint, recorder), ...extra }));
  const summaryPath = join(dir, `${name}.summary.json`);
  const sub = new Subscriber({ linger: 0 });
  sub.connect(endpoint);
  sub.subscribe('events');
  const events: { type: string; stage?: string; message?: string; summary?: Record<string, unknown> }[] = [];
  const loop = (async () => {
    for await (const frames of sub) events.push(JSON.parse(frames[2]!.toString()));
  })().catch(() => undefined);
  const child = spawn(process.execPath, [bin, 'run', '--config', configPath, '--source', source, '--json-summary', summaryPath], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const code = await new Promise<number | null>((resolve) => child.on('exit', (c, signal) => resolve(c ?? (signal ? -1 : null))));
  // The publisher lingers on close, so what it sent arrives; wait until the end event has (or a while, if never).
  for (let i = 0; i < 50 && !events.some((e) => e.type === 'end'); i++) await new Promise((r) => setTimeout(r, 100));
  sub.close();
  await loop;
  const summary = existsSync(summaryPath) ? JSON.parse(readFileSync(summaryPath, 'utf8')) : undefined;
  return { code, output, events, summary };
}

let mounted: string | undefined;
before(() => {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(mnt, { recursive: true });
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', mnt], { stdio: 'pipe' });
    mounted = mnt;
  } catch (err) {
    mounted = undefined;
    skipWhy = `mount -t tmpfs is not permitted here (needs root or CAP_SYS_ADMIN): ${(err as Error).message.split('\n')[0]}`;
  }
});
let skipWhy = '';
after(() => {
  if (mounted) execFileSync('umount', [mounted]);
  rmSync(dir, { recursive: true, force: true });
});

describe('percept run: a recording that fails', { timeout: 600_000 }, () => {
  test('on a full disk the run stops at once (onError stop, the default), exits 1 saying why, and every subscriber is told', async (t) => {
    if (!mounted) return t.skip(skipWhy);
    const path = join(mnt, 'stop.mcap');
    // 3000 frames at 30 fps would take 100 s: the run must stop long before.
    const r = await run('stop', { path }, 'pattern:30:3000');
    assert.equal(r.code, 1, r.output);
    assert.match(
      r.output,
      /percept: recorder: recorder .*stop\.mcap: .* failed: ENOSPC.*\(\d+ bytes lost so far, \d+ written; stopping the run\)/,
    );
    assert.match(r.output, /the recording failed, so the run stopped: .*ENOSPC/);
    assert.match(r.output, /recording FAILED at \d+ ms \(run stopped\)/);
    const error = r.events.find((e) => e.type === 'error' && e.stage === 'recorder');
    assert.ok(error, `an error event of stage recorder: ${JSON.stringify(r.events.map((e) => e.type))}`);
    assert.match(error.message!, /ENOSPC.*bytes lost so far/);
    assert.equal(r.events.at(-1)?.type, 'end', 'the end event follows');
    assert.ok(r.events.indexOf(error) < r.events.length - 1);
    assert.equal(r.summary.stopReason, 'recorder failed');
    assert.ok(r.summary.frames.in < 3000, `stopped early: ${r.summary.frames.in} frames`);
    const rec = r.summary.recorder;
    assert.equal(rec.ok, false);
    assert.equal(rec.onError, 'stop');
    assert.match(rec.error, /ENOSPC/);
    assert.ok(typeof rec.failedAtMs === 'number' && rec.failedAtMs >= 0);
    assert.ok(rec.bytesWritten > 0 && rec.bytesWritten <= 64 * 1024, JSON.stringify(rec));
    assert.ok(rec.bytesLost > 0, JSON.stringify(rec));
    assert.deepEqual(r.events.at(-1)!.summary!.recorder, rec, 'the end event carries it too');
    rmSync(path, { force: true });
  });

  test('with onError "continue" the run goes on unrecorded to its end, and says so', async (t) => {
    if (!mounted) return t.skip(skipWhy);
    const path = join(mnt, 'continue.mcap');
    const r = await run('continue', { path, onError: 'continue' }, 'pattern:30:60');
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, /the run continues unrecorded/);
    assert.match(r.output, /the recording failed: .*ENOSPC/);
    assert.equal(r.summary.endReason, 'source_end');
    assert.equal(r.summary.frames.in, 60);
    assert.equal(r.summary.recorder.ok, false);
    assert.equal(r.summary.recorder.onError, 'continue');
    assert.ok(r.events.some((e) => e.type === 'error' && e.stage === 'recorder'));
    rmSync(path, { force: true });
  });

  test('a start that fails loading the models leaves no recording behind', async () => {
    const path = join(dir, 'never.mcap');
    const r = await run('no-model', { path }, 'pattern:10:3', {
      decoder: { model: join(dir, 'no-such-model.gguf'), nCtx: 2048 },
    });
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, /no-such-model\.gguf/);
    assert.equal(existsSync(path), false, 'no empty recording');
  });

  test('a recorder path under /proc is refused at start, naming why', async () => {
    const r = await run('proc', { path: '/proc/self/percept.mcap' }, 'pattern:10:3');
    assert.equal(r.code, 1, r.output);
    assert.match(r.output, /recorder: cannot create \/proc\/self\/percept\.mcap: \/proc\/ is a kernel filesystem/);
    assert.doesNotMatch(r.output, /decoder:|publishing/, 'nothing was loaded or bound');
  });
});
