// tools/device/kernel-summary.py over nsys's SQLite export: kernels summed by name and by kind, and `--last-of N`
// keeping the last N-th in launch order (the last of N equal ubatches); decode-steps.py's steps of such a trace, by kind.
// gpu-busy.py's busy shares of a whole run. The exports are built here with python3's sqlite3.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../support/fixtures.ts';

const script = join(REPO_ROOT, 'tools', 'device', 'kernel-summary.py');

/** Three ubatches of the same four kernels; ubatch b's kernel i runs (i + 1) × (b + 1) µs. */
const makeExport = `
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute('create table StringIds (id integer primary key, value text)')
db.execute('create table CUPTI_ACTIVITY_KIND_KERNEL (start integer, end integer, demangledName integer, shortName integer)')
names = ['void flash_attn_ext_f16<256, 256>()', 'sm90_xmma_gemm_f16f16', 'rms_norm_f32', 'convert_unary_cont_vec4']
for i, n in enumerate(names): db.execute('insert into StringIds values (?, ?)', (i, n))
t = 0
for b in range(3):
    for i in range(4):
        d = (i + 1) * (b + 1) * 1000
        db.execute('insert into CUPTI_ACTIVITY_KIND_KERNEL values (?, ?, ?, ?)', (t, t + d, i, i))
        t += d + 10
db.commit()
`;

test('kernel-summary.py reads an nsys SQLite export: all of it, or the last of three ubatches', () => {
  const dir = mkdtempSync(join(tmpdir(), 'percept-kernels-'));
  try {
    const db = join(dir, 'trace.sqlite');
    execFileSync('python3', ['-c', makeExport, db]);
    const all = execFileSync('python3', [script, db], { encoding: 'utf8' });
    assert.match(all, /12 kernels\): 0\.06 ms of kernels/, all);
    const last = execFileSync('python3', [script, db, '--last-of', '3'], { encoding: 'utf8' });
    assert.match(last, /4 kernels\): 0\.03 ms of kernels/, last);
    assert.match(last, /copy\/convert\s+0\.01 ms\s+40\.0 %/, last);
    assert.match(last, /attention\s+0\.00 ms\s+10\.0 %/, last);
    assert.match(last, /0\.012 ms x1\s+convert_unary_cont_vec4/, last);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Eight decode steps 1 ms apart, each a matvec of 3 µs then attention of 1 µs; step s's matvec starts at s ms. */
const makeSteps = `
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute('create table StringIds (id integer primary key, value text)')
db.execute('create table CUPTI_ACTIVITY_KIND_KERNEL (start integer, end integer, demangledName integer, shortName integer)')
db.execute("insert into StringIds values (0, 'void mul_mat_vec_q<2>()'), (1, 'void flash_attn_ext_vec<256>()')")
for s in range(8):
    t = s * 1_000_000
    db.execute('insert into CUPTI_ACTIVITY_KIND_KERNEL values (?, ?, 0, 0)', (t, t + 3000))
    db.execute('insert into CUPTI_ACTIVITY_KIND_KERNEL values (?, ?, 1, 1)', (t + 3100, t + 4100))
db.commit()
`;

test('decode-steps.py splits a trace into steps at idle gaps and sums the last six by kind, in ms a step', () => {
  const dir = mkdtempSync(join(tmpdir(), 'percept-steps-'));
  try {
    const db = join(dir, 'trace.sqlite');
    execFileSync('python3', ['-c', makeSteps, db]);
    const out = JSON.parse(execFileSync('python3', [join(REPO_ROOT, 'tools', 'device', 'decode-steps.py'), db], { encoding: 'utf8' })) as {
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
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Two streams: 7 runs 0–600 ms, 9 runs 400–800 ms and 1500–1600 ms. */
const makeRun = `
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute('create table StringIds (id integer primary key, value text)')
db.execute('create table CUPTI_ACTIVITY_KIND_KERNEL (start integer, end integer, streamId integer, demangledName integer)')
db.execute("insert into StringIds values (0, 'void mul_mat_q<12>()'), (1, 'void attend<64, 8>()')")
for s, e, sid, name in [(0, 600, 7, 0), (400, 800, 9, 1), (1500, 1600, 9, 1)]:
    db.execute('insert into CUPTI_ACTIVITY_KIND_KERNEL values (?, ?, ?, ?)', (s * 1_000_000, e * 1_000_000, sid, name))
db.commit()
`;

test('gpu-busy.py gives the share of each bin some kernel ran, overall (overlaps once) and per stream', () => {
  const dir = mkdtempSync(join(tmpdir(), 'percept-busy-'));
  try {
    const db = join(dir, 'trace.sqlite');
    execFileSync('python3', ['-c', makeRun, db]);
    const out = JSON.parse(
      execFileSync('python3', [join(REPO_ROOT, 'tools', 'device', 'gpu-busy.py'), db, '--bin', '500'], { encoding: 'utf8' }),
    ) as {
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
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
