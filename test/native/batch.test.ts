// Batched decoding on a context of several sequences (one per camera): outputs equal each sequence
// decoded alone (greedy, token for token, under the action grammar, with images), a cancelled or
// late sequence leaves the others' outputs unchanged, a huge prompt delays a short one by at most
// one step (counted in steps, not ms), FIFO admission past maxActive starves no sequence, admission
// in groups (an arrival held for the running group, a hold for a request on its way), and the
// API's refusals. Timing is never asserted: only outputs, stop reasons and step counts.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  LlamaModel,
  type GenerateOptions,
  type GenerateResult,
  type LlamaContext,
  type LlamaGrammar,
  type PromptSegment,
  type TimeAccount,
  type ContextOptions,
} from '../../native/llama.ts';
import { REPO_ROOT, ensureSynthModel, fakeImage } from '../support/fixtures.ts';

const CAMERAS = ['front', 'left', 'right', 'rear'];

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

describe('batched decoding on gemma4-tiny', () => {
  let model: LlamaModel;
  let grammar: LlamaGrammar;
  let single: LlamaContext;
  before(async () => {
    // On the CPU whatever the machine: the overload test relies on a step of eight costing about eight of one.
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { gpuLayers: 0 });
    const schema = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
    grammar = await model.grammarFromJsonSchema(schema);
    single = await model.createContext({ nCtx: 1024, nBatch: 512, nUbatch: 512 });
  });
  after(async () => {
    await model.dispose();
  });

  /** A camera's prompt: its own text, an image of 24 rows, and the instruction. */
  const cameraPrompt = (i: number, causal: boolean): PromptSegment[] => [
    { text: `<start_of_turn>user\nCamera ${CAMERAS[i]} of the robot.`, addSpecial: true },
    { image: fakeImage(24, model.info.nEmbd, 100 + i), nTokens: 24, causal },
    { text: `\nWhat should the robot do? Answer in JSON.<end_of_turn>\n<start_of_turn>model\n` },
  ];
  const actionOptions = (): GenerateOptions => ({ maxTokens: grammar.worstCaseTokens ?? 256, grammar, jumpForward: true });

  async function alone(prompt: readonly PromptSegment[], options: GenerateOptions, ctx = single): Promise<GenerateResult> {
    ctx.clearCache();
    return ctx.generate(prompt, options);
  }

  /** The four cameras' actions at once on a context of four sequences in one KV buffer, one thread, with `options`;
   * `announce`d first (expect), they go in as one group. Returns them and the scheduler's time account. */
  async function fourAtOnce(options: ContextOptions, causal: boolean, announce = false) {
    const ctx = await model.createContext({ nCtx: 1024, nBatch: 512, nUbatch: 512, nSeq: 4, kvUnified: true, threads: 1, ...options });
    try {
      if (announce) CAMERAS.forEach((_, i) => ctx.expect(i, 1));
      const got = await Promise.all(
        CAMERAS.map((_, i) => {
          const r = ctx.generate(cameraPrompt(i, causal), { ...actionOptions(), seq: i });
          if (announce) ctx.expect(i, -1);
          return r;
        }),
      );
      return { got, account: ctx.timeAccount()!, info: ctx.info };
    } finally {
      await ctx.dispose();
    }
  }

  // A small prefill chunk cuts causal images into several decodes and reads each bidirectional
  // image alone; a large one reads the four bidirectional images in one decode.
  // Padded steps (stepTokens 4: a forced run longer than 3 tokens goes on in the next step) give the
  // same tokens too; a padding row left in the KV cache would make the next step's rows collide.
  // Admitted together, the four prompts are read in as few decodes as the batch takes, whatever the chunk.
  // stepRows pads every token decode with a row for each camera that has none and rounds its rows up; a padding
  // row left in the KV cache would make the second round's rows collide.
  for (const [kvUnified, causal, prefillChunk, stepTokens, admitTogether, stepRows] of [
    [false, false, 16, 1, false, 0],
    [false, false, 512, 1, false, 0],
    [false, true, 16, 1, false, 0],
    [true, true, 16, 1, false, 0],
    [false, false, 16, 4, false, 0],
    [true, true, 16, 4, false, 0],
    [false, false, 16, 1, true, 0],
    [false, true, 16, 1, true, 0],
    [true, true, 16, 1, false, 8],
    [true, true, 16, 4, false, 16],
  ] as const) {
    test(`four cameras at once give each camera's output decoded alone (action grammar, jump-forward, ${causal ? 'causal' : 'bidirectional'} images, prefill chunk ${prefillChunk}, kvUnified ${kvUnified}, stepTokens ${stepTokens}${admitTogether ? ', admitted together' : ''}${stepRows ? `, stepRows ${stepRows}` : ''})`, async () => {
      // One KV buffer for all: once it holds 512 cells, a step of one row (the last camera still
      // running) takes ggml-cpu's flash attention split among threads, which sums the cells in
      // other groups than alone (the last bits of the logits move, and with random weights a near
      // tie may go the other way). One thread on both sides sums them cell by cell, in order.
      const threads = kvUnified ? 1 : undefined;
      const ctx = await model.createContext({
        nCtx: 1024,
        nBatch: 512,
        nUbatch: 512,
        nSeq: 4,
        kvUnified,
        prefillChunk,
        stepTokens,
        admitTogether,
        stepRows,
        threads,
      });
      assert.equal(ctx.info.stepRows, stepRows);
      const reference = kvUnified ? await model.createContext({ nCtx: 1024, nBatch: 512, nUbatch: 512, threads }) : single;
      try {
        const expected: GenerateResult[] = [];
        for (let i = 0; i < 4; i++) expected.push(await alone(cameraPrompt(i, causal), actionOptions(), reference));
        // Twice: the second round reuses each camera's prefix in its own sequence.
        for (let round = 0; round < 2; round++) {
          const got = await Promise.all(CAMERAS.map((_, i) => ctx.generate(cameraPrompt(i, causal), { ...actionOptions(), seq: i })));
          got.forEach((r, i) => {
            // One KV buffer for all: a sequence's cells go wherever cells are free, so after the
            // first frame its own cells are no longer in position order, and the CPU attention
            // sums over them in another order than alone (the last bits of the logits move, and
            // with random weights a near tie may go the other way). Its first frame is exact.
            if (!kvUnified || round === 0) {
              assert.deepEqual(r.tokens, expected[i]!.tokens, `camera ${i}, round ${round}`);
              assert.equal(r.stopReason, expected[i]!.stopReason);
              assert.equal(r.text, expected[i]!.text);
              // Unpadded, the opening forced run joins the prompt as alone: the same tokens forced, one
              // step per pick after the first (a padded step may leave a forced run's rest to the next,
              // which then takes it as its first token).
              if (stepTokens === 1) {
                assert.equal(r.forced, expected[i]!.forced, `camera ${i}: the same tokens forced`);
                assert.equal(r.timings.decodeCalls, expected[i]!.timings.decodeCalls, `camera ${i}: generation steps`);
              }
            } else {
              assert.equal(r.stopReason, 'eos', `camera ${i}: a complete action`);
              JSON.parse(r.text);
            }
            assert.ok(r.batch, 'a batched result says where it stood in the schedule');
            assert.equal(r.batch.seq, i);
          });
          assert.ok(Math.max(...got.map((r) => r.batch!.peakSeqs)) >= 2, 'the cameras shared steps');
          assert.ok(
            got.every((r) => r.forced > 0),
            'jump-forward ran in the batch',
          );
          if (round === 1) for (const r of got) assert.ok(r.reusedTokens > 0, 'the second frame reuses the camera prefix');
          // Together, every prompt is in after its image decode and its text decode: its first token follows them.
          if (admitTogether && round === 0) for (const r of got) assert.equal(r.batch!.peakSeqs, 4, 'the four were admitted as one group');
        }
        for (let i = 0; i < 4; i++) assert.ok(ctx.cachedPositions(i) > 0);
      } finally {
        await ctx.dispose();
        if (reference !== single) await reference.dispose();
      }
    });
  }

  // mixSteps: a step's causal image rows and its token rows share one llama_decode, the other
  // cameras' tokens and the text after an image the step completes.
  for (const admitTogether of [false, true]) {
    test(`a step's causal image rows carry its token rows in one decode (${admitTogether ? 'admitted together' : 'prefill chunk 16'}): the same outputs, fewer decodes; images read both ways are not mixed`, async () => {
      // Together: announced first, the four go in as one group, so both runs lay their KV cells out alike.
      const run = async (mixSteps: boolean, causal: boolean) => {
        const r = await fourAtOnce(
          { mixSteps, ...(admitTogether ? { admitTogether, groupWaitMs: 1000 } : { prefillChunk: 16 }) },
          causal,
          admitTogether,
        );
        assert.equal(r.info.mixSteps, mixSteps);
        return r;
      };
      const separate = await run(false, true);
      const mixed = await run(true, true);
      mixed.got.forEach((r, i) => {
        const s = separate.got[i]!;
        if (admitTogether) {
          assert.deepEqual(
            mixed.got.map((x) => x.batch!.peakSeqs),
            [4, 4, 4, 4],
            'one group',
          );
          assert.deepEqual(r.tokens, s.tokens, `camera ${i}: the same tokens`);
          assert.equal(r.text, s.text);
          // A frame's image and the text after it take one step instead of two.
          assert.equal(r.batch!.steps, s.batch!.steps - 1, `camera ${i}: steps`);
        } else {
          // Admitted as they come, the runs may lay the KV cells out differently, and on random weights the last bits
          // of a logit can tip a near tie: each still ends a complete action (the exact case is admitted together).
          assert.equal(r.stopReason, 'eos', `camera ${i}`);
          JSON.parse(r.text);
        }
      });
      assert.equal(separate.account.mixedDecodes, 0, 'mixSteps off: no mixed decode');
      assert.ok(mixed.account.mixedDecodes > 0, 'some image decodes carried token rows');
      assert.ok(mixed.account.mixedTokenRows >= mixed.account.mixedDecodes);
      assert.ok(mixed.account.mixedDecodes <= mixed.account.imageDecodes);
      // llama_decode calls: unmixed, a step with image and token rows takes two; mixed, one at most.
      const decodes = (a: TimeAccount) => a.imageDecodes + a.tokenDecodes;
      // Together, no other camera runs beside a group's images: unmixed, each step decodes once there too.
      if (!admitTogether) assert.ok(decodes(separate.account) > separate.account.steps, 'unmixed, some step decoded twice');
      assert.ok(decodes(mixed.account) <= mixed.account.steps, `${decodes(mixed.account)} decodes in ${mixed.account.steps} steps`);
      const bidirectional = await run(true, false);
      assert.equal(bidirectional.account.mixedDecodes, 0, 'an image read both ways is decoded alone');
    });
  }

  test('backend sampling: greedy rows without a grammar are taken in the graph, token for token as on the host; a grammar request samples on the host', async () => {
    const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${CAMERAS[k]}: the robot sees`, addSpecial: true }];
    const greedy = (seq: number): GenerateOptions & { seq: number } => ({ maxTokens: 24, ignoreEos: true, seq });
    const outputs = async (backendSampling: boolean): Promise<GenerateResult[]> => {
      const ctx = await model.createContext({ nCtx: 512, nSeq: 3, threads: 1, kvUnified: true, backendSampling });
      try {
        assert.equal(ctx.info.backendSampling, backendSampling);
        const first = await Promise.all([0, 1, 2].map((s) => ctx.generate(prompt(s), greedy(s))));
        // Sequence 1 takes a grammar request, then a greedy one again: off the graph and back on.
        ctx.clearCache(1);
        const action = await ctx.generate([{ text: 'Camera left: act', addSpecial: true }], { ...actionOptions(), seq: 1 });
        ctx.clearCache(1);
        const again = await ctx.generate(prompt(1), greedy(1));
        return [...first, action, again];
      } finally {
        await ctx.dispose();
      }
    };
    const graph = await outputs(true);
    const host = await outputs(false);
    assert.deepEqual(
      graph.map((r) => r.batch!.backendSampled),
      [true, true, true, false, true],
    );
    assert.ok(host.every((r) => r.batch!.backendSampled === false));
    for (const [i, r] of graph.entries()) {
      assert.equal(r.tokens.length, host[i]!.tokens.length, `request ${i}`);
      assert.deepEqual(r.tokens, host[i]!.tokens, `request ${i}: the same tokens in the graph as on the host`);
    }
    assert.deepEqual(graph[4]!.tokens, graph[1]!.tokens, 'back in the graph after the grammar request, the same output');
  });

  test('a cancelled and a late sequence leave the others unchanged', async () => {
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 4 });
    try {
      const prompt = (i: number): PromptSegment[] => [{ text: `Camera ${CAMERAS[i]} reports that the`, addSpecial: true }];
      const short = { maxTokens: 8, ignoreEos: true };
      const long = { maxTokens: 600, ignoreEos: true };
      const expected0 = await alone(prompt(0), short);
      const expected3 = await alone(prompt(3), { maxTokens: 40, ignoreEos: true });
      const expected1 = await alone(prompt(1), long);
      // Solo time of the short generation sets the late camera's deadline: far less than its 600 tokens need.
      const t0 = process.hrtime.bigint();
      await alone(prompt(2), short);
      const solo = process.hrtime.bigint() - t0;
      const abort = new AbortController();
      const cancelled = ctx.generate(prompt(1), { ...long, seq: 1, signal: abort.signal });
      const late = ctx.generate(prompt(2), { ...long, seq: 2, deadlineNs: process.hrtime.bigint() + 3n * solo });
      const first = ctx.generate(prompt(0), { ...short, seq: 0 });
      const other = ctx.generate(prompt(3), { maxTokens: 40, ignoreEos: true, seq: 3 });
      const r0 = await first;
      abort.abort(); // cancelled as soon as camera 0 has its output
      const [r1, r2, r3] = await Promise.all([cancelled, late, other]);
      assert.deepEqual(r0.tokens, expected0.tokens);
      assert.deepEqual(r3.tokens, expected3.tokens);
      assert.equal(r1.stopReason, 'cancelled');
      assert.ok(r1.tokens.length < 600);
      assert.deepEqual(r1.tokens, expected1.tokens.slice(0, r1.tokens.length), 'what the cancelled camera got is its own output so far');
      assert.equal(r2.stopReason, 'deadline');
      assert.ok(r2.tokens.length < 600);
      // The sequences are free again, and a later frame on the cancelled one is whole.
      const again = await ctx.generate(prompt(1), { ...short, seq: 1 });
      assert.deepEqual(again.tokens, expected1.tokens.slice(0, 8));
    } finally {
      await ctx.dispose();
    }
  });

  test('a camera with a huge prompt delays a short one by at most one step', async () => {
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 2, prefillChunk: 32 });
    try {
      const fastPrompt: PromptSegment[] = [{ text: 'Front camera: a cup.', addSpecial: true }];
      const hugePrompt: PromptSegment[] = [{ text: 'Rear camera log: ' + 'the corridor is clear and '.repeat(100), addSpecial: true }];
      const fast = { maxTokens: 10, ignoreEos: true };
      // Alone on the same context (the same prefill chunks): llama.cpp's CPU kernels change with the
      // ubatch size (above some tens of rows), and with them the last bits of the logits, so a
      // 500-token prompt prefilled in one ubatch may pick other tokens than in chunks of 32 with
      // random weights. That is true of one sequence alone (nBatch 512 against 32) as well.
      const soloFast = await ctx.generate(fastPrompt, { ...fast, seq: 0 });
      const expectedHuge = await ctx.generate(hugePrompt, { maxTokens: 4, ignoreEos: true, seq: 1 });
      ctx.clearCache(0);
      ctx.clearCache(1);
      const huge = ctx.generate(hugePrompt, { maxTokens: 4, ignoreEos: true, seq: 1 });
      const both = await ctx.generate(fastPrompt, { ...fast, seq: 0 });
      const rHuge = await huge;
      assert.deepEqual(both.tokens, soloFast.tokens);
      assert.deepEqual(rHuge.tokens, expectedHuge.tokens);
      const promptTokens = rHuge.promptTokens;
      assert.ok(promptTokens > 400, `huge prompt ${promptTokens} tokens`);
      assert.ok(rHuge.batch!.steps >= Math.ceil(promptTokens / 32), 'the huge prompt went in chunks');
      assert.equal(both.batch!.peakSeqs, 2, 'the short camera ran while the huge prompt was prefilled');
      assert.ok(
        both.batch!.steps <= soloFast.batch!.steps + 1,
        `short camera: ${both.batch!.steps} steps next to the huge prompt, ${soloFast.batch!.steps} alone`,
      );
    } finally {
      await ctx.dispose();
    }
  });

  test('padded steps keep the batch one shape under the action grammar: llama.cpp reuses its graph', async () => {
    // Unpadded, a sequence's step carries its forced run when it has one, so the batch's shape
    // changes on most steps (and with a stream per sequence, unequal counts split it in ubatches).
    // llama.cpp's own reuse (the last graph only, no graph slots) is what padding is for.
    const reuse = async (stepTokens: number): Promise<{ reuses: number; steps: number; tokens: number[][] }> => {
      const ctx = await model.createContext({
        nCtx: 1024,
        nBatch: 512,
        nUbatch: 512,
        nSeq: 4,
        kvUnified: false,
        stepTokens,
        threads: 1,
        graphSlots: 0,
      });
      try {
        assert.equal(ctx.info.stepTokens, stepTokens);
        const got = await Promise.all(CAMERAS.map((_, i) => ctx.generate(cameraPrompt(i, false), { ...actionOptions(), seq: i })));
        return {
          reuses: got.reduce((n, r) => n + r.batch!.graphReuses, 0),
          steps: got.reduce((n, r) => n + r.batch!.steps, 0),
          tokens: got.map((r) => [...r.tokens]),
        };
      } finally {
        await ctx.dispose();
      }
    };
    const [plain, padded] = [await reuse(1), await reuse(4)];
    assert.deepEqual(padded.tokens, plain.tokens);
    // Prompt steps differ in shape either way (and the actions' opening runs ride in them); the
    // generation steps while every camera decodes keep one shape only when padded. Seen on this
    // machine: padded 8–9 of 38 steps, unpadded 1–2 of 35.
    const share = (r: { reuses: number; steps: number }): number => r.reuses / r.steps;
    assert.ok(
      share(padded) > 0.15 && share(padded) > 2 * share(plain),
      `padded ${padded.reuses}/${padded.steps}, plain ${plain.reuses}/${plain.steps}`,
    );
  });

  test('stepRows: steps with a row and an output for every camera, rows in steps of 8, reuse the graph where unpadded steps rarely do', async () => {
    // With one KV buffer llama.cpp reuses a graph for as many rows, outputs and distinct sequences as the
    // last; unpadded, those change as cameras prefill, take forced runs and finish.
    const reuse = async (stepRows: number): Promise<{ reuses: number; steps: number }> => {
      const { got } = await fourAtOnce({ admitTogether: true, stepRows, graphSlots: 0 }, false);
      for (const r of got) {
        assert.equal(r.stopReason, 'eos', `stepRows ${stepRows}: a complete action`);
        JSON.parse(r.text);
      }
      return {
        reuses: got.reduce((n, r) => n + r.batch!.graphReuses, 0),
        steps: got.reduce((n, r) => n + r.batch!.steps, 0),
      };
    };
    const [plain, padded] = [await reuse(0), await reuse(8)];
    const share = (r: { reuses: number; steps: number }): number => r.reuses / r.steps;
    assert.ok(
      share(padded) > 0.4 && share(padded) > 2 * share(plain),
      `padded ${padded.reuses}/${padded.steps}, plain ${plain.reuses}/${plain.steps}`,
    );
    await assert.rejects(model.createContext({ nSeq: 4, stepRows: 8 }), /stepRows is for a context of several sequences in one KV buffer/);
    await assert.rejects(
      model.createContext({ nSeq: 16, kvUnified: true, nBatch: 32, stepRows: 8 }),
      /stepRows 8 with nSeq 16 pads a decode past nBatch \(32\)/,
    );
  });

  test('sequences decoding together reuse llama.cpp graph step after step (one ubatch in sequence order)', async () => {
    // With a KV stream per sequence llama.cpp cuts a batch into ubatches of consecutive sequence ids:
    // rows in any other order cost a graph per run of ids, and the graph changes shape every step.
    const ctx = await model.createContext({ nCtx: 256, nSeq: 4, kvUnified: false, threads: 1 });
    try {
      const steps = 40;
      const prompt = (i: number): PromptSegment[] => [{ text: `Camera ${CAMERAS[i]} sees`, addSpecial: true }];
      // Submitted out of sequence order.
      const got = await Promise.all([3, 1, 0, 2].map((seq) => ctx.generate(prompt(seq), { maxTokens: steps, ignoreEos: true, seq })));
      for (const r of got) {
        assert.equal(r.tokens.length, steps);
        // Steps that change the batch's shape (a prompt joining, a sequence leaving) build a graph.
        assert.ok(
          r.batch!.graphReuses >= r.batch!.steps - 8,
          `sequence ${r.batch!.seq}: ${r.batch!.graphReuses} of ${r.batch!.steps} steps reused the graph`,
        );
      }
    } finally {
      await ctx.dispose();
    }
  });

  test('admitting together: an arrival waits for the running group, unless waiting would make it miss', async () => {
    const prompt = (k: number): PromptSegment[] => [{ text: `Camera front, frame ${k}: the robot`, addSpecial: true }];
    const long = { maxTokens: 200, ignoreEos: true };
    // Camera 0 generates 200 tokens; once it has begun, camera 1 asks for a few. With `between`, its deadline lies halfway
    // between the time admission predicts for its own run and that after camera 0's rest (none: no deadline).
    // Both come from the same history, so a slow machine moves them together.
    const arrival = async (
      admitTogether: boolean,
      between = false,
      joinRunning = true,
    ): Promise<{ r1: GenerateResult; startedAt: number; joins: number }> => {
      const ctx = await model.createContext({ nCtx: 1024, nSeq: 2, threads: 1, admitTogether, ...(joinRunning ? {} : { joinRunning }) });
      try {
        // History for the predictions: a request of 200 steps.
        await ctx.generate(prompt(0), { ...long, seq: 0 });
        // Emptied, so its positions count the next request's prompt and tokens only (once the loop has taken the clear).
        const before = ctx.cachedPositions(0);
        ctx.clearCache(0);
        let running = true;
        const first = ctx.generate(prompt(1), { ...long, seq: 0 }).finally(() => (running = false));
        let cleared = false;
        for (let p = before; running && !(cleared && p >= 24); p = ctx.cachedPositions(0)) {
          cleared ||= p < before;
          await sleep(1);
        }
        assert.ok(running, 'camera 0 was still generating when camera 1 came');
        const startedAt = ctx.cachedPositions(0);
        const now = process.hrtime.bigint();
        const { waitMs, ownMs } = ctx.prediction(now + 600_000_000_000n);
        if (between) assert.ok(waitMs > 0 && ownMs > 0, `camera 0's rest ${waitMs} ms, a request's own time ${ownMs} ms`);
        const deadline = between ? { deadlineNs: now + BigInt(Math.round((ownMs + waitMs / 2) * 1e6)) } : {};
        const r1 = await ctx.generate(prompt(2), { ...long, maxTokens: 5, seq: 1, ...deadline });
        await first;
        return { r1, startedAt, joins: ctx.timeAccount()!.joins };
      } finally {
        await ctx.dispose();
      }
    };
    const plain = await arrival(false);
    assert.equal(plain.r1.batch!.peakSeqs, 2, 'one at a time: it joins the running camera');
    assert.equal(plain.joins, 1, 'its admission beside the running camera is counted');
    // Without a deadline it waits for the group: it ran alone, after steps it waited through.
    const waited = await arrival(true);
    assert.equal(waited.r1.tokens.length, 5);
    assert.equal(waited.r1.batch!.peakSeqs, 1, `held until camera 0 ended (camera 0 at ${waited.startedAt} positions when it came)`);
    assert.ok(waited.r1.batch!.waitSteps > 0, 'camera 0 stepped while it waited');
    assert.equal(waited.joins, 0, 'it went in alone, not beside camera 0');
    // Its own time would make the deadline; waiting first for camera 0's rest would not: it joins at once.
    const joined = await arrival(true, true);
    const seen = `camera 0 at ${joined.startedAt} positions when it came; predicted ${joined.r1.batch!.predictedMs.toFixed(1)} ms`;
    assert.equal(joined.r1.batch!.predictedMiss, false, seen);
    assert.equal(joined.r1.batch!.peakSeqs, 2, `it joined camera 0 (${seen})`);
    assert.equal(joined.r1.stopReason, 'max_tokens');
    assert.equal(joined.joins, 1, seen);
    // joinRunning false: the same arrival does not join; it would miss waiting, so it is dropped as a predicted miss.
    const dropped = await arrival(true, true, false);
    const seenDropped = `camera 0 at ${dropped.startedAt} positions when it came; predicted ${dropped.r1.batch!.predictedMs.toFixed(1)} ms`;
    assert.equal(dropped.r1.stopReason, 'deadline', seenDropped);
    assert.equal(dropped.r1.batch!.predictedMiss, true, seenDropped);
    assert.equal(dropped.r1.tokens.length, 0, `no token decoded (${seenDropped})`);
    assert.ok(dropped.r1.batch!.predictedMs > 0, 'the drop names the wait and run it predicted');
    assert.equal(dropped.joins, 0, seenDropped);
  });

  test("admitting together, a running group's rest lasts until its longest member is predicted to end, not its median", async () => {
    // History: three requests of 10 steps and one of 100. A member past 10 steps ends like the 100-step one did,
    // where the median (10) would say one step is left. A request that waits for the group sees that rest.
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 2, threads: 1, admitTogether: true });
    try {
      const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${k}: the robot`, addSpecial: true }];
      for (const [k, maxTokens] of [10, 10, 10, 100].entries()) {
        ctx.clearCache(0);
        await ctx.generate(prompt(k), { maxTokens, ignoreEos: true, seq: 0 });
      }
      // The rest read while a member of `maxTokens` has run 20 steps at least (its prompt is under 16 positions).
      const restAt = async (maxTokens: number): Promise<{ waitMs: number; ownMs: number; seen: string }> => {
        ctx.clearCache(0);
        const far = process.hrtime.bigint() + 600_000_000_000n;
        const member = ctx.generate(prompt(5), { maxTokens, ignoreEos: true, seq: 0 });
        let reading = { waitMs: 0, ownMs: 0 };
        let positions = 0;
        for (let tries = 0; tries < 5000 && reading.waitMs === 0; tries++) {
          await sleep(1);
          positions = ctx.cachedPositions(0);
          if (positions >= 36 && positions < 44) reading = ctx.prediction(far);
        }
        await member;
        const seen = `maxTokens ${maxTokens}: rest ${reading.waitMs.toFixed(1)} ms, a request's own ${reading.ownMs.toFixed(1)} ms, read at ${positions} positions`;
        assert.ok(reading.ownMs > 0 && reading.waitMs > 0, seen);
        return { ...reading, seen };
      };
      // About 60 steps left against one of prefill and 10 steps: well above the own time, where the median said one step.
      const open = await restAt(100);
      assert.ok(open.waitMs > 2 * open.ownMs, open.seen);
      // A member with 40 tokens at most has about 16 steps left, whatever the history says.
      const bounded = await restAt(40);
      assert.ok(bounded.waitMs < 2 * bounded.ownMs, bounded.seen);
    } finally {
      await ctx.dispose();
    }
  });

  test('admitting together, an idle decoder holds a request for one on its way (expect), so both go in one group', async () => {
    const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${k}: the corridor`, addSpecial: true }];
    // Camera 0 asks; camera 1 asks a moment later. Announced, camera 0 has decoded nothing by then.
    const pair = async (announce: boolean): Promise<{ results: GenerateResult[]; positions: number }> => {
      const ctx = await model.createContext({ nCtx: 512, nSeq: 2, threads: 1, admitTogether: true, groupWaitMs: 1000 });
      try {
        if (announce) ctx.expect(1, 1);
        let running = true;
        const first = ctx.generate(prompt(0), { maxTokens: 60, ignoreEos: true, seq: 0 }).finally(() => (running = false));
        if (announce) await sleep(50);
        else while (running && ctx.cachedPositions(0) === 0) await sleep(1);
        const positions = ctx.cachedPositions(0);
        if (announce) ctx.expect(1, -1);
        const second = ctx.generate(prompt(1), { maxTokens: 60, ignoreEos: true, seq: 1 });
        return { results: await Promise.all([first, second]), positions };
      } finally {
        await ctx.dispose();
      }
    };
    const held = await pair(true);
    assert.equal(held.positions, 0, 'camera 0 was held while camera 1 was on its way');
    assert.deepEqual(
      held.results.map((r) => r.batch!.peakSeqs),
      [2, 2],
      'they went in as one group',
    );
    const alone = await pair(false);
    assert.ok(alone.positions > 0, 'with nothing announced, camera 0 started at once');
    await assert.rejects(model.createContext({ nCtx: 64, groupWaitMs: 5 }), /groupWaitMs is for a context of several sequences/);
  });

  test('admitting together, the hold for a request on its way ends with time left for the waiting one, not at groupWaitMs', async () => {
    // Camera 1 is announced and never comes; camera 0 asks with a deadline well inside groupWaitMs. It is held, then
    // admitted with time left for its run, not at groupWaitMs (the deadline would have passed) and not at once.
    // Whether the run then fits depends on this machine's load, so only the admission is asserted.
    const ctx = await model.createContext({ nCtx: 512, nSeq: 2, threads: 1, admitTogether: true, groupWaitMs: 1000 });
    try {
      const t0 = process.hrtime.bigint();
      await ctx.generate([{ text: 'Camera 0: the corridor', addSpecial: true }], { maxTokens: 8, ignoreEos: true, seq: 0 });
      const ranNs = process.hrtime.bigint() - t0; // what a request takes here, as the history now says
      ctx.expect(1, 1);
      const submitNs = process.hrtime.bigint();
      const deadlineNs = submitNs + 400_000_000n + 2n * ranNs;
      const r = await ctx.generate([{ text: 'Camera 0: the door', addSpecial: true }], {
        maxTokens: 8,
        ignoreEos: true,
        seq: 0,
        deadlineNs,
      });
      ctx.expect(1, -1);
      const ranMs = Number(ranNs) / 1e6;
      const seen = `held ${r.batch!.queueMs.toFixed(1)} ms; a request took ${ranMs.toFixed(1)} ms; ${r.stopReason}`;
      assert.ok(r.batch!.queueMs >= 100, `it was held for camera 1 (${seen})`);
      assert.ok(r.batch!.queueMs + ranMs <= Number(deadlineNs - submitNs) / 1e6, `and admitted with a run's time left (${seen})`);
    } finally {
      await ctx.dispose();
    }
  });

  test('a request whose deadline its predicted time would miss is dropped before its prefill', async () => {
    const ctx = await model.createContext({ nCtx: 512, nSeq: 2, threads: 1 });
    try {
      const prompt = (k: number): PromptSegment[] => [{ text: `Camera front, frame ${k}: the robot`, addSpecial: true }];
      const options = { maxTokens: 200, ignoreEos: true, seq: 1 };
      // Nothing to predict from yet: the first request is admitted (a generous deadline: one already
      // late when admission looks at it ends as late, not admitted).
      const first = await ctx.generate(prompt(0), { ...options, deadlineNs: process.hrtime.bigint() + 600_000_000_000n });
      assert.equal(first.batch!.predictedMiss, false);
      assert.ok(first.batch!.steps > 0, 'admitted and run');
      // History: the sequence's requests take 200 tokens; the scheduler has timed its steps.
      const full = await ctx.generate(prompt(1), options);
      assert.equal(full.tokens.length, 200);
      const cached = ctx.cachedPositions(1);
      // Room for 30 steps at the pace just measured, where 200 are needed (room enough that a loaded
      // machine does not make it late before admission looks at it: late is checked first).
      const stepNs = BigInt(Math.ceil((full.timings.decodeMs * 1e6) / full.batch!.steps));
      // What admission will predict, readable before submitting (no step runs in between).
      const predicted = ctx.predictedMs();
      const hopeless = await ctx.generate(prompt(2), { ...options, deadlineNs: process.hrtime.bigint() + 30n * stepNs });
      assert.equal(hopeless.stopReason, 'deadline');
      assert.equal(hopeless.batch!.predictedMiss, true);
      assert.ok(hopeless.batch!.predictedMs > 0);
      assert.equal(hopeless.batch!.predictedMs, predicted, 'predictedMs() says what admission predicted');
      assert.equal(hopeless.tokens.length, 0);
      assert.equal(hopeless.batch!.steps, 0, 'it took part in no step');
      assert.equal(ctx.cachedPositions(1), cached, 'its prompt cache is untouched');
      // A deadline it can meet: admitted and decoded as before.
      const again = await ctx.generate(prompt(1), { ...options, deadlineNs: process.hrtime.bigint() + 1000n * stepNs * 200n });
      assert.equal(again.batch!.predictedMiss, false);
      assert.ok(again.batch!.predictedMs > 0, 'predicted from the history');
      assert.deepEqual(again.tokens, full.tokens);
    } finally {
      await ctx.dispose();
    }
  });

  test('an idle decoder whose history predicts every request to miss still admits one (a probe) after a second without steps', async () => {
    const ctx = await model.createContext({ nCtx: 512, nSeq: 2, threads: 1 });
    try {
      const prompt = (k: number): PromptSegment[] => [{ text: `Camera front, frame ${k}: the robot`, addSpecial: true }];
      const options = { maxTokens: 200, ignoreEos: true, seq: 1 };
      // History: the sequence's requests take 200 generation steps.
      const t0 = process.hrtime.bigint();
      const full = await ctx.generate(prompt(0), options);
      const fullNs = process.hrtime.bigint() - t0;
      assert.equal(full.tokens.length, 200);
      // A fifth of one such request's time: predicted to miss (the prediction is about its whole time).
      const first = await ctx.generate(prompt(1), { ...options, deadlineNs: process.hrtime.bigint() + fullNs / 5n });
      assert.equal(first.batch!.predictedMiss, true, 'the history says such a request misses');
      const predictedNs = BigInt(Math.floor(first.batch!.predictedMs * 1e6));
      // Nothing runs, so nothing refreshes the history: every later request with half the predicted
      // time is predicted to miss too, for good, unless the idle decoder probes. Paced so that more
      // than a second without steps passes within the stream (sleeps only get longer under load).
      const got: GenerateResult[] = [];
      for (let k = 0; k < 12 && !got.some((r) => r.batch!.steps > 0); k++) {
        got.push(await ctx.generate(prompt(2 + k), { ...options, deadlineNs: process.hrtime.bigint() + predictedNs / 2n }));
        await sleep(250);
      }
      const seen = got.map((r) => `${r.batch!.predictedMiss ? 'dropped' : 'admitted'} ${r.batch!.steps} steps`).join(', ');
      const admitted = got.find((r) => r.batch!.steps > 0);
      assert.ok(admitted, `one request of the stream was admitted: ${seen}`);
      assert.equal(admitted.batch!.predictedMiss, false);
      assert.ok(admitted.tokens.length > 0, 'the probe ran');
      // Idle past a second, the decoder would probe whatever it predicts: it predicts nothing, so a
      // caller that drops frames before submitting them cannot keep it from refreshing its history.
      await sleep(1100);
      assert.equal(ctx.predictedMs(), 0);
    } finally {
      await ctx.dispose();
    }
  });

  test('overloaded, eight cameras with deadlines get in time at least half of what one camera gets', async (t) => {
    // Each camera asks again as soon as it has its answer (its next frame is waiting), with a deadline
    // of three times one request's time alone; one dropped waits for its next frame (one request's
    // time alone) instead of asking again at once. Sharing every step among eight makes every request
    // miss on a CPU (a step of eight costs about as much as eight steps of one), so admission must
    // serve as many as can make it and drop the rest before their prefill. Relative to this machine
    // and robust to its load changing (a full test suite runs beside it): the time alone is measured
    // again before each round, and the rounds alternate one camera and eight, windows of equal length
    // in that time, so a slow spell falls on both sides; the totals are compared.
    const n = 8;
    const ctx = await model.createContext({ nCtx: 128 * n, nSeq: n, threads: 1 });
    const now = (): bigint => process.hrtime.bigint();
    const sleepNs = (ns: bigint): Promise<void> => new Promise((resolve) => setTimeout(resolve, Number(ns / 1_000_000n)));
    try {
      const prompt = (i: number, k: number): PromptSegment[] => [{ text: `Camera ${i}, frame ${k}: the robot`, addSpecial: true }];
      const options = { maxTokens: 24, ignoreEos: true };
      let frame = 0;
      const soloTime = async (): Promise<bigint> => {
        const solo: bigint[] = [];
        for (let k = 0; k < 3; k++) {
          const t0 = now();
          await ctx.generate(prompt(0, frame++), { ...options, seq: 0 });
          solo.push(now() - t0);
        }
        solo.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
        return solo[1]!;
      };
      await soloTime(); // fills the prompt cache
      type Got = { inTime: number; predicted: number; late: number };
      const run = async (cameras: number, soloNs: bigint, got: Got): Promise<void> => {
        const end = now() + 10n * soloNs;
        await Promise.all(
          Array.from({ length: cameras }, async (_, i) => {
            while (now() < end) {
              const r = await ctx.generate(prompt(i, frame++), { ...options, seq: i, deadlineNs: now() + 3n * soloNs });
              if (r.stopReason !== 'deadline') got.inTime += 1;
              else if (r.batch!.predictedMiss) got.predicted += 1;
              else got.late += 1;
              if (r.stopReason === 'deadline') await sleepNs(soloNs);
              else await new Promise((resolve) => setImmediate(resolve));
            }
          }),
        );
      };
      const one: Got = { inTime: 0, predicted: 0, late: 0 };
      const many: Got = { inTime: 0, predicted: 0, late: 0 };
      for (let round = 0; round < 4; round++) {
        const soloNs = await soloTime();
        await run(1, soloNs, one);
        await run(n, soloNs, many);
      }
      const seen = `one camera ${JSON.stringify(one)}, ${n} cameras ${JSON.stringify(many)}`;
      t.diagnostic(seen);
      assert.ok(one.inTime > 0, seen);
      assert.ok(many.inTime >= one.inTime / 2, seen);
      assert.ok(many.predicted > 0, `the requests that could not make it were dropped before their prefill: ${seen}`);
    } finally {
      await ctx.dispose();
    }
  });

  test('past maxActive, requests are admitted in arrival order: no camera starves', async () => {
    const ctx = await model.createContext({ nCtx: 256, nSeq: 4, maxActive: 2 });
    try {
      const rounds = 5;
      const completed = [0, 0, 0, 0];
      let spread = 0;
      let waited = 0;
      const camera = async (i: number): Promise<void> => {
        for (let k = 0; k < rounds; k++) {
          const r = await ctx.generate([{ text: `Camera ${CAMERAS[i]} frame ${k}:`, addSpecial: true }], {
            maxTokens: 6,
            ignoreEos: true,
            seq: i,
          });
          waited += r.batch!.waitSteps;
          assert.ok(r.batch!.peakSeqs <= 2, 'never more than maxActive sequences in a step');
          completed[i]! += 1;
          spread = Math.max(spread, Math.max(...completed) - Math.min(...completed));
        }
      };
      await Promise.all(CAMERAS.map((_, i) => camera(i)));
      assert.deepEqual(completed, [rounds, rounds, rounds, rounds]);
      assert.ok(waited > 0, 'requests waited for admission (the batch was full)');
      assert.ok(spread <= 2, `one camera got ${spread} frames ahead of another`);
    } finally {
      await ctx.dispose();
    }
  });

  test('what a caller is told a request submitted now would take includes its wait behind the requests admitted before it', async () => {
    // One sequence at a time: requests queue. The wait is what the queue has drained at lately (the
    // gaps between admissions while requests waited), times the waiting requests admission takes
    // first: all of them for a request without a deadline, none for one whose deadline is earlier
    // than theirs. Only times this run measured are compared, so no machine is too slow for it.
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 5, maxActive: 1, threads: 1 });
    try {
      const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${k}: the robot`, addSpecial: true }];
      const burst = await Promise.all([0, 1, 2, 3, 4].map((seq) => ctx.generate(prompt(seq), { maxTokens: 20, ignoreEos: true, seq })));
      const admitted = burst.map((r) => r.batch!.queueMs).sort((a, b) => a - b);
      const gaps = admitted.slice(1).map((t, i) => t - admitted[i]!);
      const shortestGap = Math.min(...gaps);
      assert.ok(shortestGap > 0, `one admission at a time: admitted at ${admitted.join(', ')} ms`);
      // A long request runs (the earliest deadline: admitted first); four more queue behind it, their
      // deadlines ten minutes away.
      const far = process.hrtime.bigint() + 600_000_000_000n;
      // It runs until the readings below hold (then it is cancelled), or to nearly the whole context:
      // how long the loop may take follows from this run's own speed, not from a token count.
      const stopLong = new AbortController();
      const long = ctx.generate(prompt(0), {
        maxTokens: 900,
        ignoreEos: true,
        seq: 0,
        deadlineNs: far - 500_000_000_000n,
        signal: stopLong.signal,
      });
      const queued = [1, 2, 3, 4].map((seq) => ctx.generate(prompt(seq), { maxTokens: 20, ignoreEos: true, seq, deadlineNs: far }));
      // Read while the long request runs, after a step has seen the four (the prediction is
      // refreshed every step). The three readings come from one step's snapshot unless a step ends
      // between them (a loaded machine can pause this thread that long): read again until they agree.
      let running = true;
      void long.finally(() => (running = false));
      let last = 0;
      let first = 0;
      let behind = 0;
      let reserved = 0;
      const holds = (): boolean =>
        last >= 3 * shortestGap &&
        last - first >= 3 * shortestGap &&
        Math.abs(behind - last) < shortestGap &&
        reserved - first >= 1.5 * shortestGap;
      while (running && !holds()) {
        await sleep(5);
        first = ctx.predictedMs(far - 300_000_000_000n); // admitted before the four
        last = ctx.predictedMs(); // no deadline: after every one of them
        behind = ctx.predictedMs(far + 300_000_000_000n); // after them too
        reserved = ctx.predictedMs(far - 300_000_000_000n, 2); // before them, after two frames on their way
      }
      stopLong.abort();
      const ended = await Promise.all([long, ...queued]);
      assert.deepEqual(
        ended.map((r) => r.batch!.peakSeqs),
        [1, 1, 1, 1, 1],
        'one at a time',
      );
      assert.ok(
        ended.slice(1).every((r) => r.batch!.queueMs > ended[0]!.batch!.queueMs),
        'the long request went first',
      );
      const seen = `without a deadline ${last.toFixed(1)} ms, before their deadlines ${first.toFixed(1)} ms; admissions while requests waited came ${gaps.map((g) => g.toFixed(1)).join(', ')} ms apart`;
      assert.ok(last >= 3 * shortestGap, seen);
      assert.ok(last - first >= 3 * shortestGap, `a request due before the waiting ones does not wait behind them: ${seen}`);
      assert.ok(Math.abs(behind - last) < shortestGap, `a deadline after theirs waits like none: ${behind.toFixed(1)} ms; ${seen}`);
      assert.ok(
        reserved - first >= 1.5 * shortestGap,
        `two frames reserved ahead wait like two more requests: ${reserved.toFixed(1)} ms; ${seen}`,
      );
      // Nothing waits: the wait is gone again (the prediction is the request's own time).
      assert.ok(ctx.predictedMs() < last, `an empty queue predicts less: ${ctx.predictedMs().toFixed(1)} ms`);
      assert.throws(() => ctx.predictedMs(5 as unknown as bigint), /deadlineNs must be a bigint/);
      assert.throws(() => ctx.predictedMs(far, -1), /reservedAhead/);
    } finally {
      await ctx.dispose();
    }
  });

  test('admitting together, what a caller is told includes the rest of the running group, and a whole group per maxActive before it', async () => {
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 3, maxActive: 1, admitTogether: true, threads: 1 });
    try {
      const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${k}: the robot`, addSpecial: true }];
      const far = process.hrtime.bigint() + 600_000_000_000n;
      // History: requests of 300 steps.
      await ctx.generate(prompt(0), { maxTokens: 300, ignoreEos: true, seq: 0 });
      await ctx.generate(prompt(1), { maxTokens: 300, ignoreEos: true, seq: 1 });
      const idle = ctx.predictedMs(far);
      assert.ok(idle > 0, 'predicted from the history');
      assert.equal(ctx.predictedMs(far, 2), idle + 2 * idle, 'idle, two reserved ahead: two whole groups of one before it');
      ctx.clearCache(0);
      const long = ctx.generate(prompt(2), { maxTokens: 600, ignoreEos: true, seq: 0 });
      // While the request runs: a group's own time and the group's rest, from the readings with none and two ahead.
      let rest = 0;
      let own = 0;
      for (let tries = 0; tries < 1000 && !(rest > 0); tries++) {
        await sleep(1);
        if (ctx.cachedPositions(0) < 8) continue;
        const none = ctx.predictedMs(far);
        const two = ctx.predictedMs(far, 2);
        own = (two - none) / 2;
        rest = none - own;
      }
      const positions = ctx.cachedPositions(0);
      await long;
      assert.ok(own > 0, `a group's own time: ${own.toFixed(1)} ms`);
      // The rest is what the running request still needs of the 300 steps its history predicts (one step at least).
      assert.ok(
        rest > 0,
        `the running group's rest counts: ${rest.toFixed(1)} ms (own ${own.toFixed(1)} ms, read at ${positions} positions)`,
      );
      // Idle again: no rest, only whole groups. Exact, since the step times may have moved since the readings above.
      const after = ctx.predictedMs(far);
      assert.equal(ctx.predictedMs(far, 2), after + 2 * after, 'idle again, no rest');
    } finally {
      await ctx.dispose();
    }
  });

  test("admitTail: the group's tail takes the waiting requests in once they outnumber its members (and tailJoin wait); without it they wait for its end", async () => {
    // Two long requests run; a short one arrives (one waiting, two running): held. A second arrives (two and two): both
    // go in beside the long ones and end first. Without admitTail both wait for the long ones.
    const run = async (admitTail: boolean, tailJoin = 1) => {
      const ctx = await model.createContext({
        nCtx: 1024,
        nSeq: 4,
        admitTogether: true,
        admitTail,
        ...(admitTail ? { tailJoin } : {}),
        threads: 1,
      });
      try {
        assert.equal(ctx.info.admitTail, admitTail);
        assert.equal(ctx.info.tailJoin, tailJoin);
        const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${CAMERAS[k]}: the robot`, addSpecial: true }];
        const ended: number[] = [];
        const generate = (seq: number, maxTokens: number) =>
          ctx.generate(prompt(seq), { maxTokens, ignoreEos: true, seq }).then((r) => (ended.push(seq), r));
        // History first: without it nothing predicts a group's rest, and nothing is held.
        await generate(0, 8);
        ctx.clearCache(0);
        ended.length = 0;
        const long = [generate(2, 400), generate(3, 400)];
        const until = async (what: () => boolean) => {
          for (let tries = 0; tries < 10_000 && !what(); tries++) await sleep(1);
        };
        await until(() => ctx.cachedPositions(2) > 8 && ctx.cachedPositions(3) > 8);
        const first = generate(0, 4);
        const at = ctx.cachedPositions(3);
        await until(() => ctx.cachedPositions(3) > at + 40);
        const heldAlone = ctx.cachedPositions(0);
        // A request asking now would make two waiting beside two running: with admitTail it waits for no one.
        const waitMs = ctx.prediction(process.hrtime.bigint() + 600_000_000_000n).waitMs;
        const second = generate(1, 4);
        const short = await Promise.all([first, second]);
        await Promise.all(long);
        return { heldAlone, waitMs, ended, peak: short.map((r) => r.batch!.peakSeqs) };
      } finally {
        await ctx.dispose();
      }
    };
    const tail = await run(true);
    assert.equal(tail.heldAlone, 0, 'one waiting beside two running: held');
    assert.equal(tail.waitMs, 0, 'a second one would not wait: predicted so');
    assert.deepEqual(tail.ended.slice(2).sort(), [2, 3], `the two short ones end first: ${tail.ended}`);
    assert.deepEqual(tail.peak, [4, 4], 'they ran beside the long ones');
    const plain = await run(false);
    assert.deepEqual(plain.ended.slice(0, 2).sort(), [2, 3], `without admitTail the long ones end first: ${plain.ended}`);
    assert.ok(plain.waitMs > 0, `without it a request waits for the running group: ${plain.waitMs} ms`);
    // tailJoin 3: two waiting are too few to go in beside the tail, so they wait for its end.
    const three = await run(true, 3);
    assert.deepEqual(three.ended.slice(0, 2).sort(), [2, 3], `two of three to join: the long ones end first: ${three.ended}`);
    assert.ok(three.waitMs > 0, `two of three to join wait for the running group: ${three.waitMs} ms`);
    await assert.rejects(
      model.createContext({ nSeq: 2, admitTogether: true, tailJoin: 2 }),
      /tailJoin is for a context that admits the tail/,
    );
    await assert.rejects(model.createContext({ nSeq: 2, admitTail: true }), /admitTail is for a context that admits together/);
  });

  test('weighTail: the tail takes a short request in beside long ones, and holds one whose image decode would cost them more than it saves', async () => {
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 4, admitTogether: true, admitTail: true, weighTail: true, threads: 1 });
    try {
      assert.equal(ctx.info.weighTail, true);
      const text = (k: number): PromptSegment[] => [{ text: `Camera ${CAMERAS[k]}: the robot`, addSpecial: true }];
      const withImage = (k: number, rows: number): PromptSegment[] => [
        { text: `Camera ${CAMERAS[k]}: the robot`, addSpecial: true },
        { image: fakeImage(rows, model.info.nEmbd, 300 + k + rows), nTokens: rows },
        { text: ' sees' },
      ];
      const ended: number[] = [];
      const generate = (seq: number, prompt: PromptSegment[], maxTokens: number) =>
        ctx.generate(prompt, { maxTokens, ignoreEos: true, seq }).then((r) => (ended.push(seq), r));
      const until = async (what: () => boolean) => {
        for (let tries = 0; tries < 20_000 && !what(); tries++) await sleep(1);
      };
      const clear = () => [0, 1, 2, 3].forEach((s) => ctx.clearCache(s));

      // 1. History of long requests; two long ones run and a short one arrives: it goes in beside them and ends first.
      await generate(0, text(0), 200);
      clear();
      ended.length = 0;
      const long = [generate(2, text(2), 200), generate(3, text(3), 200)];
      await until(() => ctx.cachedPositions(2) > 20 && ctx.cachedPositions(3) > 20);
      let account = ctx.timeAccount()!;
      const short = await generate(1, text(1), 4);
      await Promise.all(long);
      let now = ctx.timeAccount()!;
      assert.equal(ended[0], 1, `the short one ends first: ${ended}`);
      assert.equal(short.batch!.peakSeqs, 3, 'it ran beside the long ones');
      assert.equal(now.tailJoins - account.tailJoins, 1, 'its join was counted');

      // 2. History of short requests and a large image; two short ones near their end, and one with a large image
      //    arrives: its image decode would hold both for longer than it waits, so it waits for their end.
      clear();
      await generate(0, withImage(0, 480), 24);
      await generate(0, withImage(0, 24), 24);
      clear();
      ended.length = 0;
      const nearEnd = [generate(2, withImage(2, 24), 24), generate(3, withImage(3, 24), 24)];
      const start = (seq: number) => ctx.cachedPositions(seq) >= 30;
      await until(() => start(2) && start(3));
      const base = Math.min(ctx.cachedPositions(2), ctx.cachedPositions(3));
      await until(() => Math.min(ctx.cachedPositions(2), ctx.cachedPositions(3)) >= base + 16);
      // From here on only the large one waits (the second of the two may have joined the first).
      account = ctx.timeAccount()!;
      const large = await generate(1, withImage(1, 480), 24);
      await Promise.all(nearEnd);
      now = ctx.timeAccount()!;
      assert.deepEqual(ended.slice(0, 2).sort(), [2, 3], `the two near their end end first: ${ended}`);
      assert.equal(large.batch!.peakSeqs, 1, 'the large image ran after them');
      assert.ok(now.tailHolds - account.tailHolds >= 1, `a hold was counted: ${now.tailHolds - account.tailHolds}`);
      assert.equal(now.tailJoins, account.tailJoins, 'the large one never joined');
    } finally {
      await ctx.dispose();
    }
    await assert.rejects(
      model.createContext({ nSeq: 2, admitTogether: true, weighTail: true }),
      /weighTail is for a context that admits the tail/,
    );
    await assert.rejects(
      model.createContext({ nSeq: 3, admitTogether: true, admitTail: true, weighTail: true, tailJoin: 2 }),
      /takes no tailJoin/,
    );
    await assert.rejects(model.createContext({ nSeq: 2, joinRunning: false }), /joinRunning is for a context that admits together/);
    await assert.rejects(
      model.createContext({ nSeq: 2, admitTogether: true, admitTail: true, joinRunning: false }),
      /joinRunning is for a context that admits together without a tail/,
    );
    await assert.rejects(model.createContext({ joinRunning: true }), /joinRunning is for a context of several sequences/);
    await assert.rejects(model.createContext({ backendSampling: true }), /backendSampling is for a context of several sequences/);
  });

  test("restMs: a running request's rest, a waiting one's after it, none for a sequence without one", async () => {
    const ctx = await model.createContext({ nCtx: 1024, nSeq: 3, maxActive: 1, admitTogether: true, threads: 1 });
    try {
      const prompt = (k: number): PromptSegment[] => [{ text: `Camera ${k}: the robot`, addSpecial: true }];
      // History: a request of 300 steps.
      await ctx.generate(prompt(0), { maxTokens: 300, ignoreEos: true, seq: 0 });
      assert.equal(ctx.restMs(0), undefined, 'none in flight');
      ctx.clearCache(0);
      const long = ctx.generate(prompt(2), { maxTokens: 600, ignoreEos: true, seq: 0 });
      const queued = ctx.generate(prompt(1), { maxTokens: 20, ignoreEos: true, seq: 1 });
      let running: number | undefined;
      let waiting: number | undefined;
      let none: number | undefined;
      for (let tries = 0; tries < 1000 && (running === undefined || waiting === undefined); tries++) {
        await sleep(1);
        if (ctx.cachedPositions(0) < 8) continue;
        running = ctx.restMs(0);
        waiting = ctx.restMs(1);
        none = ctx.restMs(2);
      }
      await Promise.all([long, queued]);
      assert.ok(running !== undefined && running > 0, `the running request's rest: ${running} ms`);
      assert.ok(waiting !== undefined && waiting > running, `the waiting one ends after it: ${waiting} ms, ${running} ms`);
      assert.equal(none, undefined, 'a sequence without a request');
      assert.deepEqual([ctx.restMs(0), ctx.restMs(1)], [undefined, undefined], 'both ended');
      assert.throws(() => ctx.restMs(3), /seq/);
      // Where the time went: three requests, one at a time (maxActive 1), each admitted into an idle decoder.
      const t = ctx.timeAccount()!;
      assert.equal(t.groups, 3, JSON.stringify(t));
      assert.ok(t.steps >= 300 + 600 + 20, `a step per token at least: ${t.steps}`);
      assert.ok(t.tokenMs > 0 && t.sampleMs > 0 && t.imageMs === 0, JSON.stringify(t));
      assert.ok(t.stepMs >= t.tokenMs + t.sampleMs, 'the steps hold their decodes and sampling');
      // What the times bought: one sequence a decode, and steps of one shape reuse the graph.
      assert.equal(t.imageDecodes + t.imageRows, 0, JSON.stringify(t));
      assert.ok(t.tokenDecodes >= 300 + 600 + 20 && t.tokenDecodes <= t.steps, JSON.stringify(t));
      assert.equal(t.tokenSeqs, t.tokenDecodes, 'maxActive 1: one sequence in each token decode');
      assert.ok(t.tokenRows >= t.tokenDecodes, JSON.stringify(t));
      assert.ok(t.reusedDecodes > 0 && t.reusedDecodes <= t.tokenDecodes, JSON.stringify(t));
      assert.ok(t.reusedMs > 0 && t.reusedMs <= t.tokenMs, JSON.stringify(t));
    } finally {
      await ctx.dispose();
    }
  });

  test('deadlines within 50 ms count as one: the camera admitted least recently goes first (cameras take turns)', async () => {
    const ctx = await model.createContext({ nCtx: 256, nSeq: 4, maxActive: 1 });
    try {
      const far = process.hrtime.bigint() + 600_000_000_000n; // no request is predicted to miss
      const order: number[] = [];
      // One round: camera 0 holds the decoder while cameras 1–3 queue with the given deadline offsets (ns).
      const round = async (offsets: Record<number, bigint>): Promise<number[]> => {
        order.length = 0;
        // The earliest deadline by far, so it goes first even if it reaches the scheduler with the others.
        const blocker = ctx.generate([{ text: 'Camera front, hold:', addSpecial: true }], {
          maxTokens: 24,
          ignoreEos: true,
          seq: 0,
          deadlineNs: far - 300_000_000_000n,
        });
        const queued = [3, 2, 1].map((i) =>
          ctx
            .generate([{ text: `Camera ${CAMERAS[i]}:`, addSpecial: true }], {
              maxTokens: 4,
              ignoreEos: true,
              seq: i,
              deadlineNs: far + offsets[i]!,
            })
            .then((r) => {
              assert.equal(r.stopReason, 'max_tokens');
              order.push(i);
            }),
        );
        await Promise.all([blocker, ...queued]);
        return [...order];
      };
      // First turn for all: the earliest deadline first.
      assert.deepEqual(await round({ 1: 0n, 2: 1_000n, 3: 2_000n }), [1, 2, 3]);
      // Camera 3 now stamps a few µs earliest, but camera 1 has waited longest since its turn.
      assert.deepEqual(await round({ 1: 2_000n, 2: 1_000n, 3: 0n }), [1, 2, 3]);
      // A deadline earlier by more than the window still goes first.
      assert.deepEqual(await round({ 1: 0n, 2: 0n, 3: -1_000_000_000n }), [3, 1, 2]);
    } finally {
      await ctx.dispose();
    }
  });

  test('refusals: a busy sequence, a sequence out of range, a speculator, options for one sequence, mixed steps outside one KV buffer', async () => {
    const ctx = await model.createContext({ nCtx: 256, nSeq: 2 });
    try {
      const running = ctx.generate([{ text: 'a', addSpecial: true }], { maxTokens: 4, ignoreEos: true, seq: 1 });
      await assert.rejects(ctx.generate([{ text: 'b' }], { maxTokens: 4, seq: 1 }), { code: 'EBUSY' });
      assert.throws(() => ctx.clearCache(1), { code: 'EBUSY' });
      await running;
      await assert.rejects(ctx.generate([{ text: 'b' }], { maxTokens: 4, seq: 2 }), /options\.seq/);
      await assert.rejects(ctx.generate([{ text: 'b' }], { maxTokens: 4, seq: 0, onTokens: () => undefined }), /does not stream/);
      await assert.rejects(ctx.attachSpeculator({ type: 'ngram-simple' }), /several sequences/);
      assert.ok(ctx.cachedPositions(1) > 0);
      ctx.clearCache(1);
      // The clear is applied before the next request on the sequence; the count follows once it ran.
      const r = await ctx.generate([{ text: 'a', addSpecial: true }], { maxTokens: 1, seq: 1 });
      assert.equal(r.reusedTokens, 0);
      await assert.rejects(model.createContext({ nCtx: 256, maxActive: 1 }), /several sequences/);
      await assert.rejects(model.createContext({ nCtx: 256, nSeq: 2, maxActive: 3 }), /maxActive/);
      await assert.rejects(model.createContext({ nCtx: 256, nSeq: 2, mixSteps: true }), /mixSteps/);
      await assert.rejects(single.generate([{ text: 'a' }], { maxTokens: 1, seq: 1 }), /options\.seq/);
    } finally {
      await ctx.dispose();
    }
  });

  test('a unified cache gives each sequence its share: a request past it is refused, every camera fits at once', async () => {
    // 4 × 64 cells in one buffer: llama.cpp lets any one sequence take all 256, which would leave the
    // other cameras without a slot mid-step; each gets nCtx positions, as with a stream per sequence.
    const ctx = await model.createContext({ nCtx: 64, nSeq: 4, kvUnified: true, threads: 1 });
    try {
      assert.equal(ctx.info.nCtxSeq, 64);
      const words = (n: number): string => Array.from({ length: n }, (_, i) => `w${i}`).join(' ');
      const long = model.tokenize(words(40), { addSpecial: true }).length;
      assert.ok(long > 64 && long + 8 < 256, `a prompt (${long} tokens) past the share but within the whole cache`);
      await assert.rejects(ctx.generate([{ text: words(40), addSpecial: true }], { maxTokens: 8, seq: 0 }), {
        code: 'ERANGE',
        message: new RegExp(`context overflow: prompt \\(${long} positions\\) \\+ maxTokens \\(8\\) exceeds nCtx 64`),
      });
      // Four prompts that fill their shares all decode together.
      const fit = words(20);
      const n = model.tokenize(fit, { addSpecial: true }).length;
      const results = await Promise.all(
        [0, 1, 2, 3].map((seq) => ctx.generate([{ text: fit, addSpecial: true }], { maxTokens: 64 - n, ignoreEos: true, seq })),
      );
      for (const r of results) assert.equal(r.tokens.length, 64 - n);
    } finally {
      await ctx.dispose();
    }
  });
});
