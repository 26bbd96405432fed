// The Python subscriber (client/python/percept_client.py, pyzmq + jsonschema from Debian) as a real
// non-JS peer of the publisher: it validates every message with the same JSON Schemas, sees seq
// gaps, flags stale actions and stops at the run's end event. (test/e2e/run.test.ts runs it against
// a whole `percept run` too.)
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPublisher } from '../../nodes/publisher.ts';
import { TelemetryAggregator } from '../../pipeline/telemetry/aggregator.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import type { Clock } from '../../pipeline/clock.ts';
import { startPythonSubscriber } from '../support/python-peer.ts';

const clockAt = (agoMs: number): Clock => ({
  virtual: false,
  nowNs: () => process.hrtime.bigint(),
  wallMs: () => Date.now() - agoMs,
  unixNs: (ns) => BigInt(Date.now() - agoMs) * 1_000_000n + ns - process.hrtime.bigint(),
});

describe('Python subscriber', () => {
  const closers: Array<() => unknown> = [];
  after(async () => {
    for (const c of closers) await c();
  });

  test('validates every action and event, sees seq gaps and stale actions, stops at the end event', async () => {
    const pub = await createPublisher({
      endpoint: 'tcp://127.0.0.1:*',
      topic: 'actions',
      sendHighWaterMark: 1000,
      highWaterMarks: { actions: 2 },
    });
    closers.push(() => pub.close());
    const py = await startPythonSubscriber([
      '--connect',
      pub.endpoint,
      '--topic',
      'actions',
      '--topic',
      'events',
      '--until-end',
      '--timeout',
      '20',
    ]);
    closers.push(() => py.child.kill());
    const publish = async (frameId: number, agoMs = 0) => {
      const clock = clockAt(agoMs);
      const captureNs = clock.nowNs();
      const ctx = standaloneContext({
        clock,
        frame: { frameId, sourceId: 'cam', captureNs, captureWallMs: clock.wallMs(), degradeLevel: 0 },
        deadlineNs: captureNs + 250_000_000n,
      });
      await pub.stage.process(
        {
          schemaId: 'percept/robot-action/v1',
          frameId,
          sourceId: 'cam',
          captureWallMs: ctx.frame.captureWallMs,
          action: { action: 'stop', confidence: 1 },
        },
        ctx,
      );
    };
    // Slow joiner: probe with events until one arrives.
    let first: Record<string, unknown> | undefined;
    const arrival = py.next().then((m) => (first = m));
    for (let i = 0; i < 1000 && !first; i++) {
      pub.sink.accept({ type: 'drop', atNs: 0n, frameId: -1, stage: 'probe', reason: 'stale', detail: '' });
      await new Promise((r) => setTimeout(r, 10));
    }
    await arrival;
    const probes = pub.stats().events!.accepted;
    for (let seq = first!.seq as number; seq < probes - 1;) seq = (await py.next()).seq as number;

    await publish(0);
    // 1 goes out at once; of 2…6 the queue of 2 keeps the newest two (5, and 6 which is stale on arrival).
    for (let i = 1; i <= 5; i++) void publish(i);
    await publish(6, 1000);
    await pub.close(new TelemetryAggregator('real').snapshot());
    const got: Record<string, unknown>[] = [];
    for (let m = await py.next(); !('counts' in m); m = await py.next()) got.push(m);
    for (const m of got) assert.equal(m.valid, true, `${m.topic} #${m.seq}: ${m.error}`);
    const actions = got.filter((m) => m.topic === 'actions');
    assert.deepEqual(
      actions.map((m) => [(m.header as { frame_id: number }).frame_id, m.lost, m.stale]),
      [
        [0, 0, false],
        [1, 0, false],
        [5, 3, false],
        [6, 0, true],
      ],
    );
    assert.deepEqual(got.at(-1)!.body && (got.at(-1)!.body as { type: string }).type, 'end');
    assert.equal(pub.stats().actions!.dropped, 3);
  });
});
