// Speculation under the action grammar: every drafting method, with and without jump-forward, gives
// token for token the plain greedy output. A draft model drafts among the admitted tokens (a copy
// of the target then never misses), other drafts are cut where the grammar refuses them, and
// forced runs and drafts share a verify batch.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LlamaModel, type GenerateResult, type LlamaGrammar, type SpeculatorOptions } from '../../native/llama.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

const PROMPTS = ['Action:', 'The cup is near. Action JSON:', 'Stop?', 'A person walks by on the left.'];

describe('speculation under the action grammar on gemma4-tiny', () => {
  let target: LlamaModel;
  let grammar: LlamaGrammar;
  // Plain greedy (no speculator, no jump-forward) per prompt.
  const reference = new Map<string, readonly number[]>();
  const drafts: LlamaModel[] = [];

  before(async () => {
    target = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    const schema = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
    grammar = await target.grammarFromJsonSchema(schema);
    const ctx = await target.createContext({ nCtx: 512 });
    for (const p of PROMPTS)
      reference.set(p, (await ctx.generate([{ text: p, addSpecial: true }], { maxTokens: grammar.worstCaseTokens!, grammar })).tokens);
    await ctx.dispose();
  });
  after(async () => {
    await Promise.all(drafts.map((d) => d.dispose()));
    await target.dispose();
  });

  const cases: { name: string; draft?: string; options: (d?: LlamaModel) => SpeculatorOptions; check: (runs: GenerateResult[]) => void }[] =
    [
      {
        name: 'draft model = a copy of the target: drafts among the admitted tokens, every one accepted',
        draft: 'gemma4-tiny',
        options: (d) => ({ type: 'draft-simple', draftModel: d!, nMax: 4 }),
        check: (runs) => {
          const drafted = runs.reduce((n, r) => n + r.drafted, 0);
          assert.ok(drafted > 0);
          assert.equal(
            runs.reduce((n, r) => n + r.accepted, 0),
            drafted,
          );
          assert.equal(
            runs.reduce((n, r) => n + r.draftsCut, 0),
            0,
          );
        },
      },
      {
        name: 'draft model (a different, smaller gemma4)',
        draft: 'gemma4-tiny-draft',
        options: (d) => ({ type: 'draft-simple', draftModel: d!, nMax: 4 }),
        check: (runs) => assert.ok(runs.some((r) => r.drafted > 0)),
      },
      {
        name: 'Gemma 4 MTP assistant (draft-mtp): drafts the grammar refuses are cut before verification',
        draft: 'gemma4-tiny-assistant',
        options: (d) => ({ type: 'draft-mtp', draftModel: d!, nMax: 3 }),
        check: (runs) => assert.ok(runs.some((r) => r.drafted + r.draftsCut > 0)),
      },
      {
        name: 'n-gram lookup (ngram-simple)',
        options: () => ({ type: 'ngram-simple', nMax: 4, ngramN: 2 }),
        check: (runs) => assert.ok(runs.every((r) => r.accepted <= r.drafted)),
      },
    ];

  for (const c of cases) {
    test(c.name, async () => {
      const draft = c.draft ? await LlamaModel.load(await ensureSynthModel(c.draft)) : undefined;
      if (draft) drafts.push(draft);
      const ctx = await target.createContext({ nCtx: 512 });
      try {
        await ctx.attachSpeculator(c.options(draft));
        const runs: GenerateResult[] = [];
        for (const p of PROMPTS) {
          for (const jumpForward of [false, true]) {
            const r = await ctx.generate([{ text: p, addSpecial: true }], { maxTokens: grammar.worstCaseTokens!, grammar, jumpForward });
            assert.deepEqual(r.tokens, reference.get(p), `${p} (jumpForward ${jumpForward}): ${r.text}`);
            assert.equal(r.stopReason, 'eos');
            if (jumpForward) assert.ok(r.forced > 0);
            runs.push(r);
          }
        }
        c.check(runs);
      } finally {
        await ctx.dispose();
      }
    });
  }
});
