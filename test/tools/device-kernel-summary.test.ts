// The device scripts over nsys's SQLite export: kernel-summary.py's kernels summed by name and by kind, and `--last-of
// N` keeping the last N-th in launch order (the last of N equal ubatches); decode-steps.py's steps of such a trace, by
// kind; gpu-busy.py's busy shares of a whole run. The exports are built here with python3's sqlite3.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../support/fixtures.ts';

/** A Python body that fills `kernels` with (start ns, end ns, stream, name): the export nsys writes, those columns. */
const exportOf = (body: string) => `
import sqlite3, sys
kernels = []
${body}
db = sqlite3.connect(sys.argv[1])
db.execute('create table StringIds (id integer primary key, value text)')
db.execute('create table CUPTI_ACTIVITY_KIND_KERNEL (start integer, end integer, streamId integer, demangledName integer)')
names = sorted({k[3] for k in kernels})
for i, n in enumerate(names): db.execute('insert into StringIds values (?, ?)', (i, n))
for s, e, sid, n in kernels: db.execute('insert into CUPTI_ACTIVITY_KIND_KERNEL values (?, ?, ?, ?)', (s, e, sid, names.index(n)))
db.commit()
`;

/** The output of tools/device/`tool` with `args` over an export built from `body`. */
function runOn(body: string, tool: string, args: string[] = []): string {
  const dir = mkdtempSync(join(tmpdir(), 'percept-nsys-'));
  try {
    const db = join(dir, 'trace.sqlite');
    execFileSync('python3', ['-c', exportOf(body), db]);
    return execFileSync('python3', [join(REPO_ROOT, 'tools', 'device', tool), db, ...args], { encoding: 'utf8' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Three ubatches of the same four kernels; ubatch b's kernel i runs (i + 1) × (b + 1) µs. */
const ubatches = `
names = ['void flash_attn_ext_f16<256, 256>()', 'sm90_xmma_gemm_f16f16', 'rms_norm_f32', 'convert_unary_cont_vec4']
t = 0
for b in range(3):
    for i in range(4):
        d = (i + 1) * (b + 1) * 1000
        kernels.append((t, t + d, 7, names[i]))
        t += d + 10
`;

test('kernel-summary.py reads an nsys SQLite export: all of it, or the last of three ubatches', () => {
  const all = runOn(ubatches, 'kernel-summary.py');
  assert.match(all, /12 kernels\): 0\.06 ms of kernels/, all);
  const last = runOn(ubatches, 'kernel-summary.py', ['--last-of', '3']);
  assert.match(last, /4 kernels\): 0\.03 ms of kernels/, last);
  assert.match(last, /copy\/convert\s+0\.01 ms\s+40\.0 %/, last);
  assert.match(last, /attention\s+0\.00 ms\s+10\.0 %/, last);
  assert.match(last, /0\.012 ms x1\s+convert_unary_cont_vec4/, last);
});

/** Eight decode steps 1 ms apart, each a matvec of 3 µs then attention of 1 µs; step s's matvec starts at s ms. */
const steps = `
for s in range(8):
    t = s * 1_000_000
    kernels.append((t, t + 3000, 7, 'void mul_mat_vec_q<2>()'))
    kernels.append((t + 3100, t + 4100, 7, 'void flash_attn_ext_vec<256>()'))
`;

test('decode-steps.py splits a trace into steps at idle gaps and sums the last six by kind, in ms a step', () => {
  const out = JSON.parse(runOn(steps, 'decode-steps.py')) as {
    steps: number;
    last: { kernels: number; span_ms: number; kernel_ms: number }[];
    between_steps_ms: number[];
    kind_ms_per_step: Record<string, number>;
    top_ms_per_step: Record<string, number>;
  };
  assert.equal(out.steps, 8);
  assert.deepEqual(out.last, Array(6).fill({ kernels: 2, span_ms: 0.004, kernel_ms: 0.004 }));
  assert.deepEqual(out.between_steps_ms, Array(6).fill(0.996));
  assert.deepEqual(out.kind_ms_per_step, { matvec: 0.003, attention: 0.001 });
  assert.equal(out.top_ms_per_step['void flash_attn_ext_vec<256>()'], 0.001);
});

/** Two streams: 7 runs 0–600 ms, 9 runs 400–800 ms and 1500–1600 ms. */
const twoStreams = `
for s, e, sid, name in [(0, 600, 7, 'void mul_mat_q<12>()'), (400, 800, 9, 'void attend<64, 8>()'), (1500, 1600, 9, 'void attend<64, 8>()')]:
    kernels.append((s * 1_000_000, e * 1_000_000, sid, name))
`;

test('gpu-busy.py gives the share of each bin some kernel ran, overall (overlaps once) and per stream', () => {
  const out = JSON.parse(runOn(twoStreams, 'gpu-busy.py', ['--bin', '500'])) as {
    span_ms: number;
    streams: Record<string, { kernels: number; busy_ms: number; top_kernel: string }>;
    bins: Record<string, number>[];
  };
  assert.equal(out.span_ms, 1600);
  assert.deepEqual(out.streams['7'], { kernels: 1, busy_ms: 600, top_kernel: 'void mul_mat_q<12>()' });
  assert.deepEqual(out.streams['9'], { kernels: 2, busy_ms: 500, top_kernel: 'void attend<64, 8>()' });
  assert.deepEqual(
    out.bins.map((b) => [b.busy, b['7'], b['9']]),
    [
      [1, 1, 0.2],
      [0.6, 0.2, 0.6],
      [0, 0, 0],
      [0.2, 0, 0.2],
    ],
  );
});
