// A causal Gemma 4 image and the prompt text after it in one decode (ContextOptions.mixedPrefill,
// native/patches/llama-mixed-batch-gemma4.diff): the same tokens and logits as two decodes, one
// llama_decode fewer a prefill; images read both ways are decoded alone as before.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { LlamaModel, type GenerateResult, type PromptSegment } from '../../native/llama.ts';
import { ensureSynthModel, fakeImage, REPO_ROOT } from '../support/fixtures.ts';

const SCHEMA = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
const model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { gpuLayers: 99 });
const grammar = await model.grammarFromJsonSchema(SCHEMA);
after(() => model.dispose());

const prompt = (seed: number, causal: boolean, instruction: string): PromptSegment[] => [
  { text: 'Camera 1, hallway:', addSpecial: true },
  { image: fakeImage(8, model.info.nEmbd, seed), nTokens: 8, ...(causal ? { causal: true } : {}) },
  { text: instruction },
];
const INSTRUCTIONS = ['Next action as JSON:', 'Look at the camera image and choose the robot next action, as one JSON object:'];

/** Each frame from an empty cache, greedy, with the top logits of every sampled row. */
async function frames(mixedPrefill: boolean, causal: boolean, nBatch?: number): Promise<GenerateResult[]> {
  const ctx = await model.createContext({ nCtx: 1024, threads: 2, mixedPrefill, ...(nBatch ? { nBatch } : {}) });
  const out: GenerateResult[] = [];
  try {
    for (const [i, instruction] of INSTRUCTIONS.entries()) {
      ctx.clearCache();
      out.push(
        await ctx.generate(prompt(20 + i, causal, instruction), {
          maxTokens: grammar.worstCaseTokens!,
          grammar,
          jumpForward: true,
          topLogits: 4,
        }),
      );
    }
  } finally {
    ctx.dispose();
  }
  return out;
}

function assertSameOutput(mixed: readonly GenerateResult[], separate: readonly GenerateResult[], what: string): void {
  for (const [i, m] of mixed.entries()) {
    const s = separate[i]!;
    assert.deepEqual([...m.tokens], [...s.tokens], `${what}, frame ${i}: the same greedy tokens`);
    assert.equal(m.topLogits!.length, s.topLogits!.length);
    for (const [k, row] of m.topLogits!.entries()) {
      const ref = s.topLogits![k]!;
      assert.deepEqual([...row.ids], [...ref.ids], `${what}, frame ${i}, row ${k}: the same top ids`);
      for (const [j, v] of row.logits.entries()) {
        assert.ok(
          Math.abs(v - ref.logits[j]!) <= 1e-3 * Math.max(1, Math.abs(ref.logits[j]!)),
          `${what}, frame ${i}, row ${k}: ${v} vs ${ref.logits[j]}`,
        );
      }
    }
  }
}

describe('mixed prefill', () => {
  test('a causal image and its text in one decode: the same tokens and logits, one decode fewer a frame', async () => {
    const separate = await frames(false, true);
    const mixed = await frames(true, true);
    assertSameOutput(mixed, separate, 'causal image');
    for (const [i, m] of mixed.entries()) {
      assert.ok(m.tokens.length > 0, `frame ${i} generated`);
      assert.equal(m.timings.prefillDecodeCalls, separate[i]!.timings.prefillDecodeCalls - 1, `frame ${i}: decode calls`);
    }
  });

  test('text past the batch after the image: the image and the first text go together, the rest after', async () => {
    // nBatch 16 holds the 8 image rows and 8 text rows; the longer instruction's rest takes a decode of its own.
    const separate = await frames(false, true, 16);
    const mixed = await frames(true, true, 16);
    assertSameOutput(mixed, separate, 'nBatch 16');
    for (const [i, m] of mixed.entries())
      assert.equal(m.timings.prefillDecodeCalls, separate[i]!.timings.prefillDecodeCalls - 1, `frame ${i}`);
  });

  test('an image the model reads both ways is decoded alone, as before', async () => {
    assert.notEqual(model.info.imageAttention, 'causal', 'the tiny preset reads images both ways');
    const separate = await frames(false, false);
    const mixed = await frames(true, false);
    assertSameOutput(mixed, separate, 'bidirectional image');
    for (const [i, m] of mixed.entries()) assert.equal(m.timings.prefillDecodeCalls, separate[i]!.timings.prefillDecodeCalls, `frame ${i}`);
  });

  test('the option is validated, and on by default', async () => {
    const plain = await model.createContext({ nCtx: 256, threads: 1 });
    assert.equal(plain.info.mixedPrefill, true);
    plain.dispose();
    await assert.rejects(model.createContext({ nCtx: 256, threads: 1, mixedPrefill: 1 as never }), /options\.mixedPrefill/);
  });
});
