// Native binding: greedy parity with llama.cpp's C API, prompt segments (text, tokens, images),
// prefix reuse, cancel/deadline, EBUSY, bad inputs, topLogits, and event-loop responsiveness.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { LlamaModel, type LlamaContext, type PromptSegment } from '../../native/llama.ts';
import { ensureSynthModel, fakeImage, findPeer } from '../support/fixtures.ts';

const run = promisify(execFile);
const PROMPT = 'The robot sees a red cup on the table and';

async function peerGreedy(model: string, n: number, prompt: string): Promise<number[]> {
  const peer = findPeer('percept-peer-greedy');
  assert.ok(peer, 'percept-peer-greedy not built: cmake --build build/native --target percept-peer-greedy');
  const { stdout } = await run(peer, [model, String(n), prompt], { maxBuffer: 1 << 20 });
  return JSON.parse(stdout) as number[];
}

for (const preset of ['gemma4-tiny', 'gemma3-tiny']) {
  test(`greedy parity with llama.cpp's C API on ${preset} (32 tokens, EOS ignored)`, async () => {
    const path = await ensureSynthModel(preset);
    const model = await LlamaModel.load(path);
    try {
      const ctx = await model.createContext({ nCtx: 256 });
      const ours = await ctx.generate([{ text: PROMPT, addSpecial: true }], { maxTokens: 32, ignoreEos: true });
      const theirs = await peerGreedy(path, 32, PROMPT);
      assert.equal(theirs.length, 32);
      assert.deepEqual(ours.tokens, theirs);
      assert.equal(ours.stopReason, 'max_tokens');
      assert.equal(ours.timings.decodeTokens, 31);
    } finally {
      await model.dispose();
    }
  });
}

