// An action schema whose decoding grammar produces no valid action is refused at load, naming the
// JSON path; the shipped schema passes, and a grammar looser than its schema is logged.
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { checkGrammarAdmitsSchema } from '../../nodes/decoder.ts';
import { LlamaModel } from '../../native/llama.ts';
import { REPO_ROOT, ensureSynthModel } from '../support/fixtures.ts';

const dir = join(REPO_ROOT, '.cache', 'test-action-schema-grammar');

function schemaFile(name: string, properties: Record<string, unknown>): string {
  const path = join(dir, `${name}.schema.json`);
  const schema = { $id: `test/${name}`, type: 'object', additionalProperties: false, required: Object.keys(properties), properties };
  writeFileSync(path, JSON.stringify(schema));
  return path;
}

describe('an action schema against its decoding grammar', () => {
  let model: LlamaModel;
  before(async () => {
    mkdirSync(dir, { recursive: true });
    model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { vocabOnly: true });
  });
  after(async () => {
    await model.dispose();
  });

  const check = async (path: string, log: (msg: string) => void = () => undefined): Promise<void> => {
    const schema = loadActionSchema(path);
    const grammar = await model.grammarFromJsonSchema(schema.schema);
    await checkGrammarAdmitsSchema(model, grammar, schema, grammar.worstCaseTokens ?? 64, log);
  };

  test('the shipped robot-action schema: every walk is a valid action, nothing logged', async () => {
    const logged: string[] = [];
    await check(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), (m) => logged.push(m));
    assert.deepEqual(logged, []);
  });

  test('a pattern that its maxLength excludes is refused, naming the property', async () => {
    const path = schemaFile('pattern-length', { code: { type: 'string', pattern: '^[a-z]{5}$', maxLength: 3 } });
    await assert.rejects(check(path), /pattern-length\.schema\.json admits no action .*\/code: must NOT have more than 3 characters/);
  });

  test('contradictory allOf consts are refused, naming the property', async () => {
    const path = schemaFile('allof-consts', { mode: { allOf: [{ const: 'x' }, { const: 'y' }] } });
    await assert.rejects(check(path), /allof-consts\.schema\.json admits no action .*\/mode: must be equal to constant/);
  });
});
