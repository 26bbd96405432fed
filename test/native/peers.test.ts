// llama.cpp's programs from the addon's own build (native/peers.ts): found where built, built where
// missing, and a clear error where no build can make them.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { PEER_BUILD_DIR, ensurePeerProgram, findPeerProgram } from '../../native/peers.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

describe('peer programs', () => {
  test('a program npm test built is found in the build the addon came from, and ensuring it builds nothing', async () => {
    const found = findPeerProgram('llama-server');
    assert.ok(found?.startsWith(PEER_BUILD_DIR), `llama-server in ${PEER_BUILD_DIR}: ${found}`);
    const logged: string[] = [];
    assert.equal(await ensurePeerProgram('llama-server', (m) => logged.push(m)), found);
    assert.deepEqual(logged, []);
  });

  test('a name that is no program is refused before anything runs', async () => {
    await assert.rejects(ensurePeerProgram('../bin/sh'), /'\.\.\/bin\/sh' is not a program name/);
    assert.equal(findPeerProgram('llama-no-such-program'), undefined);
  });

  test('where the addon comes from no CMake build, a missing program says so', async () => {
    const dir = join(REPO_ROOT, '.cache', 'test-peers', 'Release');
    mkdirSync(dir, { recursive: true });
    const script = "import('./native/peers.ts').then((m) => m.ensurePeerProgram('llama-bench')).catch((e) => console.log(e.message))";
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', '-e', script], {
      cwd: REPO_ROOT,
      env: { ...process.env, PERCEPT_NATIVE: join(dir, 'percept.node') },
    });
    assert.match(stdout, /llama-bench is not built and .*test-peers is no CMake build to build it in/);
  });
});
