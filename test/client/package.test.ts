// The clients install and run outside the repo (issue #39). tools/build-client.mjs builds client/ into
// the @percept/client npm package; `npm pack` packs it; a project in a temp folder outside the repo installs
// the tarball (its own dependencies only: no llama.cpp, no install script of ours) and, with plain node (no
// tsx), receives validated actions from a real publisher on loopback, and type-checks against the
// declarations. The Python package, copied out of the repo and pip-installed from there, validates what
// it receives against the schemas bundled inside it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { createPublisher, type Publisher } from '../../nodes/publisher.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import type { Clock } from '../../pipeline/clock.ts';
import { PYTHON } from '../../app/bench/python.ts';

const root = new URL('../..', import.meta.url).pathname;
const readJson = (path: string) => JSON.parse(readFileSync(path, 'utf8'));
const typed = { action: 'move', confidence: 0.9, target: { label: 'door', bbox: [0, 0, 1, 1] } };

/** The environment of a process outside the repo: nothing of this test's npm run (npm_config_local_prefix
 * would install into the repo) or tsx loader; the npm cache and registry stay. */
function outsideEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const keep = /^npm_config_(cache|registry|userconfig)$/i;
  const drop = /^(npm_|NODE_OPTIONS$|PYTHONPATH$)/i;
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => keep.test(k) || !drop.test(k)));
  return { ...env, PYTHONDONTWRITEBYTECODE: '1', ...extra };
}

const realClock: Clock = {
  virtual: false,
  nowNs: () => process.hrtime.bigint(),
  wallMs: () => Date.now(),
  unixNs: (ns) => BigInt(Date.now()) * 1_000_000n + ns - process.hrtime.bigint(),
};

/** Publishes one action for frame `frameId`, with a deadline a minute away (never stale on arrival). */
async function publish(pub: Publisher, frameId: number, action: unknown = typed): Promise<void> {
  const captureNs = realClock.nowNs();
  const ctx = standaloneContext({
    clock: realClock,
    frame: { frameId, sourceId: 'cam', captureNs, captureWallMs: realClock.wallMs(), degradeLevel: 0 },
    deadlineNs: captureNs + 60_000_000_000n,
  });
  await pub.stage.process(
    { schemaId: 'percept/robot-action/v1', frameId, sourceId: 'cam', captureWallMs: ctx.frame.captureWallMs, action },
    ctx,
  );
}

/** A child that prints one JSON line per message: its lines, and its exit. */
function linesOf(child: ChildProcessWithoutNullStreams) {
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, unknown>> => {
    const r = await lines.next();
    if (r.done) throw new Error(`the subscriber ended: ${stderr}`);
    return JSON.parse(r.value) as Record<string, unknown>;
  };
  return { next, exited, stderr: () => stderr };
}

/** Slow joiner: publishes with `send(i)` every 10 ms until `arrived` settles (bounded by the test's timeout). */
async function publishUntil<T>(arrived: Promise<T>, send: (i: number) => Promise<void>): Promise<T> {
  let done = false;
  const settled = arrived.finally(() => (done = true));
  void settled.catch(() => undefined);
  for (let i = 0; !done; i++) {
    await send(i);
    await new Promise((r) => setTimeout(r, 10));
  }
  return settled;
}

