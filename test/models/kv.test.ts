// KV-cache calculator (models/kv.ts, `percept calc kv`) against llama.cpp's own numbers: the bytes its
// memory breakdown reports through our binding, the cache sizes its own programs log, and the sizes the
// reference records for the E2B/E4B-shaped checkpoints.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { GGUFWriter, arr, readGGUF, str, u32, type GGUFValue } from '../../models/gguf.ts';
import { attentionLayout, kvCacheBytes, kvReadBytesPerToken, type AttentionLayout, type KvType } from '../../models/kv.ts';
import { describeModel } from '../../models/resolve.ts';
import { LlamaModel } from '../../native/llama.ts';
import { REPO_ROOT, ensureSynthModel, findPeer } from '../support/fixtures.ts';

const run = promisify(execFile);
const MiB = 1024 * 1024;

/** A metadata-only GGUF (no tensors) with these KVs, parsed back. */
async function header(kvs: Record<string, GGUFValue>) {
  const w = new GGUFWriter();
  for (const [k, v] of Object.entries(kvs)) w.set(k, v);
  return readGGUF(w.skeleton());
}

const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);

describe('attention layout read from the synthetic presets (models.md §1)', () => {
  test('gemma4-e2b: [S,S,S,S,F]x7, layers 15-34 share the caches of 13 (sliding) and 14 (full)', async () => {
    const l = attentionLayout(await describeModel('synth:gemma4-e2b'));
    assert.equal(l.layers.length, 35);
    assert.equal(l.window, 512);
    assert.deepEqual(
      l.layers.filter((x) => x.kind === 'full').map((x) => x.index),
      [4, 9, 14, 19, 24, 29, 34],
    );
    for (const x of l.layers) {
      assert.equal(x.kvFrom, x.index < 15 ? x.index : x.kind === 'sliding' ? 13 : 14, `layer ${x.index}`);
      assert.deepEqual([x.kvHeads, x.headDimK, x.headDimV], x.kind === 'sliding' ? [1, 256, 256] : [1, 512, 512]);
    }
  });

  test('gemma4-e4b: layers 24-41 share 22 (sliding) and 23 (full); 2 KV heads', async () => {
    const l = attentionLayout(await describeModel('synth:gemma4-e4b'));
    assert.deepEqual(
      l.layers.filter((x) => x.kvFrom !== x.index).map((x) => x.index),
      range(24, 42),
    );
    assert.deepEqual(
      new Set(l.layers.filter((x) => x.index >= 24).map((x) => `${x.kind}→${x.kvFrom}`)),
      new Set(['sliding→22', 'full→23']),
    );
    assert.ok(l.layers.every((x) => x.kvHeads === 2));
  });

  test('gemma3-1b: every 6th layer is global (5, 11, 17, 23; the 26th slides), window 512', async () => {
    const l = attentionLayout(await describeModel('synth:gemma3-1b'));
    assert.deepEqual(
      l.layers.filter((x) => x.kind === 'full').map((x) => x.index),
      [5, 11, 17, 23],
    );
    assert.equal(l.window, 512);
    assert.ok(l.layers.every((x) => x.kvFrom === x.index && x.headDimK === 256));
  });

  test("a Gemma 4 assistant owns no cache: every layer reads its target's", async () => {
    const l = attentionLayout(await describeModel('synth:gemma4-e2b-assistant'));
    assert.ok(l.layers.every((x) => x.kvFrom === 'target'));
    assert.equal(kvCacheBytes(l, { ctx: 4096 }).totalBytes, 0);
  });

  test("llama.cpp's logged caches at -c 2048 (models.md §4/§6): E2B 12 MiB full (3 layers) + 12 MiB SWA (12), E4B 32 + 40 MiB", async () => {
    for (const [preset, full, fullLayers, swa, swaLayers] of [
      ['gemma4-e2b', 12, 3, 12, 12],
      ['gemma4-e4b', 32, 4, 40, 20],
    ] as const) {
      const e = kvCacheBytes(attentionLayout(await describeModel(`synth:${preset}`)), { ctx: 2048 });
      assert.equal(e.full.bytes, full * MiB, preset);
      assert.equal(e.full.layers.length, fullLayers, preset);
      assert.equal(e.sliding.bytes, swa * MiB, preset);
      assert.equal(e.sliding.layers.length, swaLayers, preset);
    }
  });
});

