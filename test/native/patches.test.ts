// percept's own llama.cpp patches (native/patches/*.diff, applied by tools/build-native.mjs after
// node-llama-cpp's): each is applied to build/llama.cpp and recorded in its extraction stamp with a
// hash of its content, so a patch that changes re-extracts the tree instead of being applied twice.
// The addon's loader sets the defaults of the variables three of them read.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { CUDA_CUBLAS_F32_OUT, CUDA_F16_WEIGHTS, CUDA_MMQ_MAX_BATCH, cudaMatmuls } from '../../native/binding.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

const patchDir = join(REPO_ROOT, 'native', 'patches');
const llamaDir = join(REPO_ROOT, 'build', 'llama.cpp');
const patches = readdirSync(patchDir)
  .filter((f) => f.endsWith('.diff'))
  .sort();

/** `git apply --check` in build/llama.cpp (never in percept's own repository above it). */
function applies(patch: string, reverse: boolean): boolean {
  try {
    execFileSync('git', ['apply', '--check', ...(reverse ? ['--reverse'] : []), join(patchDir, patch)], {
      cwd: llamaDir,
      env: { ...process.env, GIT_CEILING_DIRECTORIES: dirname(llamaDir) },
      stdio: 'pipe',
    });
    return true;
  } catch {
    return false;
  }
}

test('every patch in native/patches is recorded in the stamp of build/llama.cpp with its content hash', () => {
  assert.ok(patches.length > 0, 'native/patches holds the patches');
  const stamp = JSON.parse(readFileSync(join(llamaDir, '.percept-extracted'), 'utf8')) as { percept?: string[] };
  const hash = (f: string) =>
    createHash('sha256')
      .update(readFileSync(join(patchDir, f)))
      .digest('hex')
      .slice(0, 16);
  assert.deepEqual(
    stamp.percept,
    patches.map((f) => `${f}:${hash(f)}`),
  );
});

test('every patch is applied to build/llama.cpp: it reverses cleanly and no longer applies forward', () => {
  for (const f of patches) {
    assert.equal(applies(f, true), true, `${f} reverses`);
    assert.equal(applies(f, false), false, `${f} is not applicable a second time`);
  }
});

/** What a child of a process that loaded the addon sees of `name`, under `env`. */
function inheritedAfterLoad(name: string, env: NodeJS.ProcessEnv): string {
  const script = `const { loadAddon } = await import(${JSON.stringify(join(REPO_ROOT, 'native', 'binding.ts'))});
    loadAddon();
    console.log(require('node:child_process').execFileSync(process.execPath, ['-p', 'process.env.${name}'], { encoding: 'utf8' }).trim());`;
  return execFileSync(
    process.execPath,
    [
      '--import',
      'tsx',
      '--input-type=module',
      '-e',
      `import { createRequire } from 'node:module'; const require = createRequire(import.meta.url); ${script}`,
    ],
    { cwd: REPO_ROOT, env, encoding: 'utf8' },
  ).trim();
}

// Each variable a patch reads: the default the loader sets (its constant in binding.ts) and that the environment wins.
const loaderDefaults = [
  ['PERCEPT_CUDA_MMQ_MAX_BATCH', 'the MMQ width of ggml-cuda-mmq-max-batch.diff', String(CUDA_MMQ_MAX_BATCH)],
  ['PERCEPT_CUDA_F16_WEIGHTS', 'the F16 weight copies of ggml-cuda-f16-weights.diff', CUDA_F16_WEIGHTS ? '1' : '0'],
  ['PERCEPT_CUDA_CUBLAS_F32_OUT', "cuBLAS's F32 output on Hopper of ggml-cuda-cublas-f32-out.diff", CUDA_CUBLAS_F32_OUT ? '1' : '0'],
] as const;

for (const [name, what, value] of loaderDefaults) {
  test(`loading the addon sets ${what}, unless the environment names it; children inherit it`, () => {
    const { [name]: _, ...clean } = process.env;
    assert.equal(inheritedAfterLoad(name, clean), value);
    assert.equal(inheritedAfterLoad(name, { ...clean, [name]: '0' }), '0', 'the environment wins');
  });
}

test('cudaMatmuls reads the three variables as the patches do: a count of columns or MMQ at every width; on unless unset, empty or 0', () => {
  assert.deepEqual(cudaMatmuls({}), { mmq_max_batch: null, f16_weights: false, cublas_f32_out: false });
  assert.deepEqual(cudaMatmuls({ PERCEPT_CUDA_MMQ_MAX_BATCH: '128', PERCEPT_CUDA_F16_WEIGHTS: '1', PERCEPT_CUDA_CUBLAS_F32_OUT: '1' }), {
    mmq_max_batch: 128,
    f16_weights: true,
    cublas_f32_out: true,
  });
  assert.deepEqual(cudaMatmuls({ PERCEPT_CUDA_MMQ_MAX_BATCH: '0', PERCEPT_CUDA_F16_WEIGHTS: '0', PERCEPT_CUDA_CUBLAS_F32_OUT: '0' }), {
    mmq_max_batch: 0,
    f16_weights: false,
    cublas_f32_out: false,
  });
  assert.deepEqual(cudaMatmuls({ PERCEPT_CUDA_MMQ_MAX_BATCH: '', PERCEPT_CUDA_F16_WEIGHTS: '', PERCEPT_CUDA_CUBLAS_F32_OUT: '' }), {
    mmq_max_batch: null,
    f16_weights: false,
    cublas_f32_out: false,
  });
  assert.deepEqual(cudaMatmuls({ PERCEPT_CUDA_MMQ_MAX_BATCH: '-4', PERCEPT_CUDA_F16_WEIGHTS: 'yes', PERCEPT_CUDA_CUBLAS_F32_OUT: 'yes' }), {
    mmq_max_batch: null,
    f16_weights: true,
    cublas_f32_out: true,
  });
});
