#!/usr/bin/env node
// Builds native/ (the percept addon) at install time, offline:
//  1. extracts llama.cpp from node-llama-cpp's git bundle into build/llama.cpp (ignored, never committed),
//  2. applies node-llama-cpp's own patches, so our llama.cpp equals the one it ships, then percept's own
//     (native/patches/*.diff: each says in its comment what it changes and why),
//  3. configures and builds with cmake-js into build/native.
// Environment:
//   PERCEPT_SKIP_NATIVE=1         skip (JS-only work; native tests then fail loudly)
//   PERCEPT_CUDA=1                CUDA build; PERCEPT_CUDA_ARCHS (default "90"; Orin "87", Thor "110")
//   PERCEPT_CMAKE_ARGS="-DX=Y …"  extra CMake definitions (e.g. -DGGML_NATIVE=ON on a Jetson)
//   PERCEPT_BUILD_JOBS=N          parallel jobs (default: number of CPUs)
//   PERCEPT_PEERS="…"           llama.cpp programs to build with the addon (default: none). The tests' peers are
//                                built by `npm test` (TEST_PEERS), a bench's on its first use (native/peers.ts).
// `node tools/build-native.mjs --peers NAME…` builds only those programs, in the build the addon made.
// ccache, where it is on the PATH, caches every compile.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync, mkdirSync, rmSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(join(root, 'package.json'));
const log = (msg) => console.error(`[percept build] ${msg}`);
const run = (cmd, args, opts = {}) => execFileSync(cmd, args, { stdio: 'inherit', ...opts });

const jobs = process.env.PERCEPT_BUILD_JOBS ?? String(cpus().length);
const outDir = join(root, 'build', 'native');
const buildPeers = (names) => {
  log(`building peers: ${names.join(' ')}`);
  run('cmake', ['--build', outDir, '--config', 'Release', '--parallel', jobs, '--target', ...names]);
};
const peersAt = process.argv.indexOf('--peers');
if (peersAt >= 0) {
  const names = process.argv.slice(peersAt + 1);
  if (names.length === 0) throw new Error('--peers: name the programs to build (e.g. llama-bench)');
  if (!existsSync(join(outDir, 'CMakeCache.txt'))) throw new Error(`--peers: no native build in ${outDir}: run npm install first`);
  buildPeers(names);
  process.exit(0);
}

if (process.env.PERCEPT_SKIP_NATIVE === '1') {
  log('PERCEPT_SKIP_NATIVE=1: native addon not built');
  process.exit(0);
}

// node-llama-cpp's exports map hides package.json, so locate the package folder the way Node does.
const findPackage = (name) => {
  for (const dir of require.resolve.paths(name) ?? []) if (existsSync(join(dir, name, 'package.json'))) return join(dir, name);
  throw new Error(`npm package ${name} not found: run npm install`);
};
const nlcDir = findPackage('node-llama-cpp');
const bundle = join(nlcDir, 'llama', 'gitRelease.bundle');
const patchDir = join(nlcDir, 'llama', 'patches');
if (!existsSync(bundle)) throw new Error(`llama.cpp bundle not found at ${bundle} (is node-llama-cpp@3.22.1 installed?)`);

const llamaDir = join(root, 'build', 'llama.cpp');
/** The patches in `dir`, in the order they are applied. */
const diffsIn = (dir) =>
  readdirSync(dir)
    .filter((f) => f.endsWith('.diff'))
    .sort();
const patches = existsSync(patchDir) ? diffsIn(patchDir) : [];
const ownPatchDir = join(root, 'native', 'patches');
const ownPatches = diffsIn(ownPatchDir);
// A patch of ours that changes (its content hash in the stamp) re-extracts the tree, so no edit is applied twice.
const stamp = JSON.stringify({
  bundle: readFileSync(join(nlcDir, 'package.json'), 'utf8').match(/"version":\s*"([^"]+)"/)?.[1],
  patches,
  percept: ownPatches.map(
    (f) =>
      `${f}:${createHash('sha256')
        .update(readFileSync(join(ownPatchDir, f)))
        .digest('hex')
        .slice(0, 16)}`,
  ),
});
const stampFile = join(llamaDir, '.percept-extracted');

if (!existsSync(stampFile) || readFileSync(stampFile, 'utf8') !== stamp) {
  log(`extracting llama.cpp from ${bundle}`);
  rmSync(llamaDir, { recursive: true, force: true });
  mkdirSync(dirname(llamaDir), { recursive: true });
  run('git', ['-c', 'advice.detachedHead=false', 'clone', '--quiet', bundle, llamaDir]);
  // git looks for a repository upwards from llamaDir; one without its own .git would otherwise find ours and
  // silently skip every path of a patch as outside it.
  const apply = (patch) =>
    run('git', ['apply', patch], { cwd: llamaDir, env: { ...process.env, GIT_CEILING_DIRECTORIES: dirname(llamaDir) } });
  for (const p of patches) {
    log(`applying ${p}`);
    apply(join(patchDir, p));
  }
  for (const p of ownPatches) {
    log(`applying percept's ${p}`);
    apply(join(ownPatchDir, p));
  }
  writeFileSync(stampFile, stamp);
}

const defs = [`--CDLLAMA_SRC=${llamaDir}`];
if (process.env.PERCEPT_CUDA === '1') {
  defs.push('--CDGGML_CUDA=ON', `--CDCMAKE_CUDA_ARCHITECTURES=${process.env.PERCEPT_CUDA_ARCHS ?? '90'}`);
}
for (const arg of (process.env.PERCEPT_CMAKE_ARGS ?? '').split(/\s+/).filter(Boolean)) {
  if (!arg.startsWith('-D')) throw new Error(`PERCEPT_CMAKE_ARGS: expected -DNAME=VALUE, got '${arg}'`);
  defs.push(`--CD${arg.slice(2)}`);
}
const hasCcache = (() => {
  try {
    execFileSync('ccache', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
if (hasCcache) for (const lang of ['C', 'CXX', 'CUDA']) defs.push(`--CDCMAKE_${lang}_COMPILER_LAUNCHER=ccache`);
const cmakeJs = join(findPackage('cmake-js'), 'bin', 'cmake-js');
log(`building native addon (jobs=${jobs}) into ${outDir}`);
const t0 = Date.now();
run(
  process.execPath,
  [cmakeJs, 'compile', '--directory', join(root, 'native'), '--out', outDir, '--config', 'Release', '--parallel', jobs, ...defs],
  { cwd: root },
);

const peers = (process.env.PERCEPT_PEERS ?? '').split(/\s+/).filter(Boolean);
if (peers.length) buildPeers(peers);
log(`done in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
