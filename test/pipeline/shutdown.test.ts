// A real SIGINT, SIGTERM or SIGHUP to a process running the graph: it must print the summary and exit 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';

const child = fileURLToPath(new URL('./sigint-child.ts', import.meta.url));

for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  test(`${signal} stops the graph cleanly: summary printed, stages closed, exit code 0`, async () => {
    const proc = spawn(process.execPath, ['--import', 'tsx', child], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    proc.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = once(proc, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    await new Promise<void>((resolve, reject) => {
      proc.stdout.on('data', (chunk: Buffer) => {
        stdout += chunk.toString();
        if (stdout.includes('ready\n')) resolve();
      });
      proc.once('exit', (code) => reject(new Error(`child exited (${code}) before it was ready: ${stderr}`)));
    });
    proc.kill(signal);
    const [code, killedBy] = await exited;
    assert.equal(killedBy, null, stderr);
    assert.equal(code, 0, stderr);
    assert.match(stdout, new RegExp(`percept run stopped \\(${signal}\\)`));
    const line = stdout.split('\n').find((l) => l.startsWith('SUMMARY '));
    assert.ok(line, stdout);
    const summary = JSON.parse(line.slice('SUMMARY '.length));
    assert.equal(summary.endReason, 'stopped');
    assert.equal(summary.stopReason, signal);
    assert.equal(summary.closed, true);
    assert.ok(summary.frames.out >= 1);
    assert.equal(summary.frames.in, summary.frames.out + summary.frames.dropped);
    assert.equal(summary.frames.inFlight, 0);
  });
}
