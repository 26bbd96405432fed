// Built graphs kept per step shape (ContextOptions.graphSlots, native/patches/llama-graph-slots.diff):
// greedy jump-forward generations, whose steps alternate between one token and a token with its forced
// run, give token for token what llama.cpp's last-graph-only reuse gives, and reuse a built graph at
// more of their steps; the slots are on by default (DEFAULT_GRAPH_SLOTS). An image decoded both ways
// (Gemma 4's rule) keeps them (native/patches/llama-causal-attn-no-reserve.diff).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { DEFAULT_GRAPH_SLOTS, LlamaModel, MAX_GRAPH_SLOTS, type GenerateResult, type PromptSegment } from '../../native/llama.ts';
import { ensureSynthModel, fakeImage, REPO_ROOT } from '../support/fixtures.ts';

const PROMPTS = [
  'Describe the scene as one robot action in JSON:',
  'The robot sees a red box on the left of the table and a person waving. Answer with one action in JSON:',
  'Camera 2, dock area: a pallet blocks the path. Next action as JSON:',
];
const SCHEMA = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;

interface Runs {
  readonly graphSlots: number;
  /** The context's compute buffer bytes after the runs (LlamaContext.memoryBreakdown). */
  readonly compute: number;
  readonly runs: readonly { readonly tokens: readonly number[]; readonly decodeCalls: number; readonly graphReuses: number }[];
}

async function runs(model: LlamaModel, graphSlots: number): Promise<Runs> {
  const ctx = await model.createContext({ nCtx: 1024, threads: 2, graphSlots });
  const grammar = await model.grammarFromJsonSchema(SCHEMA);
  const out = [];
  // Twice round the prompts, each from an empty cache and with a reused prefix in turn.
  for (let round = 0; round < 2; round++) {
    for (const text of PROMPTS) {
      if (round === 0) ctx.clearCache();
      const r = await ctx.generate([{ text, addSpecial: true }], { maxTokens: grammar.worstCaseTokens!, grammar, jumpForward: true });
      out.push({ tokens: [...r.tokens], decodeCalls: r.timings.decodeCalls, graphReuses: r.timings.graphReuses });
    }
  }
  const info = ctx.info;
  const compute = ctx.memoryBreakdown().compute;
  ctx.dispose();
  return { graphSlots: info.graphSlots, compute, runs: out };
}

const model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { gpuLayers: 99 });
const none = await runs(model, 0);
const kept = await runs(model, 4);
const total = (r: Runs, key: 'decodeCalls' | 'graphReuses') => r.runs.reduce((n, x) => n + x[key], 0);

after(() => model.dispose());

describe('graph slots', () => {
  test('the same tokens, run by run, as without kept graphs', () => {
    assert.equal(kept.graphSlots, 4);
    assert.equal(none.graphSlots, 0);
    assert.equal(kept.runs.length, none.runs.length);
    for (const [i, r] of kept.runs.entries()) {
      assert.deepEqual(r.tokens, none.runs[i]!.tokens, `run ${i}`);
      assert.equal(r.decodeCalls, none.runs[i]!.decodeCalls, `run ${i}`);
      assert.ok(r.tokens.length > r.decodeCalls, `run ${i}: forced runs rode along, so the steps changed shape`);
    }
  });

  test('a built graph is reused at more steps, most of them', () => {
    const calls = total(kept, 'decodeCalls');
    assert.ok(
      total(kept, 'graphReuses') > total(none, 'graphReuses'),
      JSON.stringify([total(kept, 'graphReuses'), total(none, 'graphReuses')]),
    );
    assert.ok(total(kept, 'graphReuses') >= calls / 2, `${total(kept, 'graphReuses')} reuses in ${calls} calls`);
  });

  test("the slots' schedulers' compute buffers are counted in the context's memory", () => {
    // Each slot that built a graph allocated it on a scheduler of its own.
    assert.ok(kept.compute > none.compute, `${kept.compute} bytes with slots, ${none.compute} without`);
  });

  test('an image decoded both ways keeps the built graphs: the same prompt again reuses more of its steps', async () => {
    // Gemma 4 attends to an image's rows both ways, so its decode switches causal attention off and on again.
    // Each switch re-reserved llama.cpp's scheduler, which dropped every built graph, so a second frame rebuilt them all.
    // `causal: true` decodes the image without the switch: the control.
    const grammar = await model.grammarFromJsonSchema(SCHEMA);
    const image = fakeImage(8, model.info.nEmbd, 11);
    const seen: Record<string, number[]> = {};
    for (const causal of [false, true]) {
      const ctx = await model.createContext({ nCtx: 1024, threads: 2, graphSlots: 4 });
      const prompt: PromptSegment[] = [
        { text: 'Camera 1, hallway:', addSpecial: true },
        { image, nTokens: 8, ...(causal ? { causal: true } : {}) },
        { text: 'Next action as JSON:' },
      ];
      const frames: GenerateResult[] = [];
      for (let frame = 0; frame < 2; frame++) {
        ctx.clearCache(); // the whole prompt again, image included
        frames.push(await ctx.generate(prompt, { maxTokens: grammar.worstCaseTokens!, grammar, jumpForward: true }));
      }
      ctx.dispose();
      const [first, second] = frames as [GenerateResult, GenerateResult];
      assert.deepEqual(second.tokens, first.tokens, `causal ${causal}: the same frame, the same action`);
      assert.equal(second.timings.decodeCalls, first.timings.decodeCalls);
      seen[String(causal)] = [first.timings.graphReuses, second.timings.graphReuses, first.timings.decodeCalls];
    }
    for (const [causal, [first, second, calls]] of Object.entries(seen))
      assert.ok(second! > first!, `causal ${causal}: ${second} reuses in the second frame, ${first} in the first, of ${calls} calls`);
  });

  test('the option is validated, and on by default', async () => {
    assert.ok(DEFAULT_GRAPH_SLOTS > 0 && DEFAULT_GRAPH_SLOTS <= MAX_GRAPH_SLOTS);
    const plain = await model.createContext({ nCtx: 256, threads: 1 });
    assert.equal(plain.info.graphSlots, DEFAULT_GRAPH_SLOTS);
    plain.dispose();
    for (const bad of [-1, MAX_GRAPH_SLOTS + 1, 1.5, 'x']) {
      await assert.rejects(model.createContext({ nCtx: 256, threads: 1, graphSlots: bad as never }), /options\.graphSlots/);
    }
  });
});
