// tools/demo-model/export.ts --rehash on a copy of the shipped (gzip-compressed) weights: the writers as they are
// reproduce the recorded hashes, so the copy comes back with the same content, compressed again.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DEMO_MODELS, demoWeightsSha256 } from '../../models/demo-model.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

test('export --rehash on the shipped weights records the hashes they already hold', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'percept-demo-export-'));
  try {
    const copy = join(dir, 'gemma4-robot.weights.gguf.gz');
    copyFileSync(DEMO_MODELS['gemma4-robot']!, copy);
    const run = spawnSync(process.execPath, ['--import', 'tsx', join(REPO_ROOT, 'tools/demo-model/export.ts'), '--rehash', '--out', copy], {
      cwd: REPO_ROOT,
      encoding: 'utf8',
      env: { ...process.env, TMPDIR: dir },
    });
    assert.equal(run.status, 0, run.stderr);
    assert.match(run.stdout, /^decoder: \d+ bytes, sha256 [0-9a-f]{64}/m);
    assert.ok(
      readFileSync(copy)
        .subarray(0, 2)
        .equals(Buffer.from([0x1f, 0x8b])),
      'the rehashed copy is not gzip-compressed',
    );
    // Decompressed content, not the .gz bytes: another zlib build may compress the same content differently.
    assert.equal(
      await demoWeightsSha256(copy),
      await demoWeightsSha256(DEMO_MODELS['gemma4-robot']!),
      'the rehashed copy differs from the shipped file',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('export --rehash on the shipped draft (a plain GGUF) reproduces it byte for byte', () => {
  const dir = mkdtempSync(join(tmpdir(), 'percept-demo-export-'));
  try {
    const copy = join(dir, 'gemma4-robot-assistant.weights.gguf');
    copyFileSync(DEMO_MODELS['gemma4-robot-assistant']!, copy);
    const run = spawnSync(
      process.execPath,
      ['--import', 'tsx', join(REPO_ROOT, 'tools/demo-model/export.ts'), '--name', 'gemma4-robot-assistant', '--rehash', '--out', copy],
      { cwd: REPO_ROOT, encoding: 'utf8', env: { ...process.env, TMPDIR: dir } },
    );
    assert.equal(run.status, 0, run.stderr);
    assert.match(run.stdout, /^decoder: \d+ bytes, sha256 [0-9a-f]{64}/m);
    assert.doesNotMatch(run.stdout, /^(vision|mmproj):/m);
    assert.ok(
      readFileSync(copy).equals(readFileSync(DEMO_MODELS['gemma4-robot-assistant']!)),
      'the rehashed copy differs from the shipped file',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
