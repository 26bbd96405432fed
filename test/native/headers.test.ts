// The addon reaches into llama.cpp's internals from native/src/llama-internal.cc only: every other
// source includes its own headers or llama.cpp's public ones (include/, ggml/include/, common/,
// mtmd.h and mtmd-helper.h), so a llama.cpp upgrade that changes an internal header touches one file.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { REPO_ROOT } from '../support/fixtures.ts';

const SRC = join(REPO_ROOT, 'native', 'src');
const LLAMA = join(REPO_ROOT, 'build', 'llama.cpp');

/** Quoted includes of a C++ source. */
const includesOf = (text: string): string[] => [...text.matchAll(/^\s*#\s*include\s+"([^"]+)"/gm)].map((m) => m[1]!);

test('only llama-internal.cc includes llama.cpp internal headers', () => {
  assert.ok(existsSync(LLAMA), `llama.cpp sources not extracted at ${LLAMA}: run node tools/build-native.mjs`);
  const publicDirs = [join(LLAMA, 'include'), join(LLAMA, 'ggml', 'include'), join(LLAMA, 'common')];
  const publicMtmd = new Set(['mtmd.h', 'mtmd-helper.h']);
  const own = new Set(readdirSync(SRC));
  const offenders: string[] = [];
  let checked = 0;
  for (const file of [...own].filter((f) => /\.(h|cc)$/.test(f) && f !== 'llama-internal.cc').sort()) {
    for (const inc of includesOf(readFileSync(join(SRC, file), 'utf8'))) {
      checked++;
      if (own.has(inc) || inc === 'napi.h' || publicMtmd.has(inc) || publicDirs.some((d) => existsSync(join(d, inc)))) continue;
      offenders.push(`${file}: #include "${inc}"`);
    }
  }
  assert.ok(checked > 20, `only ${checked} includes found: is ${SRC} the addon source?`);
  assert.deepEqual(offenders, [], 'internal llama.cpp headers outside llama-internal.cc');
});

test('the check sees internal headers: llama-internal.cc itself includes some', () => {
  const incs = includesOf(readFileSync(join(SRC, 'llama-internal.cc'), 'utf8'));
  for (const internal of ['llama-grammar.h', 'clip.h']) {
    assert.ok(incs.includes(internal), `llama-internal.cc should include ${internal}`);
    assert.ok(
      existsSync(join(LLAMA, 'src', internal)) || existsSync(join(LLAMA, 'tools', 'mtmd', internal)),
      `${internal} not found in llama.cpp`,
    );
  }
});
