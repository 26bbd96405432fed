#!/usr/bin/env node
// Builds the client packages robot stacks install outside the repo (docs/wire.md, "Clients"):
//
//   client/dist/client/*.js, *.d.ts      client/*.ts compiled by the repo's TypeScript (client/tsconfig.build.json)
//   client/dist/configs/{wire,actions}/  the wire and action schemas, where client/index.js looks for them
//                                        (../configs from itself, as client/index.ts does in the repo)
//   client/python/percept_client/schemas/{wire,actions}/   the same schemas as the Python package's data
//
// All three are git-ignored. Then `npm pack ./client` makes the npm package (@percept/client) and
// `pip install ./client/python` the Python one (its setup.py copies the schemas too when the repo is there).
//
//   node tools/build-client.mjs              build
//   node tools/build-client.mjs --pack DIR   build, then npm pack into DIR; prints the tarball's path
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
const client = join(root, 'client');
const args = process.argv.slice(2);
const packAt = args[0] === '--pack' ? args[1] : undefined;
if (args.length > 0 && (packAt === undefined || args.length !== 2)) {
  console.error('usage: node tools/build-client.mjs [--pack DIR]');
  process.exit(2);
}
const fail = (message) => {
  console.error(`build-client: ${message}`);
  process.exit(1);
};

// The package's version and dependencies are the repo's.
const readJson = (path) => JSON.parse(readFileSync(path, 'utf8'));
const rootPkg = readJson(join(root, 'package.json'));
const pkg = readJson(join(client, 'package.json'));
if (pkg.version !== rootPkg.version) fail(`client/package.json version ${pkg.version} is not the repo's ${rootPkg.version}`);
for (const [name, version] of Object.entries(pkg.dependencies ?? {}))
  if (rootPkg.dependencies?.[name] !== version)
    fail(`client/package.json wants ${name} ${version}, the repo has ${rootPkg.dependencies?.[name]}`);

// JavaScript and declarations.
const dist = join(client, 'dist');
rmSync(dist, { recursive: true, force: true });
const tsc = spawnSync(process.execPath, [join(root, 'node_modules/typescript/bin/tsc'), '-p', join(client, 'tsconfig.build.json')], {
  stdio: 'inherit',
});
if (tsc.status !== 0) fail('tsc failed');
// Declarations keep the sources' `./x.ts` imports; a consumer resolves `./x.js` to x.d.ts.
for (const name of readdirSync(join(dist, 'client')).filter((n) => n.endsWith('.d.ts'))) {
  const file = join(dist, 'client', name);
  writeFileSync(file, readFileSync(file, 'utf8').replace(/(from '\.\/[\w-]+)\.ts'/g, "$1.js'"));
}

// The schemas, inside each package.
const schemaDirs = ['wire', 'actions'];
const python = join(client, 'python', 'percept_client', 'schemas');
rmSync(python, { recursive: true, force: true });
for (const dir of schemaDirs) {
  const from = join(root, 'configs', dir);
  for (const name of readdirSync(from).filter((n) => n.endsWith('.schema.json'))) {
    for (const to of [join(dist, 'configs', dir), join(python, dir)]) {
      mkdirSync(to, { recursive: true });
      cpSync(join(from, name), join(to, name));
    }
  }
}

if (packAt) {
  const dest = resolve(packAt);
  mkdirSync(dest, { recursive: true });
  const pack = spawnSync('npm', ['pack', '--json', '--pack-destination', dest], { cwd: client, encoding: 'utf8' });
  if (pack.status !== 0) fail(`npm pack failed: ${pack.stderr}`);
  const [{ filename }] = JSON.parse(pack.stdout);
  console.log(join(dest, filename));
}
