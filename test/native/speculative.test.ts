// Speculative decoding through llama.cpp's common/speculative: every drafting method must give
// exactly the plain greedy tokens (drafts are only verified, never trusted).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LlamaModel, type SpeculatorOptions } from '../../native/llama.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

const PROMPT = [{ text: 'The robot sees a red cup on the table and', addSpecial: true }] as const;
const N = 40;

describe('speculative decoding parity on gemma4-tiny', () => {
  let target: LlamaModel;
  let reference: readonly number[];
  const drafts: LlamaModel[] = [];

  before(async () => {
    target = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    const ctx = await target.createContext({ nCtx: 512 });
    reference = (await ctx.generate([...PROMPT], { maxTokens: N, ignoreEos: true })).tokens;
    await ctx.dispose();
  });
  after(async () => {
    await Promise.all(drafts.map((d) => d.dispose()));
    await target.dispose();
  });

  const cases: {
    name: string;
    draft?: string;
    options: (d?: LlamaModel) => SpeculatorOptions;
    check: (drafted: number, accepted: number) => void;
  }[] = [
    {
      name: 'draft model (a different, smaller gemma4)',
      draft: 'gemma4-tiny-draft',
      options: (d) => ({ type: 'draft-simple', draftModel: d!, nMax: 4 }),
      check: (drafted) => assert.ok(drafted > 0),
    },
    {
      name: 'draft model = a copy of the target (all drafts accepted)',
      draft: 'gemma4-tiny',
      options: (d) => ({ type: 'draft-simple', draftModel: d!, nMax: 4 }),
      check: (drafted, accepted) => {
        assert.ok(drafted > 0);
        assert.equal(accepted, drafted);
      },
    },
    {
      name: 'Gemma 4 MTP assistant (draft-mtp)',
      draft: 'gemma4-tiny-assistant',
      options: (d) => ({ type: 'draft-mtp', draftModel: d!, nMax: 3 }),
      check: (drafted, accepted) => assert.ok(drafted > 0 && accepted <= drafted),
    },
    {
      name: 'n-gram lookup (ngram-simple)',
      options: () => ({ type: 'ngram-simple', nMax: 4, ngramN: 2 }),
      check: (drafted, accepted) => assert.ok(accepted <= drafted),
    },
  ];

  for (const c of cases) {
    test(c.name, async () => {
      const draft = c.draft ? await LlamaModel.load(await ensureSynthModel(c.draft)) : undefined;
      if (draft) drafts.push(draft);
      const ctx = await target.createContext({ nCtx: 512 });
      try {
        const spec = await ctx.attachSpeculator(c.options(draft));
        assert.equal(ctx.speculator, spec);
        const r = await ctx.generate([...PROMPT], { maxTokens: N, ignoreEos: true });
        assert.deepEqual(r.tokens, reference);
        c.check(r.drafted, r.accepted);
        // Again, with the prompt prefix reused from the KV cache: still the same tokens.
        const again = await ctx.generate([...PROMPT], { maxTokens: N, ignoreEos: true });
        assert.ok(again.reusedTokens > 0);
        assert.deepEqual(again.tokens, reference);
        // Drafting switched off for one call (the ladder's draft knob).
        const off = await ctx.generate([...PROMPT], { maxTokens: N, ignoreEos: true, speculative: false });
        assert.equal(off.drafted, 0);
        assert.deepEqual(off.tokens, reference);
      } finally {
        await ctx.dispose();
      }
    });
  }

  test('speculation with the action grammar keeps greedy output', async () => {
    const schema = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
    const grammar = await target.grammarFromJsonSchema(schema);
    const plainCtx = await target.createContext({ nCtx: 512 });
    const plain = await plainCtx.generate([...PROMPT], { maxTokens: 60, grammar });
    await plainCtx.dispose();
    const copy = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    drafts.push(copy);
    const ctx = await target.createContext({ nCtx: 512 });
    try {
      await ctx.attachSpeculator({ type: 'draft-simple', draftModel: copy, nMax: 4 });
      const r = await ctx.generate([...PROMPT], { maxTokens: 60, grammar });
      assert.deepEqual(r.tokens, plain.tokens);
      assert.equal(r.text, plain.text);
      assert.ok(r.drafted > 0);
    } finally {
      await ctx.dispose();
    }
  });

  test('bad speculator setups are refused and the context keeps working', async () => {
    const ctx = await target.createContext({ nCtx: 256, maxOutputs: 4 });
    try {
      await assert.rejects(ctx.attachSpeculator({ type: 'ngram-simple', nMax: 8 }), /nMax/);
      await assert.rejects(ctx.attachSpeculator({ type: 'draft-mtp', draftModel: target, nMax: 2 }), /gemma4-assistant/);
      await assert.rejects(ctx.attachSpeculator({ type: 'nope' } as never), /options.type/);
      const spec = await ctx.attachSpeculator({ type: 'ngram-simple', nMax: 3 });
      await assert.rejects(ctx.attachSpeculator({ type: 'ngram-simple', nMax: 3 }), (e: Error & { code?: string }) => e.code === 'EBUSY');
      spec.dispose();
      const r = await ctx.generate([...PROMPT], { maxTokens: 4, ignoreEos: true });
      assert.deepEqual(r.tokens, reference.slice(0, 4));
    } finally {
      await ctx.dispose();
    }
  });
});
