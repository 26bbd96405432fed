// tools/device/kernel-summary.py over nsys's SQLite export: kernels summed by name and by kind, and `--last-of N`
// keeping the last N-th in launch order (the last of N equal ubatches). The export is built here with python3's sqlite3.
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
