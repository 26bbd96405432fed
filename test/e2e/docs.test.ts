// docs/cli.md and docs/config.md are generated (tools/gen-docs.ts, `npm run docs`) from the commander
// program in app/cli.ts and from configs/percept.schema.json. They must match what is committed:
// a new option or a changed schema field without `npm run docs` fails here, naming the page.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { promisify } from 'node:util';

const ROOT = join(import.meta.dirname, '../..');
const GENERATOR = join(ROOT, 'tools', 'gen-docs.ts');
const PAGES = ['cli.md', 'config.md'];
const out = mkdtempSync(join(tmpdir(), 'percept-docs-'));
after(() => rmSync(out, { recursive: true, force: true }));

/** Runs the generator into `dir`; a narrow terminal must not change its output. */
async function generate(dir: string): Promise<void> {
  await promisify(execFile)(process.execPath, ['--import', 'tsx', GENERATOR, '--out', dir], {
    cwd: ROOT,
    env: { ...process.env, COLUMNS: '60', FORCE_COLOR: '0' },
  });
}

test('docs/cli.md and docs/config.md are what `npm run docs` generates', async () => {
  await generate(out);
  for (const page of PAGES) {
    const fresh = readFileSync(join(out, page), 'utf8');
    const committed = readFileSync(join(ROOT, 'docs', page), 'utf8');
    assert.ok(fresh.length > 1000, `the generator wrote only ${fresh.length} characters to ${page}`);
    assert.ok(committed === fresh, `docs/${page} is out of date: run \`npm run docs\` and commit the result`);
  }
});

test('the generator is deterministic, and --check agrees with the committed pages', async () => {
  const again = join(out, 'again');
  await generate(again);
  for (const page of PAGES) assert.equal(readFileSync(join(again, page), 'utf8'), readFileSync(join(out, page), 'utf8'), page);
  const check = await promisify(execFile)(process.execPath, ['--import', 'tsx', GENERATOR, '--check'], { cwd: ROOT }).then(
    () => 0,
    (err: { code?: number; stderr?: string }) => {
      assert.match(err.stderr ?? '', /is out of date: run `npm run docs`/);
      return err.code;
    },
  );
  assert.equal(check, 0, 'tools/gen-docs.ts --check: run `npm run docs`');
});

test('the generated pages cover every command and every config section', () => {
  const cli = readFileSync(join(ROOT, 'docs', 'cli.md'), 'utf8');
  for (const heading of ['## percept run', '## percept bench frame', '## percept calc roofline', '## percept tune'])
    assert.ok(cli.includes(`${heading}\n`), `docs/cli.md lacks "${heading}"`);
  const config = readFileSync(join(ROOT, 'docs', 'config.md'), 'utf8');
  const schema = JSON.parse(readFileSync(join(ROOT, 'configs', 'percept.schema.json'), 'utf8')) as { properties: object };
  for (const key of Object.keys(schema.properties)) assert.ok(config.includes(`\n## ${key}\n`), `docs/config.md lacks "## ${key}"`);
});
