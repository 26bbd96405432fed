// Schema-constrained generation on random weights: seeded generations with the robot action schema
// and its computed token budget all end complete and validate under ajv; jump-forward gives the
// same greedy tokens with fewer decodes; a grammar without an index still decodes (the
// full-vocabulary path).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Ajv } from 'ajv';
import { LlamaModel, type LlamaContext, type LlamaGrammar } from '../../native/llama.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

// 1000 seeded generations (one prompt in the KV cache, so each decodes only its action: ~2.5 min
// on the shared 2-core box); PERCEPT_GRAMMAR_RUNS=N for a quicker local run.
const RUNS = Number(process.env.PERCEPT_GRAMMAR_RUNS ?? 1000);
const PROMPT = [{ text: 'Describe the scene as one robot action in JSON:', addSpecial: true }];

describe('action-schema generation on gemma4-tiny', () => {
  let model: LlamaModel;
  let ctx: LlamaContext;
  let grammar: LlamaGrammar;
  let schema: object;

  before(async () => {
    schema = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    ctx = await model.createContext({ nCtx: 512, threads: 2 });
    grammar = await model.grammarFromJsonSchema(schema);
  });
  after(async () => {
    await model.dispose();
  });

  test(`${RUNS} seeded generations with maxTokens = the grammar's worst case: all complete, all valid`, async () => {
    const validate = new Ajv({ strict: false }).compile(schema);
    const maxTokens = grammar.worstCaseTokens!;
    assert.ok(maxTokens > 0);
    const actions = new Set<string>();
    let longest = 0;
    for (let seed = 0; seed < RUNS; seed++) {
      const r = await ctx.generate(PROMPT, { maxTokens, grammar, temperature: 1.5, seed, jumpForward: true });
      assert.equal(r.stopReason, 'eos', `seed ${seed}: ${r.stopReason} after ${r.tokens.length} tokens: ${r.text}`);
      const value = JSON.parse(r.text) as { action: string };
      assert.ok(validate(value), `seed ${seed}: ${r.text} → ${JSON.stringify(validate.errors)}`);
      assert.ok(r.reusedTokens > 0 || seed === 0, 'the prompt stays in the KV cache');
      // One decode per token the model picks after the first: never more than the grammar's bound.
      assert.ok(r.timings.decodeCalls <= grammar.maxChoices! - 1, `seed ${seed}: ${r.timings.decodeCalls} calls > maxChoices − 1`);
      actions.add(value.action);
      longest = Math.max(longest, r.tokens.length);
    }
    assert.ok(actions.size > 1, 'sampling with different seeds should vary the action');
    assert.ok(longest <= maxTokens);
  });

  test('jump-forward: identical greedy output, forced tokens counted, fewer decodes', async () => {
    for (const text of ['Action:', 'The cup is near. Action JSON:', 'Stop?']) {
      const prompt = [{ text, addSpecial: true }];
      const plain = await ctx.generate(prompt, { maxTokens: grammar.worstCaseTokens!, grammar });
      const jf = await ctx.generate(prompt, { maxTokens: grammar.worstCaseTokens!, grammar, jumpForward: true });
      assert.deepEqual(jf.tokens, plain.tokens);
      assert.equal(jf.text, plain.text);
      assert.equal(jf.stopReason, 'eos');
      assert.equal(plain.forced, 0);
      assert.ok(jf.forced >= 0.2 * jf.tokens.length, `forced ${jf.forced} of ${jf.tokens.length}`);
      assert.equal(jf.timings.decodeCalls, plain.timings.decodeCalls - jf.forced);
      // Where decode time goes: without jump-forward every step decodes one token; with it, the steps
      // that carry a forced run decode more (test/native/graph-slots.test.ts: their graphs are kept per shape).
      assert.equal(plain.timings.singleDecodeCalls, plain.timings.decodeCalls);
      assert.ok(jf.timings.singleDecodeCalls < jf.timings.decodeCalls, 'some steps carry a forced run');
      assert.ok(plain.timings.graphReuses >= plain.timings.decodeCalls - 1, `${plain.timings.graphReuses} reuses`);
    }
  });

  test('the opening forced run is decoded with the prompt: the first pick needs no decode of its own', async () => {
    const oneDigit = await model.grammar('root ::= "{\\"a\\":" [0-9] "}"');
    const prompt = [{ text: 'Value:', addSpecial: true }];
    const plain = await ctx.generate(prompt, { maxTokens: 16, grammar: oneDigit });
    const jf = await ctx.generate(prompt, { maxTokens: 16, grammar: oneDigit, jumpForward: true });
    assert.deepEqual(Array.from(jf.tokens), Array.from(plain.tokens));
    assert.match(jf.text, /^\{"a":[0-9]\}$/);
    // `{"a":` rode in the prefill, the digit came from its logits, `}` completed the grammar.
    assert.equal(jf.forced, jf.tokens.length - 1);
    assert.equal(jf.timings.decodeCalls, 0);
    assert.equal(plain.timings.decodeCalls, plain.tokens.length - 1, 'one per token after the first (the complete grammar ends it)');
    // max tokens inside the opening run: cut there, as without jump-forward.
    const cut = await ctx.generate(prompt, { maxTokens: 2, grammar, jumpForward: true });
    const cutPlain = await ctx.generate(prompt, { maxTokens: 2, grammar });
    assert.equal(cut.stopReason, 'max_tokens');
    assert.deepEqual(Array.from(cut.tokens), Array.from(cutPlain.tokens));
    // The KV cache holds what was decoded: the next generation reuses the prompt and goes on.
    const again = await ctx.generate(prompt, { maxTokens: 16, grammar: oneDigit, jumpForward: true });
    assert.deepEqual(Array.from(again.tokens), Array.from(jf.tokens));
    assert.ok(again.reusedTokens > 0);
  });

  test('padded steps (stepTokens): the same greedy tokens, one step shape, no padding left in the KV cache', async () => {
    assert.equal(ctx.info.stepTokens, 1, 'no padding unless asked');
    await assert.rejects(model.createContext({ nCtx: 512, stepTokens: 0 }), /options\.stepTokens/);
    // Against llama.cpp's own reuse of the last graph only (no graph slots), which padding is for.
    const padded = await model.createContext({ nCtx: 512, threads: 2, stepTokens: 4, graphSlots: 0 });
    const unpadded = await model.createContext({ nCtx: 512, threads: 2, graphSlots: 0 });
    try {
      assert.equal(padded.info.stepTokens, 4);
      for (const text of ['Action:', 'The cup is near. Action JSON:']) {
        const prompt = [{ text, addSpecial: true }];
        const opts = { maxTokens: grammar.worstCaseTokens!, grammar, jumpForward: true };
        const plain = await unpadded.generate(prompt, opts);
        const p = await padded.generate(prompt, opts);
        assert.deepEqual(p.tokens, plain.tokens, text);
        assert.equal(plain.timings.paddedSteps, 0);
        assert.ok(p.timings.paddedSteps > 0 && p.timings.paddedSteps <= p.timings.decodeCalls);
        // Every step decodes 4 tokens (a forced run longer than 3 goes on in the next step), so
        // llama.cpp reuses its graph after the first; unpadded, the steps with a run change shape.
        assert.ok(p.timings.graphReuses >= p.timings.decodeCalls - 1, `${p.timings.graphReuses} of ${p.timings.decodeCalls}`);
        assert.ok(plain.timings.graphReuses < plain.timings.decodeCalls - 1);
        assert.ok(p.timings.decodeCalls >= plain.timings.decodeCalls);
        // The padding was removed from the KV cache: text after the action decodes where it was,
        // and reads the same context as on the unpadded cache.
        const next = [{ text: `${text}${plain.text} Why?`, addSpecial: true }];
        const [a, b] = [await unpadded.generate(next, { maxTokens: 24 }), await padded.generate(next, { maxTokens: 24 })];
        assert.ok(b.reusedTokens >= p.promptTokens, 'the continuation reuses the prompt and the action');
        assert.deepEqual(b.tokens, a.tokens);
      }
    } finally {
      await padded.dispose();
      await unpadded.dispose();
    }
  });

  test('sampling looks only at the admitted tokens: the same seed gives the same action', async () => {
    const a = await ctx.generate(PROMPT, {
      maxTokens: grammar.worstCaseTokens!,
      grammar,
      temperature: 1,
      topK: 40,
      topP: 0.9,
      seed: 7,
      jumpForward: true,
    });
    const b = await ctx.generate(PROMPT, { maxTokens: grammar.worstCaseTokens!, grammar, temperature: 1, topK: 40, topP: 0.9, seed: 7 });
    assert.deepEqual(a.tokens, b.tokens);
  });

  test("a grammar without an index decodes through llama.cpp's check", async () => {
    const recursive = await model.grammarFromJsonSchema({
      $defs: {
        node: {
          type: 'object',
          properties: { n: { type: 'integer', minimum: 0, maximum: 9 }, child: { $ref: '#/$defs/node' } },
          additionalProperties: false,
        },
      },
      $ref: '#/$defs/node',
    });
    assert.equal(recursive.index, null);
    const r = await ctx.generate(PROMPT, { maxTokens: 40, grammar: recursive, jumpForward: true });
    assert.ok(r.text.startsWith('{"'), r.text);
    if (r.stopReason === 'eos') assert.doesNotThrow(() => JSON.parse(r.text), r.text);
    else assert.equal(r.stopReason, 'max_tokens');
  });

  test('a grammar built for another model is refused', async () => {
    const other = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    try {
      const g2 = await other.grammarFromJsonSchema(schema);
      await assert.rejects(ctx.generate([{ text: 'x' }], { maxTokens: 2, grammar: g2 }), /another model/);
    } finally {
      await other.dispose();
    }
    const r = await ctx.generate([{ text: 'ok' }], { maxTokens: grammar.worstCaseTokens!, grammar });
    assert.equal(r.stopReason, 'eos');
  });
});