describe('against llama.cpp through our binding (exact bytes of the context memory breakdown)', () => {
  // The binding runs llama.cpp with swa_full (prefix reuse and rejected drafts need partial KV removal),
  // one sequence, ubatch 512.
  const configs: { nCtx: number; kvType: 'f16' | 'q8_0'; flashAttention: boolean | 'auto' }[] = [
    { nCtx: 4096, kvType: 'f16', flashAttention: 'auto' },
    { nCtx: 1000, kvType: 'q8_0', flashAttention: true },
    { nCtx: 2048, kvType: 'f16', flashAttention: false },
    { nCtx: 5000, kvType: 'f16', flashAttention: true },
  ];
  for (const preset of ['gemma4-tiny', 'gemma3-tiny']) {
    test(`${preset}: ${configs.map((c) => `${c.nCtx}/${c.kvType}/fa=${c.flashAttention}`).join(', ')}`, { timeout: 120_000 }, async () => {
      const path = await ensureSynthModel(preset);
      const layout = attentionLayout(await readGGUF(path));
      const model = await LlamaModel.load(path);
      try {
        for (const c of configs) {
          const ctx = await model.createContext({ ...c, threads: 1 });
          const reported = ctx.memoryBreakdown().context;
          await ctx.dispose();
          const ours = kvCacheBytes(layout, { ctx: c.nCtx, kvType: c.kvType, swaFull: true, flashAttention: c.flashAttention !== false });
          assert.equal(ours.totalBytes, reported, `${preset} ${JSON.stringify(c)}`);
        }
      } finally {
        await model.dispose();
      }
    });
  }
});

/** One `llama_kv_cache: size = …` log line of llama.cpp. */
interface LoggedCache {
  mib: number;
  cells: number;
  layers: number;
  seqs: number;
  streams: number;
  kMib: number;
  vMib: number;
}

const CACHE_LINE =
  /llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)\/(\d+) seqs\), K \(\w+\):\s*([\d.]+) MiB, V \(\w+\):\s*([\d.]+) MiB/g;

describe("against the caches llama.cpp's own program logs (tool defaults: bounded SWA cache, split streams)", () => {
  const peer = findPeer('llama-speculative-simple');
  const skip = peer ? false : 'llama-speculative-simple not built (PERCEPT_PEERS="llama-speculative-simple" node tools/build-native.mjs)';
  // [llama.cpp arguments, our options]. -c is llama.cpp's total context; ours is per sequence.
  const cases: [
    string[],
    { ctx: number; batch?: number; kvType?: KvType; ubatch?: number; swaFull?: boolean; flashAttention?: boolean },
  ][] = [
    [['-c', '8192'], { ctx: 8192 }],
    [['-c', '3000', '-np', '3'], { ctx: 1000, batch: 3 }],
    [['-c', '4096', '-ctk', 'q4_0', '-ctv', 'q4_0', '-fa', 'on'], { ctx: 4096, kvType: 'q4_0' }],
    [['-c', '8192', '-np', '4', '-ctk', 'q8_0', '-ctv', 'q8_0', '-fa', 'on'], { ctx: 2048, batch: 4, kvType: 'q8_0' }],
    [['-c', '4096', '-fa', 'off'], { ctx: 4096, flashAttention: false }],
    [['-c', '4096', '--swa-full'], { ctx: 4096, swaFull: true }],
    [['-c', '1000', '-b', '64', '-ub', '64'], { ctx: 1000, ubatch: 64 }],
  ];
  // gemma4-tiny has every layer kind (sliding, full, KV-shared, two head sizes); gemma3-tiny the 1-in-6 pattern.
  for (const [preset, settings] of [
    ['gemma4-tiny', cases],
    ['gemma3-tiny', cases.slice(0, 3)],
  ] as const) {
    test(
      `${preset}: cells, layers, streams and MiB of each cache match (${settings.length} settings)`,
      { skip, timeout: 300_000 },
      async () => {
        const path = await ensureSynthModel(preset);
        const layout = attentionLayout(await readGGUF(path));
        for (const [args, options] of settings) {
          // With no draft model given, the program builds the target context (logging its caches) and stops
          // before generating anything.
          const log = await run(peer!, ['-m', path, '-fit', 'off', '-t', '1', '-p', 'hi', '-v', ...args], {
            cwd: REPO_ROOT,
            timeout: 60_000,
            maxBuffer: 64 << 20,
          }).then(
            ({ stdout, stderr }) => stdout + stderr,
            (err: { stdout?: string; stderr?: string }) => `${err.stdout ?? ''}${err.stderr ?? ''}`,
          );
          const logged: LoggedCache[] = [...log.matchAll(CACHE_LINE)].map((m) => ({
            mib: Number(m[1]),
            cells: Number(m[2]),
            layers: Number(m[3]),
            seqs: Number(m[4]),
            streams: Number(m[5]),
            kMib: Number(m[6]),
            vMib: Number(m[7]),
          }));
          const what = `${preset} ${args.join(' ')}`;
          assert.equal(logged.length, 2, `${what}: expected the non-SWA and the SWA cache lines, log tail:\n${log.slice(-2000)}`);
          const e = kvCacheBytes(layout, options);
          // llama.cpp prints MiB with two decimals.
          const near = (ours: number, printed: number, label: string) =>
            assert.ok(
              Math.abs(ours / MiB - printed) <= 0.0051,
              `${what} ${label}: ours ${(ours / MiB).toFixed(4)} MiB, llama.cpp ${printed}`,
            );
          for (const [group, line] of [
            [e.full, logged[0]!],
            [e.sliding, logged[1]!],
          ] as const) {
            assert.equal(group.cells, line.cells, `${what}: cells`);
            assert.equal(group.layers.length, line.layers, `${what}: layers`);
            assert.equal(group.streams, line.streams, `${what}: streams`);
            near(group.bytes, line.mib, 'size');
            near(group.kBytes, line.kMib, 'K');
            near(group.vBytes, line.vMib, 'V');
          }
        }
      },
    );
  }
});