describe('native generate on gemma4-tiny', () => {
  let model: LlamaModel;
  let ctx: LlamaContext;
  before(async () => {
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    ctx = await model.createContext({ nCtx: 1024 });
  });
  after(async () => {
    await model.dispose();
  });

  test('the system prefix is reused across calls and gives the output of a fresh context', async () => {
    const system: PromptSegment = {
      text: model.renderChat([{ role: 'system', content: 'You are a careful robot. Answer in JSON.' }], { addGenerationPrompt: false }),
      addSpecial: false,
    };
    const sysTokens = model.tokenize((system as { text: string }).text).length;
    const first = await ctx.generate([system, { text: 'frame one' }], { maxTokens: 8, ignoreEos: true });
    assert.equal(first.reusedTokens, 0);
    const second = await ctx.generate([system, { text: 'frame two' }], { maxTokens: 8, ignoreEos: true });
    assert.ok(second.reusedTokens >= sysTokens, `reused ${second.reusedTokens} < ${sysTokens} system tokens`);
    assert.ok(second.timings.prefillTokens < second.promptTokens);
    const fresh = await model.createContext({ nCtx: 1024 });
    try {
      const expected = await fresh.generate([system, { text: 'frame two' }], { maxTokens: 8, ignoreEos: true });
      assert.equal(expected.reusedTokens, 0);
      assert.deepEqual(second.tokens, expected.tokens);
    } finally {
      await fresh.dispose();
    }
  });

  test('image segments: decoded between the image tokens, reused when equal, rule-dependent', async () => {
    const { nEmbd } = model.info;
    const img = fakeImage(8, nEmbd, 7);
    const prompt = (image: Float32Array, causal = false): PromptSegment[] => [
      { text: 'look:', addSpecial: true },
      { image, nTokens: 8, ...(causal ? { causal: true } : {}) },
      { text: 'what now?' },
    ];
    const a = await ctx.generate(prompt(img), { maxTokens: 6, ignoreEos: true });
    const look = model.tokenize('look:', { addSpecial: true }).length;
    const what = model.tokenize('what now?').length;
    assert.equal(a.promptTokens, look + 1 + 8 + 1 + what);
    // Same image again: everything but the last token is reused.
    const b = await ctx.generate(prompt(img), { maxTokens: 6, ignoreEos: true });
    assert.equal(b.reusedTokens, a.promptTokens - 1);
    assert.deepEqual(b.tokens, a.tokens);
    // A different image: reuse stops at the image.
    const c = await ctx.generate(prompt(fakeImage(8, nEmbd, 8)), { maxTokens: 6, ignoreEos: true });
    assert.equal(c.reusedTokens, look + 1);
    // The same image decoded causally is different KV: different continuation.
    const causal = await ctx.generate(prompt(img, true), { maxTokens: 6, ignoreEos: true });
    assert.equal(causal.reusedTokens, look + 1);
    assert.notDeepEqual(causal.tokens, a.tokens);
  });

  test('an image embedding of the wrong width throws and the context keeps working', async () => {
    const wrong = new Float32Array(8 * (model.info.nEmbd + 1));
    await assert.rejects(ctx.generate([{ text: 'x' }, { image: wrong, nTokens: 8 }], { maxTokens: 1 }), /wrong embedding width/);
    const r = await ctx.generate([{ text: 'still fine' }], { maxTokens: 2, ignoreEos: true });
    assert.equal(r.tokens.length, 2);
  });

  test('cancel through AbortSignal stops at a token boundary', async () => {
    const ac = new AbortController();
    let streamed = 0;
    const r = await ctx.generate([{ text: 'count forever' }], {
      maxTokens: 900,
      ignoreEos: true,
      signal: ac.signal,
      onTokens: (t) => {
        streamed += t.length;
        if (streamed >= 3) ac.abort();
      },
    });
    assert.equal(r.stopReason, 'cancelled');
    assert.ok(r.tokens.length >= 3 && r.tokens.length < 900, `generated ${r.tokens.length}`);
    // An already-aborted signal: nothing is evaluated.
    const pre = await ctx.generate([{ text: 'never' }], { maxTokens: 5, signal: AbortSignal.abort() });
    assert.equal(pre.stopReason, 'cancelled');
    assert.equal(pre.tokens.length, 0);
  });

  test('a deadline stops generation within about one token', async () => {
    // Measure the per-token time first, then set a deadline a few tokens into a long run.
    const probe = await ctx.generate([{ text: 'probe' }], { maxTokens: 16, ignoreEos: true });
    const perTokenMs = probe.timings.decodeMs / probe.timings.decodeTokens;
    const deadlineNs = process.hrtime.bigint() + BigInt(Math.round((probe.timings.ttftMs + 8 * perTokenMs) * 1e6));
    // How late the result reaches JS depends on this machine now: the token in progress at the
    // deadline, and how long the event loop takes to run the completion. Both are measured.
    const loopDelay = monitorEventLoopDelay({ resolution: 1 });
    loopDelay.enable();
    const r = await ctx.generate([{ text: 'deadline run' }], { maxTokens: 900, ignoreEos: true, deadlineNs });
    const lateMs = Number(process.hrtime.bigint() - deadlineNs) / 1e6;
    loopDelay.disable();
    assert.equal(r.stopReason, 'deadline');
    assert.ok(r.tokens.length < 900);
    const tokenMs = Math.max(perTokenMs, r.timings.decodeMs / Math.max(1, r.timings.decodeTokens));
    const wakeMs = loopDelay.max / 1e6;
    assert.ok(
      lateMs < 3 * tokenMs + 2 * wakeMs + 1,
      `stopped ${lateMs.toFixed(1)} ms after the deadline (token ≈ ${tokenMs.toFixed(1)} ms, event-loop delay ≤ ${wakeMs.toFixed(1)} ms)`,
    );
    const past = await ctx.generate([{ text: 'late' }], { maxTokens: 5, deadlineNs: process.hrtime.bigint() - 1n });
    assert.equal(past.stopReason, 'deadline');
    assert.equal(past.tokens.length, 0);
  });

  test('a second concurrent operation is refused with EBUSY', async () => {
    const first = ctx.generate([{ text: 'busy' }], { maxTokens: 20, ignoreEos: true });
    await assert.rejects(ctx.generate([{ text: 'other' }], { maxTokens: 1 }), (e: Error & { code?: string }) => e.code === 'EBUSY');
    assert.throws(
      () => ctx.clearCache(),
      (e: Error & { code?: string }) => e.code === 'EBUSY',
    );
    assert.equal((await first).tokens.length, 20);
  });

  test('bad inputs throw clear errors and the context keeps working', async () => {
    await assert.rejects(
      ctx.generate([{ tokens: [2, 262144] }], { maxTokens: 1 }),
      /Expected a token id of this model \(an integer between 0 and 262143\) for prompt\[0\].tokens\[1\] but received 262144/,
    );
    await assert.rejects(ctx.generate([{ text: 'x' }], { maxTokens: 5000 }), /maxTokens/);
    await assert.rejects(ctx.generate([{ text: 'x'.repeat(10) }], { maxTokens: 1024 }), (e: Error & { code?: string }) => {
      assert.equal(e.code, 'ERANGE');
      assert.match(e.message, /context overflow/);
      return true;
    });
    await assert.rejects(ctx.generate([], { maxTokens: 1 }), /non-empty array/);
    await assert.rejects(ctx.generate([{ text: 'x' }], { maxTokens: 1, temperature: -1 }), /temperature/);
    await assert.rejects(ctx.generate([{ text: 'x' }], { maxTokens: 1, deadlineNs: 5 as never }), /bigint/);
    const r = await ctx.generate([{ text: 'works' }], { maxTokens: 3, ignoreEos: true });
    assert.equal(r.tokens.length, 3);
  });

  test('stop strings and stop tokens end generation with reason stop', async () => {
    const base = await ctx.generate([{ text: 'stop test' }], { maxTokens: 12, ignoreEos: true });
    const stopToken = base.tokens[4]!;
    const byToken = await ctx.generate([{ text: 'stop test' }], { maxTokens: 12, ignoreEos: true, stopTokens: [stopToken] });
    assert.equal(byToken.stopReason, 'stop');
    assert.deepEqual(byToken.tokens, base.tokens.slice(0, base.tokens.indexOf(stopToken)));
    const piece = model.detokenize([base.tokens[3]!]);
    if (piece.trim().length > 0) {
      const byString = await ctx.generate([{ text: 'stop test' }], { maxTokens: 12, ignoreEos: true, stop: [piece] });
      assert.equal(byString.stopReason, 'stop');
      assert.ok(!byString.text.includes(piece));
    }
  });

  test('sampling with a seed is reproducible', async () => {
    const opts = { maxTokens: 10, ignoreEos: true, temperature: 0.9, topK: 40, topP: 0.95, seed: 42 };
    const a = await ctx.generate([{ text: 'sample' }], opts);
    const b = await ctx.generate([{ text: 'sample' }], opts);
    assert.deepEqual(a.tokens, b.tokens);
  });

  test('topLogits: the K largest raw logits of every sampled row, at the step of the token it sampled', async () => {
    const prompt: PromptSegment[] = [{ text: PROMPT, addSpecial: true }];
    const greedy = await ctx.generate(prompt, { maxTokens: 4, ignoreEos: true, topLogits: 5 });
    const rows = greedy.topLogits ?? assert.fail('no topLogits');
    assert.equal(greedy.tokens.length, 4);
    assert.deepEqual(
      rows.map((r) => r.step),
      [0, 1, 2, 3],
    );
    for (const r of rows) {
      assert.equal(r.ids.length, 5);
      assert.equal(r.logits.length, 5);
      for (let i = 1; i < 5; i++) {
        assert.ok(r.logits[i - 1]! >= r.logits[i]!, `step ${r.step}: logits ${String(r.logits)} not highest first`);
        if (r.logits[i - 1] === r.logits[i]) assert.ok(r.ids[i - 1]! < r.ids[i]!, 'ties: lower id first');
      }
      assert.equal(r.ids[0], greedy.tokens[r.step], `step ${r.step}: greedy takes the argmax`);
    }
    assert.equal((await ctx.generate(prompt, { maxTokens: 2 })).topLogits, undefined);

    // Under a grammar with jump-forward, forced tokens are not sampled: their steps are skipped.
    const grammar = await model.grammar('root ::= "{\\"action\\": \\"" ("move" | "stop" | "grasp") "\\", \\"speed\\": " [0-9] [0-9] "}"');
    const guided = await ctx.generate(prompt, { maxTokens: 64, grammar, jumpForward: true, topLogits: 5 });
    const steps = (guided.topLogits ?? assert.fail('no topLogits')).map((r) => r.step);
    assert.ok(guided.forced > 0, 'the grammar forced no token');
    assert.equal(steps.length, guided.tokens.length - guided.forced);
    steps.forEach((s, i) => assert.ok(s < guided.tokens.length && (i === 0 || s > steps[i - 1]!), `steps ${String(steps)}`));

    for (const bad of [-1, 1.5, 65]) await assert.rejects(ctx.generate(prompt, { maxTokens: 1, topLogits: bad }), /options\.topLogits/);
    const several = await model.createContext({ nCtx: 256, nSeq: 2 });
    try {
      await assert.rejects(several.generate(prompt, { maxTokens: 1, seq: 0, topLogits: 5 }), /topLogits: a context of several sequences/);
    } finally {
      await several.dispose();
    }
  });

  test('memory breakdown reports model, KV and compute bytes', () => {
    const mb = ctx.memoryBreakdown();
    assert.ok(mb.model > 0 && mb.context > 0 && mb.compute > 0, JSON.stringify(mb));
  });
});

test('the event loop stays idle while a model loads and generates (the work is on worker threads)', async () => {
  const path = await ensureSynthModel('gemma4-tiny');
  const h = monitorEventLoopDelay({ resolution: 5 });
  h.enable();
  const elu0 = performance.eventLoopUtilization();
  const model = await LlamaModel.load(path);
  const ctx = await model.createContext({ nCtx: 1024 });
  const r = await ctx.generate([{ text: PROMPT, addSpecial: true }], { maxTokens: 200, ignoreEos: true });
  const elu = performance.eventLoopUtilization(elu0);
  h.disable();
  await model.dispose();
  assert.equal(r.tokens.length, 200);
  console.log(
    `event loop busy ${(100 * elu.utilization).toFixed(1)} % of ${(elu.active + elu.idle).toFixed(0)} ms; delay p99 ${(h.percentile(99) / 1e6).toFixed(1)} ms, max ${(h.max / 1e6).toFixed(1)} ms`,
  );
  // The share of the time the loop spent running rather than waiting for events: about 1 if the
  // load or the token loop ran on this thread, however fast or loaded the machine is.
  assert.ok(elu.utilization < 0.5, `the event loop was busy ${(100 * elu.utilization).toFixed(1)} % of the load and generation`);
});
