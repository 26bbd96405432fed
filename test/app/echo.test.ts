// `percept echo` as a user runs it: it exits by itself at the run's end event (reading events even when
// only actions are shown), and --keep-going waits for the next run instead.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { createPublisher, type Publisher } from '../../nodes/publisher.ts';
import type { RunSummary } from '../../pipeline/telemetry/events.ts';
import { TelemetryAggregator } from '../../pipeline/telemetry/aggregator.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

function echoChild(endpoint: string, args: string[] = []) {
  const child = spawn(process.execPath, [join(REPO_ROOT, 'tools/percept.mjs'), 'echo', '--connect', endpoint, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  let code: number | null | undefined;
  const done = new Promise<number | null>((resolve) => child.on('exit', (c) => resolve((code = c))));
  return { child, done, exited: () => code !== undefined, output: () => ({ stdout, stderr }) };
}

function emptySummary(): RunSummary {
  const aggregator = new TelemetryAggregator('real', []);
  aggregator.end(0n, 'source_end', null);
  return aggregator.snapshot();
}

/** One action on the publisher, as the pipeline's publish stage sends it. */
async function publishAction(pub: Publisher, frameId: number): Promise<void> {
  const clock = new RealClock();
  const captureNs = clock.nowNs();
  const ctx = standaloneContext({
    clock,
    frame: { frameId, sourceId: 'cam', captureNs, captureWallMs: clock.wallMs(), degradeLevel: 0 },
    deadlineNs: captureNs + 250_000_000n,
  });
  const action = { action: 'stop', confidence: 1 };
  await pub.stage.process(
    { schemaId: 'percept/robot-action/v1', frameId, sourceId: 'cam', captureWallMs: ctx.frame.captureWallMs, action },
    ctx,
  );
}

describe('percept echo', () => {
  const publishers: Publisher[] = [];
  after(async () => {
    for (const p of publishers) await p.close();
  });

  test("exits 0 at the run's end event, with only actions shown; --keep-going does not", async () => {
    const pub = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 });
    publishers.push(pub);
    const plain = echoChild(pub.endpoint);
    const keep = echoChild(pub.endpoint, ['--keep-going']);
    // Slow joiner: actions go out until both echoes have printed one, so both are subscribed when the run ends.
    for (let i = 0; i < 3000 && !(plain.output().stdout && keep.output().stdout); i++) {
      await publishAction(pub, i);
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.ok(plain.output().stdout && keep.output().stdout, 'both echoes received actions');
    await pub.close(emptySummary());
    const code = await Promise.race([plain.done, new Promise((r) => setTimeout(() => r('timeout'), 30_000))]);
    assert.equal(code, 0, JSON.stringify(plain.output()));
    assert.match(plain.output().stderr, /percept echo: run [0-9a-f]{8} ended/);
    const lines = plain.output().stdout.trim().split('\n');
    assert.ok(
      lines.every((l) => l.startsWith('actions #')),
      `only actions shown, the events topic read:\n${lines.join('\n')}`,
    );
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(keep.exited(), false, '--keep-going still runs');
    keep.child.kill('SIGTERM');
    assert.equal(await keep.done, 0);
  });
});
