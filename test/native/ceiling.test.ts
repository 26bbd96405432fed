// LlamaContext.measureCeiling: llama-batched-bench's timing of one shape through the binding. It gives one
// positive, finite time per repeat; it is refused while a generation runs; and a context of one or several
// sequences generates the same tokens after it as before (the prompt caches forget what its decodes overwrote, and
// the backend sampler it takes off is set again).
// Timing is never compared: the machine may be loaded.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LlamaModel, type LlamaContext } from '../../native/llama.ts';
import { ensureSynthModel } from '../support/fixtures.ts';

const greedy = { maxTokens: 6, ignoreEos: true, temperature: 0 } as const;
const PROMPT = [{ text: 'The robot sees a red cube on the table and', addSpecial: true }];

describe('measureCeiling on gemma4-tiny', () => {
  let model: LlamaModel;
  before(async () => {
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { gpuLayers: 0 });
  });
  after(async () => {
    await model.dispose();
  });

  for (const nSeq of [1, 3]) {
    test(`${nSeq} sequence(s): a time per repeat, and the same tokens after it as before`, async () => {
      const ctx: LlamaContext = await model.createContext({
        nCtx: 256,
        nBatch: 256,
        nUbatch: 256,
        ...(nSeq > 1 ? { nSeq, kvUnified: true } : {}),
      });
      try {
        const seq = nSeq > 1 ? { seq: nSeq - 1 } : {};
        const before = await ctx.generate(PROMPT, { ...greedy, ...seq });
        const times = await ctx.measureCeiling({ sequences: nSeq, promptTokens: 100, steps: 5, repeats: 2 });
        assert.equal(times.prefillMs.length, 2);
        assert.equal(times.decodeMs.length, 2);
        for (const ms of [...times.prefillMs, ...times.decodeMs]) assert.ok(Number.isFinite(ms) && ms > 0, `time ${ms}`);
        // A context of several sequences counts its positions as of its next step.
        if (nSeq === 1) assert.equal(ctx.cachedPositions(), 0);
        const afterwards = await ctx.generate(PROMPT, { ...greedy, ...seq });
        assert.deepEqual(afterwards.tokens, before.tokens);
        // Several sequences: greedy requests sample in the graph; the ceiling took the chain off and the next set it again.
        if (nSeq > 1) assert.deepEqual([before.batch!.backendSampled, afterwards.batch!.backendSampled], [true, true]);
        assert.equal(afterwards.reusedTokens, 0, 'nothing of the old prompt is reused from overwritten KV cells');
      } finally {
        await ctx.dispose();
      }
    });
  }

  test("refused while a generation runs, and past a sequence's KV positions", async () => {
    const ctx = await model.createContext({ nCtx: 128, nBatch: 128, nUbatch: 128, nSeq: 2, kvUnified: true });
    try {
      const running = ctx.generate(PROMPT, { ...greedy, maxTokens: 32, seq: 0 });
      await assert.rejects(ctx.measureCeiling({ sequences: 2, promptTokens: 16, steps: 2 }), { code: 'EBUSY' });
      await running;
      await assert.rejects(ctx.measureCeiling({ sequences: 2, promptTokens: 120, steps: 16 }), /options\.steps/);
      await assert.rejects(ctx.measureCeiling({ sequences: 3, promptTokens: 16, steps: 2 }), /options\.sequences/);
      const times = await ctx.measureCeiling({ sequences: 2, promptTokens: 16, steps: 2, repeats: 1 });
      assert.equal(times.prefillMs.length, 1);
    } finally {
      await ctx.dispose();
    }
  });
});
