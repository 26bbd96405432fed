// The README and docs/ stay true about what they list and about the commands they show:
// - every PERCEPT_* environment variable the code reads is in docs/environment.md;
// - the README's Layout section names every top-level source folder;
// - every percept command in README.md and docs/*.md names a real command, and only options it has;
// - every `npm run` script exists, and every script file a command runs exists;
// - every relative link reaches a file, and its #anchor a heading there;
// - every repository path in backticks exists;
// - every JSON config example loads (configs/percept.schema.json and the semantic checks).
// The generated pages (docs/cli.md, docs/config.md) are checked against their sources by docs.test.ts.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { before, test } from 'node:test';
import { loadConfig } from '../../pipeline/config.ts';
import { describeProgram, loadProgram, type CliCommand } from '../../tools/gen-docs.ts';

const ROOT = join(import.meta.dirname, '../..');
const read = (file: string): string => readFileSync(join(ROOT, file), 'utf8');
const GENERATED = ['docs/cli.md', 'docs/config.md'];
const DOCS = [
  'README.md',
  ...readdirSync(join(ROOT, 'docs'))
    .filter((name) => name.endsWith('.md'))
    .sort()
    .map((name) => `docs/${name}`),
];
const HAND_WRITTEN = DOCS.filter((file) => !GENERATED.includes(file));
const section = (text: string, title: string): string => text.split(/^## /m).find((s) => s.startsWith(`${title}\n`)) ?? '';

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : sources(path);
    return /\.(ts|mjs|cjs|js)$/.test(name) ? [path] : [];
  });
}

/** The fenced code blocks of a markdown text, with their language, and the text outside them. */
function split(markdown: string): { blocks: { lang: string; body: string }[]; prose: string } {
  const blocks: { lang: string; body: string }[] = [];
  const prose = markdown.replace(/^```(\w*)\n([\s\S]*?)^```$/gm, (_all, lang: string, body: string) => {
    blocks.push({ lang, body });
    return '';
  });
  return { blocks, prose };
}

/** Inline code spans of a markdown text (outside fenced blocks). */
const spans = (prose: string): string[] => [...prose.matchAll(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g)].map((m) => m[2]!.trim());

