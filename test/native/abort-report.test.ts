// When llama.cpp gives up it logs why, then aborts (ggml_cuda_error: the CUDA error string, the
// call, then "CUDA error"). percept-abort-report wires native/src/abort-report.h as the addon does
// and lets ggml log real errors (CPU buffers too large to allocate) before ggml aborts: stderr must
// carry the aborting thread's error lines before the abort message, and no other thread's.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import { findPeer } from '../support/fixtures.ts';

/** Sizes no allocator grants (about 1 EiB), each one distinct in ggml's error line. */
const TOO_BIG = 1n << 60n;
const size = (i: number): string => String(TOO_BIG + BigInt(i));

async function abortWith(mainSize: string, sizes: string[]): Promise<{ signal: NodeJS.Signals | null; stderr: string }> {
  const bin = findPeer('percept-abort-report');
  assert.ok(bin, 'percept-abort-report not built: node tools/build-native.mjs');
  const child = spawn(bin, [mainSize, ...sizes], { env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const signal = await new Promise<NodeJS.Signals | null>((done) => child.on('close', (_code, sig) => done(sig)));
  return { signal, stderr };
}

test("an abort prints the aborting thread's error lines, then ggml's message", async () => {
  const { signal, stderr } = await abortWith(size(0), [size(1), size(2)]);
  assert.equal(signal, 'SIGABRT');
  const first = stderr.indexOf(`failed to allocate buffer of size ${size(1)}`);
  const second = stderr.indexOf(`failed to allocate buffer of size ${size(2)}`);
  const message = stderr.indexOf('abort after 2 errors');
  assert.ok(first >= 0 && second > first, `the error lines are missing or out of order:\n${stderr}`);
  assert.ok(message > second, `the abort message does not follow them:\n${stderr}`);
  assert.ok(!stderr.includes(size(0)), `another thread's error was reported:\n${stderr}`);
});

test('only the last errors are kept, from a line start', async () => {
  const sizes = Array.from({ length: 200 }, (_, i) => size(i + 1));
  const { signal, stderr } = await abortWith(size(0), sizes);
  assert.equal(signal, 'SIGABRT');
  assert.ok(stderr.includes(`size ${size(200)}\n`), 'the last error is missing');
  assert.ok(!stderr.includes(`size ${size(1)}\n`), 'the oldest error was kept');
  const messageLine = stderr.lastIndexOf('\n', stderr.indexOf('abort after 200 errors')) + 1;
  const report = stderr.slice(stderr.indexOf('\n') + 1, messageLine);
  assert.ok(report.length <= 4096, `kept ${report.length} bytes`);
  assert.match(report.split('\n')[0]!, /^ggml_/, 'the kept lines start mid-line');
});