describe('options and errors', () => {
  const gemma3Like = (extra: Record<string, GGUFValue> = {}) =>
    header({
      'general.architecture': str('gemma3'),
      'gemma3.block_count': u32(6),
      'gemma3.embedding_length': u32(64),
      'gemma3.attention.head_count': u32(2),
      'gemma3.attention.head_count_kv': u32(1),
      'gemma3.attention.key_length': u32(64),
      'gemma3.attention.value_length': u32(64),
      'gemma3.attention.sliding_window': u32(128),
      ...extra,
    });

  test('a unified cache: one stream of pad256(ctx·batch) cells; the window grows with the sequences', async () => {
    const l = attentionLayout(await gemma3Like());
    const e = kvCacheBytes(l, { ctx: 1000, batch: 2, unified: true });
    // Per cell and layer: K and V rows of 1 head × 64 f16 values = 256 bytes.
    assert.equal(e.full.cells, 2048);
    assert.equal(e.full.streams, 1);
    assert.equal(e.sliding.cells, 768); // pad256(min(2048, 128·2 + 512))
    assert.equal(e.totalBytes, 1 * 2048 * 256 + 5 * 768 * 256);
  });

  test('bytes per extra token: full layers only, unless the sliding cache is full-size', async () => {
    const l = attentionLayout(await gemma3Like());
    assert.equal(kvCacheBytes(l, { ctx: 4096 }).bytesPerToken, 256);
    assert.equal(kvCacheBytes(l, { ctx: 4096, swaFull: true }).bytesPerToken, 6 * 256);
  });

  test('no sliding_window: every gemma3 layer is global', async () => {
    const w = new GGUFWriter();
    for (const kv of (await gemma3Like()).kvs) if (kv.key !== 'gemma3.attention.sliding_window') w.set(kv.key, kv.asValue());
    const l = attentionLayout(await readGGUF(w.skeleton()));
    assert.ok(l.layers.every((x) => x.kind === 'full'));
    assert.equal(kvCacheBytes(l, { ctx: 4096 }).totalBytes, 6 * 4096 * 256);
  });

  test('an explicit per-layer pattern array wins over the default 1-in-6', async () => {
    const l = attentionLayout(
      await gemma3Like({ 'gemma3.attention.sliding_window_pattern': arr('bool', [true, false, true, false, true, false]) }),
    );
    assert.deepEqual(
      l.layers.map((x) => x.kind),
      ['sliding', 'full', 'sliding', 'full', 'sliding', 'full'],
    );
  });

  test('KV reads per token: sliding layers read the window, full layers the context, shared layers their source again', () => {
    const l: AttentionLayout = {
      arch: 'gemma4',
      window: 4,
      layers: [
        { index: 0, kind: 'sliding', kvHeads: 1, headDimK: 64, headDimV: 64, kvFrom: 0 },
        { index: 1, kind: 'full', kvHeads: 2, headDimK: 128, headDimV: 128, kvFrom: 1 },
        { index: 2, kind: 'full', kvHeads: 2, headDimK: 128, headDimV: 128, kvFrom: 1 },
      ],
    };
    // f16: sliding 4 positions × (64 + 64) × 2 B; each full layer 10 positions × (256 + 256) × 2 B.
    assert.equal(kvReadBytesPerToken(l, 10), 4 * 128 * 2 + 2 * 10 * 512 * 2);
    assert.equal(kvReadBytesPerToken(l, 2), 2 * 128 * 2 + 2 * 2 * 512 * 2);
    assert.equal(kvReadBytesPerToken(l, 0), 0);
  });

  test('refusals name the problem', async () => {
    const l = attentionLayout(await gemma3Like());
    assert.throws(() => kvCacheBytes(l, { ctx: 4096, kvType: 'q8_0', flashAttention: false }), /needs flash attention/);
    assert.throws(() => kvCacheBytes(l, { ctx: 0 }), /ctx must be an integer ≥ 1/);
    assert.throws(() => kvCacheBytes(l, { ctx: 4096, batch: 1.5 }), /batch/);
    assert.throws(() => kvCacheBytes(l, { ctx: 4096, kvType: 'q5_1' as KvType }), /invalid KV cache type "q5_1"/);
    const odd = attentionLayout(await gemma3Like({ 'gemma3.attention.key_length': u32(48), 'gemma3.attention.value_length': u32(48) }));
    assert.throws(() => kvCacheBytes(odd, { ctx: 256, kvType: 'q4_0' }), /48 elements is not a whole number of Q4_0 blocks/);
    await assert.rejects(
      async () => attentionLayout(await header({ 'general.architecture': str('llama'), 'llama.block_count': u32(2) }), 'x.gguf'),
      /x\.gguf: architecture 'llama' is not supported/,
    );
    await assert.rejects(
      async () =>
        attentionLayout(
          await header({
            'general.architecture': str('gemma4'),
            'gemma4.block_count': u32(2),
            'gemma4.embedding_length': u32(64),
            'gemma4.attention.sliding_window': u32(128),
          }),
        ),
      /gemma4\.attention\.sliding_window_pattern \(one bool per layer\) is missing/,
    );
    await assert.rejects(
      async () => attentionLayout(await gemma3Like({ 'gemma3.attention.sliding_window_pattern': arr('bool', [true, false]) })),
      /has 2 entries for 6 layers/,
    );
    await assert.rejects(
      async () =>
        attentionLayout(
          await header({
            'general.architecture': str('gemma4'),
            'gemma4.block_count': u32(4),
            'gemma4.embedding_length': u32(64),
            'gemma4.attention.sliding_window': u32(128),
            'gemma4.attention.sliding_window_pattern': arr('bool', [true, true, false, false]),
            'gemma4.attention.shared_kv_layers': u32(2),
          }),
        ),
      /expects layer 0 sliding and 1 full/,
    );
  });
});

