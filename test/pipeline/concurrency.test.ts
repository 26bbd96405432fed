// A stage with concurrency N (a remote decoder's requests in flight): the runtime starts up to N calls
// at once, the rest wait on the stage's edge under its policy, outputs leave as calls finish, and
// every frame is still accounted for.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { RealClock, msToNs } from '../../pipeline/clock.ts';
import { chain } from '../../pipeline/graph/chain.ts';
import type { StageContext } from '../../pipeline/types.ts';
import { assertConservation, dropsOf, fakeSource, fakeStage, framesOf, runGraph, testConfig } from '../support/pipeline-fakes.ts';

const ms = (n: number): bigint => msToNs(n);

describe('stage concurrency', () => {
  test('two calls in flight: frames start while an earlier one runs, and none waits that need not', async () => {
    // Service 230 ms, a frame every 100 ms, concurrency 2, queue capacity 2: f0 runs 0–230, f1 100–330,
    // f2 waits and starts when f0 ends (230), f3 at 330, …: each frame starts at the later of its
    // arrival and the end of the call two before it. One call at a time would drop 4 of 10 (see the
    // queue test in pipeline-graph); two keep up.
    const stage = Object.assign(fakeStage<number>('decode'), { concurrency: 2 });
    const result = await runGraph({
      source: fakeSource({ frames: 10, periodMs: 100 }),
      stages: chain(stage),
      config: testConfig({ edges: { default: { policy: 'queue', capacity: 2 } }, virtualServiceMs: { decode: 230 } }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert.deepEqual(dropsOf(result.events), []);
    assert.deepEqual(
      result.outputs.map((o) => o.spans[0]!.enterNs),
      [0, 100, 230, 330, 460, 560, 690, 790, 920, 1020].map(ms),
    );
    assertConservation(result);
  });

  test('beyond the limit frames wait on the edge under its policy (latest: conflated), never in the stage', async () => {
    // Real clock; calls end only when the test releases them. Six frames arrive while two calls hang:
    // the latest-value edge keeps one and conflates the rest.
    const releases: (() => void)[] = [];
    let running = 0;
    let maxRunning = 0;
    const stage = {
      name: 'decode',
      concurrency: 2,
      process: async (frame: number, _ctx: StageContext): Promise<number> => {
        running += 1;
        maxRunning = Math.max(maxRunning, running);
        await new Promise<void>((resolve) => releases.push(resolve));
        running -= 1;
        return frame;
      },
    };
    const result = await runGraph({
      source: fakeSource({ frames: 6, periodMs: 5 }),
      stages: chain(stage),
      config: testConfig({ clock: 'real', edges: { default: { policy: 'latest' } } }),
      clock: new RealClock(),
      onEvent: (event) => {
        // When the last frame has entered, finish the two hung calls, then whatever follows.
        if (event.type === 'frame' && event.frameId === 5) {
          const drain = (): void => {
            const next = releases.shift();
            if (next) next();
            if (releases.length > 0 || running > 0) setTimeout(drain, 5);
          };
          setTimeout(drain, 5);
        }
      },
    });
    assert.equal(maxRunning, 2);
    assert.deepEqual(framesOf(result.outputs), [0, 1, 5]);
    assert.deepEqual(
      dropsOf(result.events).map((d) => [d.frameId, d.reason]),
      [2, 3, 4].map((f) => [f, 'conflated']),
    );
    assertConservation(result);
  });

  test('outputs leave in the order calls finish', async () => {
    // Frame 0 takes 300 ms, frame 1 100 ms, both in flight at once: frame 1 comes out first.
    const stage = Object.assign(fakeStage<number>('decode'), { concurrency: 2 });
    const result = await runGraph({
      source: fakeSource({ frames: 2, periodMs: 10 }),
      stages: chain(stage),
      config: testConfig({ virtualServiceMs: { decode: 0 } }),
    });
    assert.deepEqual(framesOf(result.outputs), [0, 1]); // equal cost: arrival order
    const uneven = Object.assign(fakeStage<number>('decode', { costMs: (frame) => (frame === 0 ? 300 : 100) }), { concurrency: 2 });
    const reordered = await runGraph({ source: fakeSource({ frames: 2, periodMs: 10 }), stages: chain(uneven), config: testConfig() });
    assert.deepEqual(framesOf(reordered.outputs), [1, 0]);
    assertConservation(reordered);
  });

  test('a concurrency that is not an integer ≥ 1 is refused when the graph is made', async () => {
    for (const concurrency of [0, 1.5, -1]) {
      const stage = Object.assign(fakeStage<number>('decode'), { concurrency });
      await assert.rejects(
        runGraph({ source: fakeSource({ frames: 1, periodMs: 1 }), stages: chain(stage), config: testConfig() }),
        new RegExp(`stage 'decode': concurrency must be an integer ≥ 1 but is ${concurrency}`),
      );
    }
  });
});
