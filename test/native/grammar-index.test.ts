// The token index per grammar state: at every step of sample actions and of seeded random walks,
// the tokens it admits are exactly those llama.cpp's own grammar check admits over the whole
// vocabulary, and exactly XGrammar's mask for the same grammar. Forced runs are the tokenizer's own
// tokens; grammars without a finite automaton fall back, saying why.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LlamaModel, type LlamaGrammar } from '../../native/llama.ts';
import { jsonSchemaToGbnf } from '../../native/schema-grammar.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';
import { xgGrammar, XgTokenMatcher } from '../support/xgrammar-oracle.ts';

const ACTION_SCHEMA = JSON.parse(readFileSync(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
// Keys in schema order: the target first.
const SAMPLES = [
  '{"target":{"label":"cup","bbox":[0.1,0.2,0.3,0.4]},"action":"move","confidence":0.5,"speed":1.25,"heading_deg":-90,"hazards":["edge","wet_floor"]}',
  '{"action":"stop","confidence":1}',
  '{"target":{"label":"obstacle"},"action":"grasp","confidence":0.9876,"hazards":[]}',
];
// Random walks: each step picks a random admitted token (EOG ends the walk).
const WALKS = Number(process.env.PERCEPT_INDEX_WALKS ?? 6);

function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const setDiff = (a: Iterable<number>, b: Iterable<number>): number[] => {
  const bs = new Set(b);
  return [...a].filter((x) => !bs.has(x));
};

describe('grammar token index (gemma4-tiny vocabulary, 262,144 tokens)', () => {
  let model: LlamaModel;
  let grammar: LlamaGrammar;
  let eog: number[];
  // Token sequences to check at every prefix: the sample actions, then seeded random walks.
  const paths: number[][] = [];

  before(async () => {
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { vocabOnly: true });
    grammar = await model.grammarFromJsonSchema(ACTION_SCHEMA);
    for (const text of SAMPLES) paths.push(Array.from(model.tokenize(text, { parseSpecial: false })));
    // Where only the end is admissible, the admitted set is the end-of-generation tokens.
    eog = Array.from(await grammar.allowedTokens(paths[1]!));
    for (let w = 0; w < WALKS; w++) {
      const next = rng(1000 + w);
      const path: number[] = [];
      for (;;) {
        const allowed = Array.from(await grammar.allowedTokens(path)).filter((t) => !eog.includes(t));
        if (allowed.length === 0) break;
        path.push(allowed[Math.floor(next() * allowed.length)]!);
      }
      paths.push(path);
    }
  });
  after(async () => {
    await model.dispose();
  });

  test('the action grammar has an index: a few hundred states, a bounded worst case', () => {
    assert.equal(grammar.fallback, null);
    const ix = grammar.index!;
    assert.ok(ix.states > 10 && ix.states < 5000, `states ${ix.states}`);
    assert.ok(ix.entries > ix.tokenStates, `entries ${ix.entries}`);
    assert.ok(ix.forcedStates > 0);
    assert.equal(ix.prunedEntries, 0);
    assert.ok(
      grammar.worstCaseTokens !== null && grammar.worstCaseTokens > 30 && grammar.worstCaseTokens < 400,
      `worstCaseTokens ${grammar.worstCaseTokens}`,
    );
    assert.ok(eog.length >= 1 && eog.every((t) => model.tokenText(t).length > 0));
  });

  test('every walk is a complete action, and no longer than worstCaseTokens', () => {
    for (const path of paths.slice(SAMPLES.length)) {
      const text = model.detokenize(path);
      assert.doesNotThrow(() => JSON.parse(text), text);
      assert.ok(path.length <= grammar.worstCaseTokens!, `${path.length} tokens > worstCaseTokens ${grammar.worstCaseTokens}: ${text}`);
    }
  });

  test('maxChoices bounds the tokens a decoder with jump-forward picks: exact on small grammars, never passed by walks', async () => {
    // A digit, then a digit or the end: two picks (the second digit, or the end-of-generation token).
    const twoDigits = await model.grammar('root ::= [0-9] [0-9]?');
    assert.equal(twoDigits.worstCaseTokens, 2);
    assert.equal(twoDigits.maxChoices, 2);
    // Forced text around one digit: only the digit is picked, the end comes with the grammar complete.
    const wrapped = await model.grammar('root ::= "{\\"a\\":" [0-9] "}"');
    assert.equal(wrapped.maxChoices, 1);
    assert.ok(wrapped.worstCaseTokens! > wrapped.maxChoices!);
    assert.equal((await model.grammar('root ::= [0-9] ("," [0-9])*')).maxChoices, null, 'unbounded');
    const max = grammar.maxChoices!;
    assert.ok(max > 1 && max < grammar.worstCaseTokens!, `maxChoices ${max} of worstCaseTokens ${grammar.worstCaseTokens}`);
    // Walks as the decoder takes them: forced runs whole, a random admitted token (or the end,
    // where admitted) at every choice.
    let most = 0;
    for (let w = 0; w < 60; w++) {
      const next = rng(5000 + w);
      const path: number[] = [];
      let picks = 0;
      for (;;) {
        const forced = Array.from(grammar.forcedTokens(path));
        if (forced.length > 0) {
          path.push(...forced);
          continue;
        }
        const admitted = Array.from(await grammar.allowedTokens(path));
        const choices = admitted.filter((t) => !eog.includes(t));
        if (choices.length === 0) break; // complete: generation stops without a pick
        picks++;
        const i = Math.floor(next() * (choices.length + (choices.length < admitted.length ? 1 : 0)));
        if (i >= choices.length) break; // picked the end
        path.push(choices[i]!);
      }
      assert.ok(picks <= max, `walk ${w}: ${picks} picks > maxChoices ${max}: ${model.detokenize(path)}`);
      most = Math.max(most, picks);
    }
    assert.ok(most > max / 4, `the walks picked ${most} at most`);
  });

  test("admitted sets equal llama.cpp's grammar check over the whole vocabulary at every step", async () => {
    let steps = 0;
    for (const path of paths) {
      for (let i = 0; i <= path.length; i++) {
        const prefix = path.slice(0, i);
        const [byIndex, byLlama] = await Promise.all([grammar.allowedTokens(prefix, 'index'), grammar.allowedTokens(prefix, 'llama')]);
        assert.deepEqual(
          { extra: setDiff(byIndex, byLlama), missing: setDiff(byLlama, byIndex) },
          { extra: [], missing: [] },
          `after ${JSON.stringify(model.detokenize(prefix))}`,
        );
        steps++;
      }
    }
    assert.ok(steps > 100, `${steps} steps`);
  });

  test("admitted sets equal XGrammar's mask for the same grammar at every step", async () => {
    const vocab = Array.from({ length: model.info.nVocab }, (_, t) => model.tokenText(t));
    const xg = await xgGrammar(grammar.gbnf);
    for (const path of paths) {
      const matcher = await XgTokenMatcher.create(xg, vocab, eog);
      try {
        for (let i = 0; i <= path.length; i++) {
          const byIndex = await grammar.allowedTokens(path.slice(0, i));
          const byXg = await matcher.allowed();
          assert.deepEqual(
            { extra: setDiff(byIndex, byXg), missing: setDiff(byXg, byIndex) },
            { extra: [], missing: [] },
            `after ${JSON.stringify(model.detokenize(path.slice(0, i)))}`,
          );
          if (i < path.length) assert.ok(matcher.accept(path[i]!));
        }
      } finally {
        matcher.dispose();
      }
    }
  });

  test("forced runs are the tokenizer's own tokens of the text the grammar decides", () => {
    const start = grammar.forcedTokens([]);
    assert.ok(start.length > 0);
    const text = model.detokenize(start);
    // The target is optional: the grammar decides only what both openings share.
    assert.ok('{"target":{"label":"'.startsWith(text) && '{"action":"'.startsWith(text), text);
    assert.deepEqual(Array.from(model.tokenize(text, { parseSpecial: false })), Array.from(start));
    // After the action's first letters the rest of its name is forced, up to where a choice follows.
    let forcedTotal = 0;
    for (const path of paths) {
      for (let i = 0; i < path.length; i++) {
        const f = grammar.forcedTokens(path.slice(0, i));
        if (f.length === 0) continue;
        forcedTotal += 1;
        const piece = model.detokenize(f);
        assert.deepEqual(Array.from(model.tokenize(piece, { parseSpecial: false })), Array.from(f), piece);
      }
    }
    assert.ok(forcedTotal > 10);
  });

  test('grammars without a small finite automaton fall back, saying why', async () => {
    const recursive = await model.grammarFromJsonSchema({
      $defs: { node: { type: 'object', properties: { child: { $ref: '#/$defs/node' } }, additionalProperties: false } },
      $ref: '#/$defs/node',
    });
    assert.equal(recursive.index, null);
    assert.match(recursive.fallback!, /recursive grammar/);
    assert.equal(recursive.worstCaseTokens, null);
    const tokens = await model.grammar('root ::= <[1000]> "a"');
    assert.match(tokens.fallback!, /token ids/);
    const small = await model.grammar(jsonSchemaToGbnf(ACTION_SCHEMA), 'root', { maxStates: 3 });
    assert.match(small.fallback!, /more than 3 automaton states/);
    await assert.rejects(small.allowedTokens([]), /no token index/);
    // The limits are part of the cache key: the full index is still there.
    assert.notEqual((await model.grammar(jsonSchemaToGbnf(ACTION_SCHEMA))).index, null);
  });

  test('bad input is refused', async () => {
    await assert.rejects(model.grammar('root ::= ('), /failed to parse GBNF/);
    await assert.rejects(grammar.allowedTokens([model.tokenize('}')[0]!]), /prefix\[0\].*not admitted/);
    await assert.rejects(grammar.allowedTokens([model.tokenize('}')[0]!], 'llama'), /prefix\[0\].*not admitted/);
    assert.throws(() => grammar.forcedTokens([-1]), /prefix\[0\]/);
  });
});
