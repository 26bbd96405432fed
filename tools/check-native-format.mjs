#!/usr/bin/env node
// Part of `npm run lint`: clang-format over native/src and its subfolders, with the style file clang-format itself
// finds (.clang-format in native/src or a folder above it). Until that file exists the check is
// skipped with a message; from then on a missing clang-format fails it.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
const src = join(root, 'native', 'src');
const style = [src, join(root, 'native'), root].map((dir) => join(dir, '.clang-format')).find((file) => existsSync(file));
if (!style) {
  console.log('clang-format: skipped, there is no .clang-format for native/src yet');
  process.exit(0);
}
// Every C++ and CUDA file under native/src, subfolders (internal/) included.
const files = readdirSync(src, { recursive: true })
  .filter((name) => /\.(h|cc|cu)$/.test(name))
  .sort()
  .map((name) => join('native', 'src', name));
const r = spawnSync('clang-format', ['--dry-run', '--Werror', ...files], { cwd: root, stdio: 'inherit' });
if (r.error) {
  console.error(`clang-format: cannot run it (${r.error.message}); on Debian: apt-get install clang-format`);
  process.exit(1);
}
if (r.status === 0) console.log(`clang-format: ${files.length} files in native/src follow ${style.slice(root.length)}`);
process.exit(r.status ?? 1);