describe('percept calc kv', () => {
  const cli = (...args: string[]) =>
    run(process.execPath, ['--import', 'tsx', 'app/cli.ts', 'calc', 'kv', ...args], { cwd: REPO_ROOT, timeout: 60_000 });

  test(
    '--json on a preset spec (described in memory, nothing written): the breakdown adds up to total_bytes',
    { timeout: 60_000 },
    async () => {
      const { stdout } = await cli('-m', 'synth:gemma4-e2b?wtype=q4_k', '--ctx', '4096', '--json');
      const r = JSON.parse(stdout);
      assert.equal(r.arch, 'gemma4');
      assert.equal(r.total_bytes, r.full.bytes + r.sliding.bytes);
      assert.deepEqual([r.full.layers, r.sliding.layers, r.kv_shared.layers, r.kv_shared.bytes], [3, 12, 20, 0]);
      assert.equal(r.sliding.cells_per_seq, 1024); // window 512 + ubatch 512
      assert.equal(r.full.cells_per_seq, 4096);
      assert.equal(r.n_ctx, 4096);
    },
  );

  test('a missing file fails with its name, exit code 1', { timeout: 60_000 }, async () => {
    await assert.rejects(cli('-m', 'no/such.gguf', '--ctx', '4096'), (err: { code?: number; stderr?: string }) => {
      assert.equal(err.code, 1);
      assert.match(err.stderr ?? '', /model file not found: .*no\/such\.gguf/);
      return true;
    });
  });
});
