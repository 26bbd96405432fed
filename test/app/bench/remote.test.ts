// `percept bench remote` as a user runs it on the tiny decoder: llama-server from the same build on loopback against
// the in-process binding, both arms under percept's grammar. No speed is asserted: the machine may be loaded.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, test } from 'node:test';
import type { BenchRemoteResult } from '../../../app/bench/remote.ts';
import { REPO_ROOT } from '../../support/fixtures.ts';

const run = promisify(execFile);

describe('bench remote', () => {
  test("both arms give valid actions under percept's grammar, and every drop says why", async () => {
    const args = ['-m', 'synth:gemma4-tiny', '-e', 'synth:gemma4-vision-tiny-mmproj', '--image-tokens', '70'];
    const { stdout } = await run(
      process.execPath,
      ['--import', 'tsx', 'app/cli.ts', 'bench', 'remote', ...args, '--rounds', '1', '--frames', '4', '--fps', '2', '--json'],
      { cwd: REPO_ROOT, timeout: 600_000, maxBuffer: 16 << 20 },
    );
    const r = JSON.parse(stdout) as BenchRemoteResult;
    for (const arm of ['local', 'remote'] as const) {
      const a = r[arm];
      assert.ok(a.frames > 0, `${arm}: no steady frame`);
      assert.equal(a.dropped.invalid, undefined, `${arm}: ${JSON.stringify(a.drop_causes)}`);
      const dropped = Object.values(a.dropped).reduce((x, y) => x + y, 0);
      const said = Object.values(a.drop_causes).reduce((x, y) => x + y, 0);
      assert.equal(said, dropped, `${arm}: every drop has its cause: ${JSON.stringify(a.drop_causes)}`);
    }
  });
});
