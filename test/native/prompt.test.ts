// The prompt planner (native/src/prompt.cc) without a model: percept-plan-prompt runs planPrompt on
// JSON cases, "tokenizing" text byte by byte (token = byte + 100, BOS = 1). Checks the cache items a
// prompt becomes and how much of it a KV cache already holds.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { test } from 'node:test';
import { promisify } from 'node:util';
import { findPeer } from '../support/fixtures.ts';

const run = promisify(execFile);
const START = 10;
const END = 11;

type Seg = { text: string; addSpecial?: boolean } | { tokens: number[] } | { image: number[]; nTokens: number; causal?: boolean };
interface Plan {
  items: ({ token: number } | { image: number; hash: string })[];
  reuse: number;
  reusePositions: number;
  positions: number;
}

async function plan(cases: { segments: Seg[]; cache?: Seg[] }[]): Promise<Plan[]> {
  const bin = findPeer('percept-plan-prompt');
  assert.ok(bin, 'percept-plan-prompt not built: node tools/build-native.mjs');
  const child = run(bin, [], { maxBuffer: 1 << 20 });
  child.child.stdin?.end(JSON.stringify(cases.map((c) => ({ markers: [START, END], ...c }))));
  return JSON.parse((await child).stdout) as Plan[];
}

const bytes = (s: string): { token: number }[] => [...Buffer.from(s)].map((b) => ({ token: b + 100 }));
const tokensOf = (p: Plan): (number | string)[] => p.items.map((i) => ('token' in i ? i.token : `image×${i.image}`));
const SYSTEM: Seg = { text: 'sys', addSpecial: true };
const IMG_A = { image: [0.5, -1, 2, 3.25, 0, 1], nTokens: 3 };
const IMG_B = { image: [0.5, -1, 2, 3.25, 0, 1.0001], nTokens: 3 };

test('segments become one item per token and one per image, framed by the image markers', async () => {
  const [p] = await plan([{ segments: [SYSTEM, { tokens: [7, 8] }, IMG_A, { text: 'q' }] }]);
  assert.deepEqual(tokensOf(p!), [1, ...bytes('sys').map((t) => t.token), 7, 8, START, 'image×3', END, 'q'.charCodeAt(0) + 100]);
  assert.equal(p!.positions, 1 + 3 + 2 + 1 + 3 + 1 + 1);
  assert.equal(p!.reuse, 0);
  assert.equal(p!.reusePositions, 0);
});

test('reuse: the longest cached prefix, never the last item, positions counted per item', async () => {
  const cases: { name: string; segments: Seg[]; cache: Seg[]; reuse: number; reusePositions: number }[] = [
    { name: 'empty cache', segments: [SYSTEM, { text: 'ab' }], cache: [], reuse: 0, reusePositions: 0 },
    { name: 'same system, new question', segments: [SYSTEM, { text: 'ab' }], cache: [SYSTEM, { text: 'xy' }], reuse: 4, reusePositions: 4 },
    {
      name: 'diverges inside the text',
      segments: [SYSTEM, { text: 'abc' }],
      cache: [SYSTEM, { text: 'abd' }],
      reuse: 6,
      reusePositions: 6,
    },
    {
      name: 'whole prompt cached: last item decoded again',
      segments: [SYSTEM, { text: 'ab' }],
      cache: [SYSTEM, { text: 'ab' }],
      reuse: 5,
      reusePositions: 5,
    },
    {
      name: 'cache longer than the prompt (generated tokens)',
      segments: [SYSTEM],
      cache: [SYSTEM, { tokens: [9, 9, 9] }],
      reuse: 3,
      reusePositions: 3,
    },
    {
      name: 'same image is reused whole',
      segments: [SYSTEM, IMG_A, { text: 'a' }],
      cache: [SYSTEM, IMG_A, { text: 'b' }],
      reuse: 7,
      reusePositions: 9,
    },
    {
      name: 'another image: reuse stops at its start marker',
      segments: [SYSTEM, IMG_B, { text: 'a' }],
      cache: [SYSTEM, IMG_A, { text: 'a' }],
      reuse: 5,
      reusePositions: 5,
    },
    {
      name: 'same rows decoded causally are another KV content',
      segments: [SYSTEM, { ...IMG_A, causal: true }],
      cache: [SYSTEM, IMG_A],
      reuse: 5,
      reusePositions: 5,
    },
    {
      name: 'an image where the cache has a token',
      segments: [{ tokens: [7] }, IMG_A],
      cache: [{ tokens: [7, START, 3] }],
      reuse: 2,
      reusePositions: 2,
    },
    { name: 'BOS differs', segments: [{ text: 'sys' }], cache: [SYSTEM], reuse: 0, reusePositions: 0 },
  ];
  const plans = await plan(cases);
  cases.forEach((c, i) => {
    const p = plans[i]!;
    assert.deepEqual({ reuse: p.reuse, reusePositions: p.reusePositions }, { reuse: c.reuse, reusePositions: c.reusePositions }, c.name);
    assert.ok(p.reuse < p.items.length, `${c.name}: the last item must be decoded`);
  });
});

test('image identity: equal rows hash equal, one changed float or the causal flag changes it', async () => {
  const [a, a2, b, causal] = await plan([
    { segments: [IMG_A] },
    { segments: [{ ...IMG_A }] },
    { segments: [IMG_B] },
    { segments: [{ ...IMG_A, causal: true }] },
  ]);
  const hashOf = (p: Plan): string => (p.items[1] as { hash: string }).hash;
  assert.equal(hashOf(a!), hashOf(a2!));
  assert.notEqual(hashOf(a!), hashOf(b!));
  assert.notEqual(hashOf(a!), hashOf(causal!));
});

test('an empty prompt plans nothing (the generation refuses it)', async () => {
  const [p] = await plan([{ segments: [{ text: '' }], cache: [SYSTEM] }]);
  assert.deepEqual(p, { items: [], reuse: 0, reusePositions: 0, positions: 0 });
});