describe('client packages', () => {
  let work: string;
  let tarball: string;
  const closers: Array<() => unknown> = [];
  before(() => {
    work = mkdtempSync(join(tmpdir(), 'percept-client-'));
    const build = spawnSync(process.execPath, [join(root, 'tools/build-client.mjs'), '--pack', join(work, 'pack')], {
      encoding: 'utf8',
      env: outsideEnv(),
    });
    assert.equal(build.status, 0, build.stderr);
    tarball = build.stdout.trim().split('\n').at(-1)!;
  });
  after(async () => {
    for (const c of closers) await c();
    rmSync(work, { recursive: true, force: true });
  });

  test("client/package.json: the repo's version, zeromq and ajv at the repo's versions, no scripts; the tarball holds JS, declarations and schemas", () => {
    const repo = readJson(join(root, 'package.json'));
    const pkg = readJson(join(root, 'client/package.json'));
    assert.equal(pkg.version, repo.version);
    assert.equal(pkg.private, undefined);
    assert.equal(pkg.scripts, undefined);
    assert.deepEqual(pkg.dependencies, { ajv: repo.dependencies.ajv, zeromq: repo.dependencies.zeromq });
    const pyproject = readFileSync(join(root, 'client/python/pyproject.toml'), 'utf8');
    assert.match(pyproject, new RegExp(`^version = "${repo.version.replaceAll('.', '\\.')}"$`, 'm'));
    const list = spawnSync('tar', ['tzf', tarball], { encoding: 'utf8' });
    assert.equal(list.status, 0, list.stderr);
    const files = list.stdout.trim().split('\n').sort();
    const schemas = (dir: string) =>
      readdirSync(join(root, 'configs', dir))
        .filter((n) => n.endsWith('.schema.json'))
        .map((n) => `package/dist/configs/${dir}/${n}`);
    assert.deepEqual(
      files,
      [
        'package/dist/client/index.d.ts',
        'package/dist/client/index.js',
        'package/dist/client/wire-types.d.ts',
        'package/dist/client/wire-types.js',
        ...schemas('actions'),
        ...schemas('wire'),
        'package/package.json',
        ...(existsSync(join(root, 'client/README.md')) ? ['package/README.md'] : []),
      ].sort(),
    );
  });

  test('a project outside the repo installs the tarball and receives validated actions with plain node', { timeout: 600_000 }, async () => {
    const project = join(work, 'consumer');
    mkdirSync(project);
    writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }));
    const install = spawnSync('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', tarball], {
      cwd: project,
      encoding: 'utf8',
      env: outsideEnv(),
      timeout: 540_000,
    });
    assert.equal(install.status, 0, `npm install: ${install.stdout}\n${install.stderr}`);
    // Only the client's own dependency tree: nothing of the pipeline, and no llama.cpp build.
    const installed = Object.keys(readJson(join(project, 'package-lock.json')).packages).map((p) => p.replace(/^.*node_modules\//, ''));
    assert.ok(installed.includes('@percept/client') && installed.includes('zeromq') && installed.includes('ajv'), installed.join(' '));
    for (const name of ['percept', 'node-llama-cpp', 'onnxruntime-node', 'sharp', 'cmake-js', 'tsx', '@mcap/core'])
      assert.ok(!installed.includes(name), `${name} was installed: ${installed.join(' ')}`);

    writeFileSync(
      join(project, 'consumer.mjs'),
      [
        "import { subscribe } from '@percept/client';",
        'const [connect, count] = process.argv.slice(2);',
        "const sub = subscribe({ connect, topics: ['actions'] });",
        "console.log(JSON.stringify({ ready: true, resolved: import.meta.resolve('@percept/client') }));",
        'let n = 0;',
        'for await (const m of sub) {',
        '  console.log(JSON.stringify(m));',
        '  if (++n >= Number(count)) break;',
        '}',
        '',
      ].join('\n'),
    );
    const pub = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 });
    closers.push(() => pub.close());
    const child = spawn(process.execPath, [join(project, 'consumer.mjs'), pub.endpoint, '3'], { cwd: project, env: outsideEnv() });
    closers.push(() => child.kill());
    const out = linesOf(child);
    const ready = await out.next();
    assert.equal(ready.ready, true, out.stderr());
    assert.equal(fileURLToPath(ready.resolved as string), join(project, 'node_modules/@percept/client/dist/client/index.js'));
    const code = await publishUntil(out.exited, (i) => publish(pub, i));
    assert.equal(code, 0, out.stderr());
    const got = [await out.next(), await out.next(), await out.next()];
    for (const m of got) {
      assert.equal(m.type, 'action', JSON.stringify(m));
      assert.deepEqual(m.action, typed);
      assert.equal(m.stale, false);
      assert.equal((m.header as { schema_id: string }).schema_id, 'percept/robot-action/v1');
    }

    // The declarations: a TypeScript consumer type-checks against them (strict, library checks on).
    writeFileSync(
      join(project, 'check.ts'),
      [
        "import { subscribe, type Message, type RobotAction } from '@percept/client';",
        "const sub = subscribe({ connect: 'tcp://127.0.0.1:5556', topics: ['actions', 'events'] });",
        "const action: RobotAction = { action: 'stop', confidence: 1 };",
        "// @ts-expect-error 'fly' is not an action of the schema",
        "const wrong: RobotAction = { action: 'fly', confidence: 1 };",
        "const label = (m: Message): string => (m.type === 'action' ? m.action.action : m.type);",
        'void [sub, action, wrong, label];',
        '',
      ].join('\n'),
    );
    const tsc = spawnSync(
      process.execPath,
      [
        join(root, 'node_modules/typescript/bin/tsc'),
        '--noEmit',
        '--strict',
        '--module',
        'nodenext',
        '--target',
        'es2022',
        '--typeRoots',
        join(root, 'node_modules/@types'),
        '--types',
        'node',
        'check.ts',
      ],
      { cwd: project, encoding: 'utf8', env: outsideEnv() },
    );
    assert.equal(tsc.status, 0, tsc.stdout + tsc.stderr);
  });

  test(
    'the Python package, copied out of the repo and installed there, validates actions against its bundled schemas',
    { timeout: 300_000 },
    async () => {
      const copy = join(work, 'python-copy');
      cpSync(join(root, 'client/python'), copy, {
        recursive: true,
        filter: (src) => !/(__pycache__|\.egg-info|\/build)$/.test(src),
      });
      // Copied: it reads the schemas inside it (no repo around it to fall back to).
      const where = (pythonPath: string) => {
        const r = spawnSync(PYTHON, ['-c', 'import percept_client as p; print(p.SCHEMAS)'], {
          cwd: work,
          encoding: 'utf8',
          env: outsideEnv({ PYTHONPATH: pythonPath }),
        });
        assert.equal(r.status, 0, r.stderr);
        return r.stdout.trim();
      };
      assert.equal(where(copy), join(copy, 'percept_client/schemas'));
      // Installed with pip from the copy, offline (the system's setuptools), where setuptools is there.
      let site = copy;
      if (spawnSync(PYTHON, ['-c', 'import setuptools, wheel']).status === 0) {
        site = join(work, 'site');
        const pip = spawnSync(
          PYTHON,
          ['-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation', '--no-index', '--target', site, copy],
          {
            cwd: work,
            encoding: 'utf8',
            env: outsideEnv({ PIP_DISABLE_PIP_VERSION_CHECK: '1' }),
            timeout: 240_000,
          },
        );
        assert.equal(pip.status, 0, pip.stdout + pip.stderr);
        assert.equal(where(site), join(site, 'percept_client/schemas'));
      }

      const pub = await createPublisher({ endpoint: 'tcp://127.0.0.1:*', topic: 'actions', sendHighWaterMark: 1000 });
      closers.push(() => pub.close());
      const child = spawn(PYTHON, ['-m', 'percept_client', '--connect', pub.endpoint, '--topic', 'actions', '--timeout', '120'], {
        cwd: work,
        env: outsideEnv({ PYTHONPATH: site }),
      });
      closers.push(() => child.kill());
      const out = linesOf(child);
      assert.deepEqual(await out.next(), { ready: true }, out.stderr());
      const first = await publishUntil(out.next(), (i) => publish(pub, i));
      assert.equal(first.valid, true, JSON.stringify(first));
      assert.equal(first.error, '', 'validated with jsonschema');
      assert.deepEqual(first.body, typed);
      // An action outside the schema's enum: the publisher passes it on, the client rejects it.
      const fly = { action: 'fly', confidence: 1 };
      await publish(pub, 1_000_000, fly);
      let m = await out.next();
      while ((m.header as { frame_id: number }).frame_id !== 1_000_000) m = await out.next();
      assert.equal(m.valid, false);
      assert.match(m.error as string, /\/action: 'fly' is not one of/);
    },
  );
});
