// `percept bench ladder` as a user runs it, on the tiny presets: every rung is made and measured, the table
// has every column, the F16 reference agrees with itself, the printed table is the JSON, and a corrupted
// rung is a failed row with its reason while the others are still measured. Behaviour only: no speed is
// asserted (benchmarks are for that).
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { formatLadderTable, type LadderResult, type LadderRow } from '../../../app/bench/ladder.ts';
import { makeSampleBag } from '../../../tools/make-sample-bag.ts';
import { REPO_ROOT } from '../../support/fixtures.ts';

const run = promisify(execFile);
const DIR = join(REPO_ROOT, '.cache', 'test-ladder');
const RUNGS = join(DIR, 'rungs');
const MiB = 1024 * 1024;
const FRAMES = 3;

/** The CLI as a child process: its exit code, stdout and stderr. */
async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, ['--import', 'tsx', 'app/cli.ts', 'bench', 'ladder', ...args], {
      cwd: REPO_ROOT,
      timeout: 540_000,
      maxBuffer: 16 << 20,
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    if (typeof e.code !== 'number') throw err;
    return { code: e.code, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

/** A printed table back into rows of cells keyed by header (cells are separated by two spaces or more). */
function parseTable(text: string): Record<string, string>[] {
  const lines = text.split('\n\n')[0]!.split('\n');
  const headers = lines[0]!.split(/\s{2,}/);
  return lines.slice(1).map((line) => {
    const cells = line.split(/\s{2,}/);
    // The status (last) may hold a reason; everything after the other columns is its text.
    const row = cells.slice(0, headers.length - 1).concat(cells.slice(headers.length - 1).join('  '));
    return Object.fromEntries(headers.map((h, i) => [h, row[i] ?? '']));
  });
}

/** What each column must print for a row: the JSON's value in the column's unit and precision. */
function expectedCells(result: LadderResult, r: LadderRow): Record<string, string> {
  const f = (x: number | null | undefined, d: number) => (x === null || x === undefined ? 'n/a' : x.toFixed(d));
  return {
    rung: r.rung,
    quantizer: r.quantizer ?? 'n/a',
    'size MiB': f(r.file_bytes === null ? null : r.file_bytes / MiB, 1),
    'decode tok/s': f(r.decode_tok_s, 1),
    'prefill tok/s': f(r.prefill_tok_s, 1),
    'TTFT ms': f(r.ttft_ms, 1),
    ...Object.fromEntries(result.kv.ctx.map((c) => [`KV@${c} MiB`, f(r.kv_bytes ? r.kv_bytes[String(c)]! / MiB : null, 1)])),
    'agree prefix': f(r.agreement?.prefix, 3),
    'agree top-1': f(r.agreement?.top1, 3),
    'roofline %': f(r.roofline?.fraction === null || r.roofline === null ? null : r.roofline.fraction * 100, 1),
    ...(result.bag
      ? {
          'frames out/in': r.bag ? `${r.bag.frames_out}/${r.bag.frames_in}` : 'n/a',
          'e2e p99 ms': f(r.bag?.e2e_p99_ms, 1),
          'J/frame': f(r.energy.bag?.joules_per_frame, 3),
        }
      : {}),
    'tok/s/W': f(r.energy.decode?.tok_per_watt, 2),
    status: r.status === 'ok' ? 'ok' : `FAILED: ${r.error?.replace(/\s*\n\s*/g, ' ')}`,
  };
}

describe('percept bench ladder on gemma4-tiny (F16 → Q8_0 → Q4_K_M → + draft)', () => {
  let ladder: { code: number; result: LadderResult; stderr: string };

  before(async () => {
    await rm(DIR, { recursive: true, force: true });
    await mkdir(DIR, { recursive: true });
    const bag = await makeSampleBag(join(DIR, 'bag.mcap'), { frames: FRAMES, hz: 2 });
    // Generous budgets, a queue edge and no degradation: every frame reaches the decoder, whatever the box.
    const config = {
      source: { kind: 'pattern', fps: 2, frames: FRAMES, width: 320, height: 240 },
      encoder: { kind: 'projection' },
      decoder: { model: 'synth:gemma4-tiny', nCtx: 1024 },
      budgets: {
        endToEndMs: 120_000,
        stages: { preprocess: 30_000, encode: 30_000, decode: 60_000, actions: 10_000 },
        dropPredictedMiss: false,
      },
      edges: { default: { policy: 'queue', capacity: FRAMES } },
      ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 128, draft: true, frameSkip: 0 }, rungs: [] },
      telemetry: { liveTable: 'off' },
    };
    await writeFile(join(DIR, 'config.json'), JSON.stringify(config));
    const r = await cli([
      '-m',
      'synth:gemma4-tiny',
      '--draft',
      'synth:gemma4-tiny-draft',
      '--quantizer',
      'percept',
      '--out-dir',
      RUNGS,
      '--bag',
      bag.path,
      '-c',
      join(DIR, 'config.json'),
      '--reps',
      '1',
      '--prompt-tokens',
      '8',
      '--gen-tokens',
      '8',
      '--agreement-tokens',
      '6',
      '--kv-ctx',
      '1024,8192',
      '--bandwidth-gbs',
      '20',
      '--energy',
      'off',
      '--json',
    ]);
    assert.equal(r.code, 0, `bench ladder failed:\n${r.stdout}\n${r.stderr}`);
    ladder = { code: r.code, result: JSON.parse(r.stdout) as LadderResult, stderr: r.stderr };
  });

  test('every rung is made and measured, with every column', async () => {
    const { result } = ladder;
    assert.deepEqual(
      result.rungs.map((r) => [r.rung, r.quantizer, r.speculation]),
      [
        ['F16', 'reference', null],
        ['Q8_0', 'percept', null],
        ['Q4_K_M', 'percept', null],
        ['Q4_K_M + draft', 'percept', 'draft-simple'],
      ],
    );
    assert.equal(result.failed, 0);
    assert.deepEqual(result.kv.ctx, [1024, 8192]);
    for (const r of result.rungs) {
      assert.equal(r.status, 'ok', `${r.rung}: ${r.error}`);
      assert.equal((await readFile(r.file!)).length, r.file_bytes, `${r.rung}: the file is there, as big as reported`);
      for (const v of [
        r.decode_tok_s,
        r.prefill_tok_s,
        r.ttft_ms,
        r.roofline?.bytes_per_token,
        r.roofline?.ceiling_tok_s,
        r.roofline?.fraction,
      ]) {
        assert.ok(typeof v === 'number' && v > 0, `${r.rung}: ${JSON.stringify(r)}`);
      }
      assert.deepEqual(Object.keys(r.kv_bytes!), ['1024', '8192']);
      assert.ok(r.kv_bytes!['8192']! > r.kv_bytes!['1024']!, `${r.rung}: KV grows with the context`);
      assert.ok(
        r.agreement!.prefix >= 0 && r.agreement!.prefix <= r.agreement!.top1 && r.agreement!.top1 <= 1,
        `${r.rung}: ${JSON.stringify(r.agreement)}`,
      );
      // The bag: every frame accounted for, and the only drops are actions the schema refused.
      const bag = r.bag!;
      assert.equal(bag.frames_in, FRAMES);
      assert.equal(bag.frames_in, bag.frames_out + bag.dropped, `${r.rung}: ${JSON.stringify(bag)}`);
      assert.deepEqual(
        Object.keys(bag.dropped_by_reason).filter((k) => k !== 'invalid'),
        [],
        `${r.rung}: ${JSON.stringify(bag)}`,
      );
      assert.equal(bag.e2e_p99_ms === null, bag.frames_out === 0);
      // Energy: asked off, so "not available" with the reason, and no number.
      for (const e of [r.energy.decode!, r.energy.bag!]) {
        assert.equal(e.available, false);
        assert.match(e.reason!, /off/);
        assert.equal(e.joules, null);
      }
    }
    assert.ok(
      result.rungs.some((r) => r.bag!.frames_out > 0),
      'an action came out of the bag on some rung',
    );
    const [f16, q8, q4, spec] = result.rungs;
    assert.ok(f16!.file_bytes! > q8!.file_bytes! && q8!.file_bytes! > q4!.file_bytes!, 'each rung is smaller');
    assert.ok(
      f16!.roofline!.bytes_per_token > q8!.roofline!.bytes_per_token && q8!.roofline!.bytes_per_token > q4!.roofline!.bytes_per_token,
    );
    assert.equal(spec!.file, q4!.file, 'the speculative rung runs the last quantized file');
    assert.ok(spec!.kv_bytes!['8192']! > q4!.kv_bytes!['8192']!, "the draft's own cache is counted");
    assert.match(ladder.stderr, /ladder \[/, 'a progress bar on stderr');
  });

  test('the F16 reference, measured again on a fresh load, agrees with itself exactly', () => {
    assert.deepEqual(ladder.result.rungs[0]!.agreement, { prefix: 1, top1: 1 });
  });

  test('the printed table is the JSON: every cell of every row', () => {
    const { result } = ladder;
    const rows = parseTable(formatLadderTable(result));
    assert.equal(rows.length, result.rungs.length);
    result.rungs.forEach((r, i) => assert.deepEqual(rows[i], expectedCells(result, r)));
  });

  test('corrupted rungs are failed rows with their reason; the others are measured; the exit code is 1', async () => {
    const q8 = ladder.result.rungs[1]!.file!;
    const bytes = await readFile(q8);
    const truncated = join(DIR, 'truncated.gguf');
    await writeFile(truncated, bytes.subarray(0, bytes.length - 1000));
    // A header that parses but names a tensor llama.cpp does not know: only loading finds it.
    const renamed = join(DIR, 'renamed.gguf');
    const copy = Buffer.from(bytes);
    copy.write('output_nurm.weight', copy.indexOf('output_norm.weight'));
    await writeFile(renamed, copy);

    const r = await cli([
      '-m',
      'synth:gemma4-tiny',
      '--quants',
      `q8_0,${truncated},${renamed}`,
      '--quantizer',
      'percept',
      '--out-dir',
      RUNGS,
      '--reps',
      '1',
      '--prompt-tokens',
      '8',
      '--gen-tokens',
      '8',
      '--agreement-tokens',
      '6',
      '--kv-ctx',
      '1024,8192',
      '--energy',
      'off',
      '--no-progress',
    ]);
    assert.equal(r.code, 1, `${r.stdout}\n${r.stderr}`);
    assert.doesNotMatch(r.stderr, /ladder \[/, '--no-progress');
    const rows = parseTable(r.stdout);
    assert.deepEqual(
      rows.map((x) => x.rung),
      ['F16', 'Q8_0', 'truncated.gguf', 'Q8_0'],
    );
    assert.deepEqual(
      rows.map((x) => x.quantizer),
      ['reference', 'percept', 'given', 'given'],
    );
    const [f16, made, trunc, bad] = rows;
    assert.equal(f16!.status, 'ok');
    assert.equal(made!.status, 'ok');
    assert.match(trunc!.status, /^FAILED: .*truncated\.gguf: .*truncated file/);
    assert.match(bad!.status, /^FAILED: agreement: .*output_norm\.weight/);
    for (const row of [trunc!, bad!]) {
      for (const column of ['decode tok/s', 'agree prefix', 'agree top-1']) assert.equal(row[column], 'n/a', column);
    }
    // Deterministic columns of the rows measured in both runs agree with the first run's JSON.
    for (const [printed, json] of [
      [f16!, ladder.result.rungs[0]!],
      [made!, ladder.result.rungs[1]!],
    ] as const) {
      const want = expectedCells(ladder.result, json);
      for (const column of ['size MiB', 'KV@1024 MiB', 'KV@8192 MiB', 'agree prefix', 'agree top-1'])
        assert.equal(printed[column], want[column], `${json.rung} ${column}`);
    }
    assert.match(r.stdout, /roofline {3}n\/a: give --device or --bandwidth-gbs/);
  });
});