/** Shell command lines of the sh blocks: continuations joined, comments dropped, split at && and ;. */
function shellLines(blocks: { lang: string; body: string }[]): string[] {
  return blocks
    .filter((b) => ['sh', 'bash', 'shell'].includes(b.lang))
    .flatMap((b) => b.body.replace(/\\\n\s*/g, ' ').split('\n'))
    .map((line) => line.replace(/(^|\s)#.*$/, '').trim())
    .flatMap((line) => line.split(/\s+(?:&&|;|\|\|)\s+/))
    .filter(Boolean);
}

interface Use {
  file: string;
  text: string;
  /** The arguments after `percept` (or after `npm start --`, as `run …`). */
  args: string;
}

/** Every percept command the page shows: in sh blocks and in inline code. */
function perceptUses(file: string, topLevel: string[]): Use[] {
  const { blocks, prose } = split(read(file));
  const uses: Use[] = [];
  const fromCommand = (text: string, inline: boolean): void => {
    const env = /^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*/; // VAR=value prefixes
    const cmd = text.replace(env, '');
    let m: RegExpExecArray | null;
    if ((m = /^npm run percept -- ?(.*)$/.exec(cmd)) || (m = /^npx percept ?(.*)$/.exec(cmd)) || (m = /^percept (.*)$/.exec(cmd)))
      uses.push({ file, text, args: m[1]! });
    else if ((m = /^npm start(?: -- (.*))?$/.exec(cmd))) uses.push({ file, text, args: `run ${m[1] ?? ''}` });
    else if (inline && topLevel.some((name) => cmd === name || cmd.startsWith(`${name} `))) uses.push({ file, text, args: cmd });
  };
  for (const line of shellLines(blocks)) fromCommand(line, false);
  for (const span of spans(prose)) fromCommand(span, true);
  return uses;
}

let program: CliCommand;
before(async () => {
  program = describeProgram(await loadProgram());
});

test('every PERCEPT_* variable the code reads is documented in docs/environment.md', () => {
  const readVars = new Set<string>();
  for (const folder of ['app', 'pipeline', 'nodes', 'native', 'models', 'tools', 'test']) {
    for (const file of sources(join(ROOT, folder))) {
      for (const m of readFileSync(file, 'utf8').matchAll(/process\.env\.(PERCEPT_[A-Z0-9_]+)/g)) readVars.add(m[1]!);
    }
  }
  assert.ok(readVars.size >= 5, `found only ${[...readVars].join(', ')}`);
  const documented = read('docs/environment.md');
  const missing = [...readVars].filter((name) => !documented.includes(`\`${name}`));
  assert.deepEqual(missing, [], 'add these to the table in docs/environment.md');
});

test('the Layout section names every top-level source folder', () => {
  const layout = section(read('README.md'), 'Layout');
  assert.ok(layout, 'README.md has no "## Layout" section');
  const folders = readdirSync(ROOT).filter(
    (name) => !name.startsWith('.') && !['node_modules', 'build', 'out'].includes(name) && statSync(join(ROOT, name)).isDirectory(),
  );
  const missing = folders.filter((name) => !layout.includes(`\`${name}/\``));
  assert.deepEqual(missing, []);
});

test('the README puts the two set-up commands first and stays short', () => {
  const readme = read('README.md');
  const lines = readme.split('\n').length;
  assert.ok(lines <= 160, `README.md has ${lines} lines; move detail into docs/`);
  const commands = shellLines(split(readme).blocks);
  assert.deepEqual(commands.slice(0, 3), ['npm install', 'npm start', 'npm test']);
});

test('every percept command in README.md and docs/ names a real command and real options', () => {
  const topLevel = program.subcommands.map((c) => c.path[0]!);
  const problems: string[] = [];
  let checked = 0;
  for (const file of HAND_WRITTEN) {
    for (const use of perceptUses(file, topLevel)) {
      checked++;
      const tokens = use.args
        .replace(/[[\](){}]/g, ' ')
        .split(/[\s|]+/)
        .filter(Boolean);
      let cmd = program;
      let i = 0;
      for (; i < tokens.length; i++) {
        const sub = cmd.subcommands.find((c) => c.path.at(-1) === tokens[i]);
        if (!sub) break;
        cmd = sub;
      }
      const first = tokens[i];
      if (cmd === program && first !== undefined && !first.startsWith('-') && !first.startsWith('<') && first !== 'help')
        problems.push(`${use.file}: \`${use.text}\`: percept has no command '${first}'`);
      if (cmd !== program && cmd.subcommands.length > 0 && first !== undefined && !first.startsWith('-') && !first.startsWith('<'))
        problems.push(`${use.file}: \`${use.text}\`: '${cmd.path.join(' ')}' has no subcommand '${first}'`);
      const longs = new Set(cmd.options.map((o) => o.long).filter(Boolean));
      for (const token of tokens.slice(i)) {
        if (!/^--[a-z]/.test(token)) continue;
        const option = token.replace(/=.*$/, '');
        if (!longs.has(option)) problems.push(`${use.file}: \`${use.text}\`: 'percept ${cmd.path.join(' ')}' has no option ${option}`);
      }
    }
  }
  assert.ok(checked >= 40, `only ${checked} percept commands found in README.md and docs/`);
  assert.deepEqual(problems, []);
});

test('every npm script the docs run exists, and so does every script file', () => {
  const scripts = (JSON.parse(read('package.json')) as { scripts: Record<string, string> }).scripts;
  const problems: string[] = [];
  for (const file of DOCS) {
    const { blocks, prose } = split(read(file));
    const texts = [...shellLines(blocks), ...spans(prose)];
    for (const text of texts) {
      for (const m of text.matchAll(/\bnpm run ([\w:-]+)/g))
        if (!(m[1]! in scripts)) problems.push(`${file}: \`${text}\`: no npm script '${m[1]}'`);
      for (const m of text.matchAll(/\b(?:node(?: --import tsx)?|python3|bash) ((?:tools|client|app)\/[\w./-]+)/g))
        if (!existsSync(join(ROOT, m[1]!))) problems.push(`${file}: \`${text}\`: ${m[1]} does not exist`);
    }
  }
  assert.deepEqual(problems, []);
});

/** GitHub's anchors for the headings of a markdown file. */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of split(markdown).prose.matchAll(/^#{1,6} (.+)$/gm)) {
    const base = m[1]!
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

test('every relative link in README.md and docs/ reaches its file and heading', () => {
  const problems: string[] = [];
  for (const file of DOCS) {
    const { prose } = split(read(file));
    for (const m of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = m[1]!;
      if (/^[a-z]+:/.test(target)) continue;
      const [path, anchor] = target.split('#') as [string, string | undefined];
      const abs = path ? resolve(ROOT, dirname(file), path) : join(ROOT, file);
      if (!existsSync(abs)) {
        problems.push(`${file}: link ${target}: ${relative(ROOT, abs)} does not exist`);
        continue;
      }
      if (anchor !== undefined && !anchors(readFileSync(abs, 'utf8')).has(anchor))
        problems.push(`${file}: link ${target}: no heading #${anchor} in ${relative(ROOT, abs)}`);
    }
  }
  assert.deepEqual(problems, []);
});

test('every repository path in backticks in README.md and docs/ exists', () => {
  // Paths that name files of other trees (llama.cpp's, inside node-llama-cpp's bundle).
  const elsewhere = new Set(['models/ggml-vocab-gemma-4.gguf']);
  const problems: string[] = [];
  let checked = 0;
  for (const file of HAND_WRITTEN) {
    for (const span of spans(split(read(file)).prose)) {
      if (!/^(app|bags|client|configs|docs|models|native|nodes|pipeline|test|tools)\/[\w./-]*$/.test(span) || elsewhere.has(span)) continue;
      checked++;
      if (!existsSync(join(ROOT, span))) problems.push(`${file}: \`${span}\` does not exist`);
    }
  }
  assert.ok(checked >= 20, `only ${checked} paths found`);
  assert.deepEqual(problems, []);
});

test('every JSON config example in README.md and docs/ loads', () => {
  const sections = new Set(Object.keys((JSON.parse(read('configs/percept.schema.json')) as { properties: object }).properties));
  const problems: string[] = [];
  let checked = 0;
  for (const file of HAND_WRITTEN) {
    const { blocks } = split(read(file));
    for (const { lang, body } of blocks) {
      if (lang !== 'json') continue;
      let value: unknown;
      try {
        value = JSON.parse(body);
      } catch {
        continue; // JSON lines (labels), not a config
      }
      if (typeof value !== 'object' || value === null || Array.isArray(value) || !Object.keys(value).every((k) => sections.has(k)))
        continue;
      checked++;
      try {
        loadConfig(value);
      } catch (err) {
        problems.push(`${file}: ${(err as Error).message}`);
      }
    }
  }
  assert.ok(checked >= 4, `only ${checked} config examples found`);
  assert.deepEqual(problems, []);
});
