// The addon reaches into llama.cpp's internals from native/src/internal/ only, behind one header
// (native/src/llama-internal.h): every other source includes its own headers or llama.cpp's public
// ones (include/, ggml/include/, common/, mtmd.h and mtmd-helper.h), so a llama.cpp upgrade that
// changes an internal header touches internal/ alone.
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, sep } from 'node:path';
import { test } from 'node:test';
import { REPO_ROOT } from '../support/fixtures.ts';

const SRC = join(REPO_ROOT, 'native', 'src');
const INTERNAL = join(SRC, 'internal');
const LLAMA = join(REPO_ROOT, 'build', 'llama.cpp');

/** Quoted includes of a C++ source. */
const includesOf = (text: string): string[] => [...text.matchAll(/^\s*#\s*include\s+"([^"]+)"/gm)].map((m) => m[1]!);

/** C++ sources (.h, .cc, .cu) under `dir`, at any depth. */
const sourcesUnder = (dir: string): string[] =>
  readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((f) => /\.(h|cc|cu)$/.test(f))
    .map((f) => join(dir, f))
    .sort();

const isInternal = (path: string): boolean => path === INTERNAL || path.startsWith(INTERNAL + sep);

test('only native/src/internal/ includes llama.cpp internal headers', () => {
  assert.ok(existsSync(LLAMA), `llama.cpp sources not extracted at ${LLAMA}: run node tools/build-native.mjs`);
  const publicDirs = [join(LLAMA, 'include'), join(LLAMA, 'ggml', 'include'), join(LLAMA, 'common')];
  const publicMtmd = new Set(['mtmd.h', 'mtmd-helper.h']);
  const offenders: string[] = [];
  let checked = 0;
  for (const file of sourcesUnder(SRC).filter((f) => !isInternal(f))) {
    for (const inc of includesOf(readFileSync(file, 'utf8'))) {
      checked++;
      // percept's own headers, except those of internal/: llama-internal.h is the one door.
      const own = join(dirname(file), inc);
      if (own.startsWith(SRC + sep) && !isInternal(own) && existsSync(own)) continue;
      if (inc === 'napi.h' || publicMtmd.has(inc) || publicDirs.some((d) => existsSync(join(d, inc)))) continue;
      offenders.push(`${relative(SRC, file)}: #include "${inc}"`);
    }
  }
  assert.ok(checked > 20, `only ${checked} includes found: is ${SRC} the addon source?`);
  assert.deepEqual(offenders, [], 'internal llama.cpp headers outside native/src/internal/');
});

test('the check sees internal headers: the files of internal/ include some, behind llama-internal.h', () => {
  const files = sourcesUnder(INTERNAL);
  assert.ok(files.length > 0, `no sources in ${INTERNAL}`);
  const incs = new Set(files.flatMap((f) => includesOf(readFileSync(f, 'utf8'))));
  for (const internal of ['llama-grammar.h', 'llama-context.h', 'clip.h', 'ggml-backend-impl.h']) {
    assert.ok(incs.has(internal), `native/src/internal/ should include ${internal}`);
    assert.ok(
      ['src', join('tools', 'mtmd'), join('ggml', 'src')].some((d) => existsSync(join(LLAMA, d, internal))),
      `${internal} not found in llama.cpp`,
    );
  }
  for (const f of files.filter((f) => f.endsWith('.cc'))) {
    assert.ok(includesOf(readFileSync(f, 'utf8')).includes('../llama-internal.h'), `${relative(SRC, f)} should implement llama-internal.h`);
  }
});
