// The README stays true about what it lists: every PERCEPT_* environment variable the code reads is
// in its table, and its Layout section names every top-level source folder.
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

const ROOT = join(import.meta.dirname, '../..');
const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
const section = (title: string): string => readme.split(/^## /m).find((s) => s.startsWith(`${title}\n`)) ?? '';

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : sources(path);
    return /\.(ts|mjs|cjs|js)$/.test(name) ? [path] : [];
  });
}

test('every PERCEPT_* variable the code reads is documented under "Environment variables"', () => {
  const read = new Set<string>();
  for (const folder of ['app', 'pipeline', 'nodes', 'native', 'models', 'tools', 'test']) {
    for (const file of sources(join(ROOT, folder))) {
      for (const m of readFileSync(file, 'utf8').matchAll(/process\.env\.(PERCEPT_[A-Z0-9_]+)/g)) read.add(m[1]!);
    }
  }
  assert.ok(read.size >= 5, `found only ${[...read].join(', ')}`);
  const documented = section('Environment variables');
  const missing = [...read].filter((name) => !documented.includes(`\`${name}`));
  assert.deepEqual(missing, [], 'add these to the README table');
});

test('the Layout section names every top-level source folder', () => {
  const layout = section('Layout');
  const folders = readdirSync(ROOT).filter(
    (name) => !name.startsWith('.') && !['node_modules', 'build', 'out'].includes(name) && statSync(join(ROOT, name)).isDirectory(),
  );
  const missing = folders.filter((name) => !layout.includes(`\`${name}/\``));
  assert.deepEqual(missing, []);
});
