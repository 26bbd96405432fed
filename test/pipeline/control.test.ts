// GraphControl on a virtual clock (deterministic): new budgets apply to the frames admitted after
// them, a pinned level holds the ladder until released, a paused graph admits nothing until resumed,
// and a request that is out of range throws and changes nothing. Each change is a control event.
import { getEventListeners } from 'node:events';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chain } from '../../pipeline/graph/chain.ts';
import type { Graph } from '../../pipeline/graph/graph.ts';
import type { Knobs, StageContext } from '../../pipeline/types.ts';
import { assertConservation, fakeSource, fakeStage, runGraph, testConfig } from '../support/pipeline-fakes.ts';

interface Seen {
  readonly frame: number;
  readonly budgetMs: number;
  readonly stageBudgetMs: number;
  readonly level: number;
  readonly knobs: Knobs;
}

describe('GraphControl', () => {
  test('pauses leave no listener behind: twenty pause/resume cycles while the source waits warn of nothing', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error): void => void warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
    let cycles = 0;
    let listenersAfter = -1;
    try {
      const result = await runGraph({
        source: fakeSource({ frames: 5, periodMs: 100 }),
        stages: chain(fakeStage<number>('work', { costMs: () => 10 })),
        config: testConfig({ edges: { default: { policy: 'queue', capacity: 40 } } }),
        onOutput: (env, graph) => {
          if (env.frameId !== 1) return;
          // The graph's own shutdown signal, where a paused source waits.
          const signal = (graph as unknown as { shutdown: AbortSignal }).shutdown;
          graph.control.pause();
          void (async () => {
            for (; cycles < 20; cycles++) {
              await sleep(5);
              graph.control.resume();
              graph.control.pause();
            }
            await sleep(5);
            listenersAfter = getEventListeners(signal, 'abort').length;
            graph.control.resume();
          })();
        },
      });
      assertConservation(result);
      assert.equal(result.summary.frames.out, 5);
    } finally {
      process.off('warning', onWarning);
    }
    assert.equal(cycles, 20);
    assert.ok(listenersAfter >= 0 && listenersAfter <= 2, `listeners on the shutdown signal after 20 pauses: ${listenersAfter}`);
    assert.deepEqual(warnings, [], 'no MaxListenersExceededWarning');
  });

  test('budgets, pin/release and pause/resume change the running graph from the next frame on', async () => {
    const seen: Seen[] = [];
    const work = fakeStage<number>('work', {
      costMs: () => 10,
      work: (frame: number, ctx: StageContext) => {
        const capture = ctx.frame.captureNs;
        seen.push({
          frame,
          budgetMs: Number(ctx.frame.deadlineNs - capture) / 1e6,
          stageBudgetMs: Number(ctx.stageDeadlineNs - capture) / 1e6,
          level: ctx.frame.degradeLevel,
          knobs: ctx.knobs,
        });
        return frame;
      },
    });
    const config = testConfig({
      budgets: { endToEndMs: 2000, stages: {}, dropPredictedMiss: false },
      edges: { default: { policy: 'queue', capacity: 40 } },
      ladder: { enabled: true, upAfter: 2, minSamples: 1 },
    });
    let pausedFrames = -1;
    const steps: Record<number, (graph: Graph) => void> = {
      2: (g) => g.control.setBudgets({ endToEndMs: 1000, stages: { work: 300 } }),
      5: (g) => g.control.pinLevel(2),
      10: (g) => g.control.releaseLevel(),
      14: (g) => {
        g.control.pause();
        assert.equal(g.control.status().state, 'paused');
        pausedFrames = g.control.status().summary.frames.in;
        setTimeout(() => {
          // Nothing was admitted while paused, however long that was.
          assert.equal(g.control.status().summary.frames.in, pausedFrames);
          g.control.resume();
        }, 50);
      },
    };
    const result = await runGraph({
      source: fakeSource({ frames: 30, periodMs: 100 }),
      stages: chain(work),
      config,
      onOutput: (env, graph) => steps[env.frameId]?.(graph),
    });
    assertConservation(result);
    assert.equal(result.summary.frames.out, 30);
    const at = (frame: number): Seen => seen.find((s) => s.frame === frame)!;
    assert.deepEqual([at(2).budgetMs, at(2).stageBudgetMs], [2000, 2000], 'before: the config budgets');
    assert.deepEqual([at(4).budgetMs, at(4).stageBudgetMs], [1000, 300], 'after set_budgets');
    // Pinned at 2 from the first admission after the pin until the release.
    for (let f = 7; f <= 11; f++) assert.equal(at(f).level, 2, `frame ${f}`);
    assert.deepEqual(at(8).knobs, { imageTokens: 140, maxNewTokens: 32, draft: true, frameSkip: 0 });
    // Released: the (comfortable) ladder climbs back to 0.
    assert.equal(at(29).level, 0);
    const degrades = result.events.flatMap((e) => (e.type === 'degrade' ? [`${e.from}→${e.to} ${e.reason}`] : []));
    assert.equal(degrades[0], '0→2 pinned');
    assert.ok(degrades.slice(1).every((d) => d.endsWith('comfortable')));
    const controls = result.events.flatMap((e) => (e.type === 'control' ? [e.command] : []));
    assert.deepEqual(controls, ['set_budgets', 'pin_level', 'release_level', 'pause', 'resume']);
    // No frame entered between pause and resume.
    const order = result.events.filter(
      (e) => e.type === 'frame' || (e.type === 'control' && (e.command === 'pause' || e.command === 'resume')),
    );
    const p = order.findIndex((e) => e.type === 'control' && e.command === 'pause');
    assert.equal(order[p + 1]!.type, 'control');
    assert.ok(pausedFrames > 0);
  });

  test('a request out of range throws and changes nothing', async () => {
    const config = testConfig({ budgets: { endToEndMs: 2000, stages: { decode: 500 }, dropPredictedMiss: false } });
    const failures: string[] = [];
    const result = await runGraph({
      source: fakeSource({ frames: 3, periodMs: 100 }),
      stages: chain(fakeStage<number>('decode')),
      config,
      onOutput: (env, graph) => {
        if (env.frameId !== 0) return;
        const before = graph.control.status();
        for (const bad of [
          () => graph.control.setBudgets({ stages: { encode: 5 } }),
          () => graph.control.setBudgets({ endToEndMs: 100 }), // below the decode budget
          () => graph.control.setBudgets({ endToEndMs: -1 }),
          () => graph.control.setBudgets({ stages: { decode: Number.NaN } }),
          () => graph.control.pinLevel(99),
          () => graph.control.pinLevel(1.5),
        ]) {
          assert.throws(bad, (err: Error) => (failures.push(err.message), err instanceof RangeError));
        }
        const after = graph.control.status();
        assert.deepEqual([after.budgets, after.pinnedLevel], [before.budgets, before.pinnedLevel]);
      },
    });
    assert.equal(failures.length, 6);
    assert.match(failures[0]!, /no stage 'encode' in this graph \(decode\)/);
    assert.match(failures[1]!, /the budget of 'decode' \(500 ms\) is above endToEndMs \(100 ms\)/);
    assert.match(failures[4]!, /level 99 is outside 0\.\.4/);
    assert.deepEqual(
      result.events.filter((e) => e.type === 'control'),
      [],
    );
  });
});
