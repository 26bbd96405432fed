// Child process for test/pipeline/shutdown.test.ts: an endless real-clock graph of fake stages
// that stops on SIGINT/SIGTERM, prints its summary (text, then one JSON line) and exits by itself.
import { RealClock } from '../../pipeline/clock.ts';
import { chainOf } from '../../pipeline/graph/chain.ts';
import { createGraph, stopOnSignals } from '../../pipeline/graph/graph.ts';
import { formatSummary } from '../../pipeline/telemetry/report.ts';
import { fakeSource, fakeStage, testConfig } from '../support/pipeline-fakes.ts';

const stages = [
  fakeStage<number>('preprocess'),
  fakeStage<number>('decode', {
    work: (frame, ctx) =>
      new Promise<number>((resolve) => {
        // 5 ms of "work", cut short by the signal.
        const timer = setTimeout(() => resolve(frame), 5);
        ctx.signal.addEventListener('abort', () => {
          clearTimeout(timer);
          ctx.report({ kind: 'cancel', reason: (ctx.signal.reason as { reason: 'deadline' | 'shutdown' }).reason });
          resolve(frame);
        });
      }),
  }),
  fakeStage<number>('publish'),
];
const graph = createGraph({
  source: fakeSource({ frames: Infinity, periodMs: 2 }),
  stages: chainOf(stages),
  clock: new RealClock(),
  config: testConfig({ clock: 'real', budgets: { endToEndMs: 3_600_000, stages: {}, dropPredictedMiss: false } }),
});
stopOnSignals(graph);
let announced = false;
graph.outputs.subscribe(() => {
  if (announced) return;
  announced = true;
  process.stdout.write('ready\n');
});
const summary = await graph.run();
process.stdout.write(formatSummary(summary));
process.stdout.write(`SUMMARY ${JSON.stringify({ ...summary, closed: stages.every((s) => s.closed) })}\n`);
