// A context's llama.cpp calls run on the thread it owns (native/src/context-thread.h), and a
// deadline stops a decode from inside llama.cpp through the deadline timer. Proven with CPU time
// per thread and with the KV cache's content, not with wall-clock thresholds.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { LlamaModel } from '../../native/llama.ts';
import { ensureSynthModel } from '../support/fixtures.ts';

const TASKS = '/proc/self/task';

/** CPU ticks (user + system) per thread of this process, with the thread's name. */
function threadTicks(): Map<number, { name: string; ticks: number }> {
  const out = new Map<number, { name: string; ticks: number }>();
  for (const tid of readdirSync(TASKS)) {
    try {
      const stat = readFileSync(`${TASKS}/${tid}/stat`, 'utf8');
      // pid (comm) state ... : fields after the closing parenthesis; utime and stime are the 12th and 13th.
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      out.set(Number(tid), { name: readFileSync(`${TASKS}/${tid}/comm`, 'utf8').trim(), ticks: Number(fields[11]) + Number(fields[12]) });
    } catch {
      // the thread ended between readdir and read
    }
  }
  return out;
}

describe('context thread on gemma4-tiny', { skip: !existsSync(TASKS) && 'needs /proc (Linux)' }, () => {
  let model: LlamaModel;
  before(async () => {
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
  });
  after(async () => {
    await model.dispose();
  });

  test('decoding burns CPU on the context thread and the compute threads it started, not on libuv or the JS thread', async () => {
    const ctx = await model.createContext({ nCtx: 512, threads: 2 });
    try {
      await ctx.generate([{ text: 'warm up', addSpecial: true }], { maxTokens: 4, ignoreEos: true });
      const t0 = threadTicks();
      let ours = 0;
      let others = 0;
      // Enough decoding for many 10 ms ticks of CPU time, however slow or loaded the machine is.
      for (let round = 0; round < 20 && ours < 100; round++) {
        const before = threadTicks();
        await ctx.generate([{ text: `round ${round}`, addSpecial: true }], { maxTokens: 64, ignoreEos: true });
        for (const [tid, now] of threadTicks()) {
          const spent = now.ticks - (before.get(tid)?.ticks ?? t0.get(tid)?.ticks ?? 0);
          if (now.name === 'percept-ctx') ours += spent;
          else others += spent;
        }
      }
      assert.ok(ours >= 100, `only ${ours} ticks on percept-ctx threads`);
      // The JS thread only queues work and receives results; libuv's pool threads only wait.
      assert.ok(others < ours / 4, `${others} ticks on other threads against ${ours} on the context's`);
    } finally {
      await ctx.dispose();
    }
  });

  test('each context has its own thread, joined on dispose', async () => {
    const ctxThreads = (): Set<number> => new Set([...threadTicks()].filter(([, t]) => t.name === 'percept-ctx').map(([tid]) => tid));
    const before = ctxThreads();
    // One CPU thread each: no compute workers, so the new percept-ctx threads are the contexts' own.
    const a = await model.createContext({ nCtx: 256, threads: 1 });
    const b = await model.createContext({ nCtx: 256, threads: 1 });
    const started = [...ctxThreads()].filter((tid) => !before.has(tid));
    assert.equal(started.length, 2);
    await a.dispose();
    await b.dispose();
    const left = ctxThreads();
    assert.deepEqual(
      started.filter((tid) => left.has(tid)),
      [],
    );
  });

  test('a deadline stops a long prefill inside llama_decode (deadline timer + abort callback)', async () => {
    const ctx = await model.createContext({ nCtx: 1024, nBatch: 1024, nUbatch: 1024, threads: 1 });
    try {
      const tokens = Array.from({ length: 1000 }, (_, i) => 1000 + ((i * 7919) % 50000));
      const full = await ctx.evaluate([{ tokens }]);
      assert.equal(full.timings.prefillTokens, 1000);
      const prefillNs = BigInt(Math.round(full.timings.prefillMs * 1e6));
      // The whole prompt is one llama_decode call: stopping inside it leaves the KV cache empty,
      // stopping at its end would leave the prompt there. A deadline at a fraction of the measured
      // prefill; later attempts give it more room when the decode had not started yet.
      const outcomes: string[] = [];
      for (const fraction of [0.3, 0.3, 0.5, 0.5, 0.7]) {
        ctx.clearCache();
        const r = await ctx.evaluate([{ tokens }], { deadlineNs: process.hrtime.bigint() + (prefillNs * BigInt(fraction * 10)) / 10n });
        // decodeCalls counts the prefill's decodes only when the prefill did not finish.
        const inside = r.stopReason === 'deadline' && r.timings.decodeCalls === 1 && ctx.cachedPositions() === 0;
        outcomes.push(`${fraction}: ${r.stopReason}, ${r.timings.decodeCalls} decodes, cached ${ctx.cachedPositions()}`);
        if (inside) return;
      }
      assert.fail(`no attempt stopped inside the decode: ${outcomes.join('; ')}`);
    } finally {
      await ctx.dispose();
    }
  });
});
