// The control socket against a running graph (real clock): each command changes it and replies with
// the status; malformed or out-of-range requests get {ok: false} and change nothing.
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Request } from 'zeromq';
import { startControlServer, type ControlServer } from '../../../app/run/control.ts';
import { RealClock } from '../../../pipeline/clock.ts';
import { chain } from '../../../pipeline/graph/chain.ts';
import { createGraph } from '../../../pipeline/graph/graph.ts';
import type { StageContext } from '../../../pipeline/types.ts';
import { fakeSource, fakeStage, testConfig } from '../../support/pipeline-fakes.ts';

describe('control socket', () => {
  const closers: Array<() => unknown> = [];
  after(async () => {
    for (const c of closers) await c();
  });

  test('status, set_budgets, pin_level/release_level, pause/resume change a running graph; bad requests change nothing', async () => {
    const levels: number[] = [];
    const config = testConfig({
      clock: 'real',
      budgets: { endToEndMs: 60_000, stages: {}, dropPredictedMiss: false },
      ladder: { enabled: false },
      edges: { default: { policy: 'latest' } },
    });
    const work = fakeStage<number>('decode', { work: (f: number, ctx: StageContext) => (levels.push(ctx.frame.degradeLevel), f) });
    const graph = createGraph({
      source: fakeSource({ frames: Infinity, periodMs: 5 }),
      stages: chain(work),
      clock: new RealClock(),
      config,
    });
    const running = graph.run();
    closers.push(() => graph.stop('test'));
    const server: ControlServer = await startControlServer({ endpoint: 'tcp://127.0.0.1:*', curve: null, insecure: false }, graph.control);
    closers.push(() => server.close());
    const req = new Request({ linger: 0, receiveTimeout: 10_000 });
    closers.push(() => req.close());
    req.connect(server.endpoint);
    const ask = async (request: unknown) => {
      await req.send(typeof request === 'string' ? request : JSON.stringify(request));
      const [reply] = await req.receive();
      return JSON.parse(reply!.toString());
    };
    const waitFor = async (what: string, done: () => boolean | Promise<boolean>) => {
      for (let i = 0; i < 2000; i++) {
        if (await done()) return;
        await new Promise((r) => setTimeout(r, 10));
      }
      assert.fail(`timed out waiting for ${what}`);
    };

    const status = await ask({ command: 'status' });
    assert.equal(status.ok, true);
    assert.equal(status.status.state, 'running');
    assert.deepEqual(status.status.budgets, { endToEndMs: 60_000, stages: {} });

    // Malformed or out of range: an error, and nothing changes.
    for (const [bad, why] of [
      ['not json', /not a JSON request/],
      [{ command: 'pin_level', level: 'two' }, /not a control request.*must be integer/],
      [{ command: 'reboot' }, /not a control request/],
      [{ command: 'set_budgets' }, /not a control request/],
      [{ command: 'pin_level', level: 7 }, /level 7 is outside 0\.\.4/],
      [{ command: 'set_budgets', stages: { encode: 5 } }, /no stage 'encode' in this graph/],
    ] as const) {
      const reply = await ask(bad);
      assert.equal(reply.ok, false, JSON.stringify(bad));
      assert.match(reply.error, why);
      assert.equal(reply.status.pinnedLevel, null);
      assert.deepEqual(reply.status.budgets, { endToEndMs: 60_000, stages: {} });
    }
    assert.equal(server.refused, 6);

    const budgets = await ask({ command: 'set_budgets', endToEndMs: 30_000, stages: { decode: 10_000 } });
    assert.deepEqual([budgets.ok, budgets.status.budgets], [true, { endToEndMs: 30_000, stages: { decode: 10_000 } }]);

    const pinned = await ask({ command: 'pin_level', level: 3 });
    assert.deepEqual([pinned.ok, pinned.status.pinnedLevel], [true, 3]);
    await waitFor('a frame at level 3', () => levels.at(-1) === 3);
    assert.equal((await ask({ command: 'status' })).status.level, 3);
    await ask({ command: 'release_level' });
    assert.equal((await ask({ command: 'status' })).status.pinnedLevel, null);

    const paused = await ask({ command: 'pause' });
    assert.equal(paused.status.state, 'paused');
    const inWhilePaused = paused.status.summary.frames.in;
    await new Promise((r) => setTimeout(r, 100));
    assert.equal((await ask({ command: 'status' })).status.summary.frames.in, inWhilePaused, 'no frame admitted while paused');
    const resumed = await ask({ command: 'resume' });
    assert.equal(resumed.status.state, 'running');
    await waitFor('frames after resume', async () => (await ask({ command: 'status' })).status.summary.frames.in > inWhilePaused);

    const summary = await graph.stop('test');
    await running;
    assert.equal(summary.frames.in, summary.frames.out + summary.frames.dropped);
  });
});
