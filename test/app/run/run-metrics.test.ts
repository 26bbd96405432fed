// `percept run --metrics`: a real run of the tiny models serves Prometheus metrics and /healthz while it
// goes on, and the server is gone when the run ends.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { executeRun } from '../../../app/run/run.ts';
import { loadConfig } from '../../../pipeline/config.ts';
import { freePort, tinyPatternRunConfig } from '../../support/fixtures.ts';

test(
  'a run with metrics: scraped while it runs, healthy, its counters exposed, the server closed with the run',
  { timeout: 600_000 },
  async () => {
    const frames = 4;
    const config = loadConfig(tinyPatternRunConfig(frames));
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    let during: { health: number; metrics: string } | undefined;
    const { summary, failure } = await executeRun(config, {
      publish: false,
      metrics: `127.0.0.1:${port}`,
      onStart: (graph) => {
        // Scraped once the first action is out: the run is still going.
        let scraped = false;
        graph.outputs.subscribe(() => {
          if (scraped) return;
          scraped = true;
          void (async () => {
            const health = await fetch(`${url}/healthz`);
            during = { health: health.status, metrics: await (await fetch(`${url}/metrics`)).text() };
          })();
        });
      },
    });
    assert.equal(failure, undefined);
    assert.equal(summary.frames.out, frames);
    assert.ok(during, 'scraped during the run');
    assert.equal(during.health, 200);
    assert.match(during.metrics, /^# TYPE \S+ counter$/m);
    assert.match(during.metrics, /^percept_frames_in_total \d+$/m);
    await assert.rejects(fetch(`${url}/metrics`), 'the server closed with the run');
  },
);
