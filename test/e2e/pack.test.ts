// The main package's `npm pack`: what git tracks of the runtime, the install script and the demo model, and
// nothing else (no tests, build outputs, caches or generated client files).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { REPO_ROOT } from '../support/fixtures.ts';

const RUNTIME = ['app/', 'nodes/', 'pipeline/', 'native/', 'models/', 'configs/'];

test('npm pack holds every tracked runtime file, the install script and the demo model, and only tracked files', () => {
  const pack = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: REPO_ROOT, encoding: 'utf8' });
  assert.equal(pack.status, 0, pack.stderr);
  const packed = new Set((JSON.parse(pack.stdout) as [{ files: { path: string }[] }])[0].files.map((f) => f.path));
  const tracked = spawnSync('git', ['ls-files'], { cwd: REPO_ROOT, encoding: 'utf8' }).stdout.split('\n').filter(Boolean);
  assert.ok(tracked.length > 0, 'git ls-files lists nothing: the test runs in a git checkout');

  const untracked = [...packed].filter((p) => !tracked.includes(p));
  assert.deepEqual(untracked, [], 'packed files git does not track');
  const missing = tracked.filter((p) => RUNTIME.some((dir) => p.startsWith(dir)) && !packed.has(p));
  assert.deepEqual(missing, [], 'runtime files left out of the package');
  for (const p of [
    'package.json',
    'README.md',
    'tools/percept.mjs',
    'tools/build-native.mjs',
    'models/demo/gemma4-robot.weights.gguf.gz',
    'bags/sample.mcap',
  ])
    assert.ok(packed.has(p), `${p} is not packed`);
  for (const p of packed)
    assert.ok(!/^(test|build|\.cache|\.carry|\.ci|node_modules)\//.test(p) && !p.startsWith('tools/demo-model/'), `${p} is packed`);
});
