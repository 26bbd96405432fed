#!/usr/bin/env node
// npm test: every test/**/*.test.ts, listed explicitly (Node 20's test runner has no glob),
// run by node's own runner under tsx. Pass file names to run a subset. First it provisions the
// Debian packages the tests use (tools/system-packages.sh, the list .ci/run uses too) and builds the
// llama.cpp programs the tests compare against (TEST_PEERS; install builds the addon only).
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
const walk = (dir) =>
  readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? walk(p) : p.endsWith('.test.ts') ? [p] : [];
  });
const files =
  process.argv.length > 2
    ? process.argv.slice(2)
    : walk(join(root, 'test'))
        .sort()
        .map((p) => relative(root, p));
if (files.length === 0) {
  console.error('no test files found');
  process.exit(1);
}
const TEST_PEERS = ['llama-quantize', 'llama-speculative-simple', 'llama-server'];
const packages = spawnSync('bash', [join(root, 'tools', 'system-packages.sh')], { stdio: 'inherit' });
if (packages.status !== 0) process.exit(packages.status ?? 1);
if (process.env.PERCEPT_SKIP_NATIVE !== '1') {
  const peers = spawnSync(process.execPath, [join(root, 'tools', 'build-native.mjs'), '--peers', ...TEST_PEERS], { stdio: 'inherit' });
  if (peers.status !== 0) process.exit(peers.status ?? 1);
}
const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-reporter=spec', '--test-concurrency=1', ...files], {
  cwd: root,
  stdio: 'inherit',
});
process.exit(r.status ?? 1);
