// JSON-Schema grammars: seeded generations with the robot action schema all parse and validate
// under ajv; jump-forward gives the same greedy output with fewer decodes.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Ajv } from 'ajv';
import { jsonSchemaToGbnf, LlamaModel, type LlamaContext, type LlamaGrammar } from '../native/llama.ts';
import { ensureSynthModel, REPO_ROOT } from './fixtures.ts';

// 200 seeded generations (~0.7 s each on the 2-core box, ~2.5 min); PERCEPT_GRAMMAR_RUNS=N for a
// quicker local run.
const RUNS = Number(process.env.PERCEPT_GRAMMAR_RUNS ?? 200);

describe('action-schema grammar on gemma4-tiny', () => {
  let model: LlamaModel;
  let ctx: LlamaContext;
  let grammar: LlamaGrammar;
  let schema: object;

  before(async () => {
    schema = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    ctx = await model.createContext({ nCtx: 1024 });
    grammar = model.grammarFromJsonSchema(schema);
  });
  after(async () => {
    await model.dispose();
  });

  test('bounded numbers are enforced in the grammar (llama.cpp bounds only integers)', () => {
    const gbnf = jsonSchemaToGbnf(schema);
    assert.match(gbnf, /confidence ::= percept-num-\d/);
    assert.match(gbnf, /percept-num-\d ::= \[0-0\]/);
    assert.match(gbnf, /^space ::= \| " "$/m);
    assert.match(jsonSchemaToGbnf(schema, { compact: false }), /^space ::= \| " " \| "\\n"/m);
  });

  test(`${RUNS} seeded generations all parse and validate under ajv`, async () => {
    const validate = new Ajv({ strict: false }).compile(schema);
    const prompt = [{ text: 'Describe the scene as one robot action in JSON:', addSpecial: true }];
    const actions = new Set<string>();
    for (let seed = 0; seed < RUNS; seed++) {
      const r = await ctx.generate(prompt, { maxTokens: 160, grammar, temperature: 1, topK: 40, seed, jumpForward: true });
      assert.equal(r.stopReason, 'eos', `seed ${seed}: ${r.stopReason} after ${r.tokens.length} tokens: ${r.text}`);
      const value = JSON.parse(r.text) as { action: string };
      assert.ok(validate(value), `seed ${seed}: ${r.text} → ${JSON.stringify(validate.errors)}`);
      actions.add(value.action);
    }
    assert.ok(actions.size > 1, 'sampling with different seeds should vary the action');
  });

  test('jump-forward: identical greedy output, forced tokens counted, fewer decodes', async () => {
    for (const text of ['Action:', 'The cup is near. Action JSON:', 'Stop?']) {
      const prompt = [{ text, addSpecial: true }];
      const plain = await ctx.generate(prompt, { maxTokens: 160, grammar });
      const jf = await ctx.generate(prompt, { maxTokens: 160, grammar, jumpForward: true });
      assert.deepEqual(jf.tokens, plain.tokens);
      assert.equal(jf.text, plain.text);
      assert.equal(jf.stopReason, plain.stopReason);
      assert.equal(plain.forced, 0);
      assert.ok(jf.forced > 0, 'the grammar-determined end is forced');
      assert.equal(jf.timings.decodeCalls, plain.timings.decodeCalls - jf.forced);
    }
  });

  test('a grammar built for another model or a bad GBNF is refused', async () => {
    assert.throws(() => model.grammar('root ::= ('), /failed to parse GBNF/);
    const other = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    try {
      const g2 = other.grammarFromJsonSchema(schema);
      await assert.rejects(ctx.generate([{ text: 'x' }], { maxTokens: 2, grammar: g2 }), /another model/);
    } finally {
      await other.dispose();
    }
    const r = await ctx.generate([{ text: 'ok' }], { maxTokens: 160, grammar });
    assert.equal(r.stopReason, 'eos');
  });
});
