#!/usr/bin/env python3
# Where a prefill's time on the GPU goes, from an nsys report's SQLite export (nsys export --type=sqlite): per
# prefill its span (first kernel's start to last kernel's end), its kernels by name, the GPU's idle gaps, the CUDA
# calls the host made meanwhile, and the copies.
#   python3 tools/device/prefill-gaps.py REPORT.sqlite [--split-ms 3]
# Prefills are told apart by gaps longer than --split-ms between kernels (llama-bench's repeats).
import argparse, json, sqlite3
from collections import defaultdict

ap = argparse.ArgumentParser()
ap.add_argument('db')
ap.add_argument('--split-ms', type=float, default=3.0)
ap.add_argument('--gap-us', type=float, default=20.0, help='idle gaps at least this long are listed by cause')
args = ap.parse_args()
db = sqlite3.connect(args.db)
names = dict(db.execute('SELECT id, value FROM StringIds'))
tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
kernels = db.execute('SELECT start, end, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start').fetchall()
api = db.execute('SELECT start, end, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start').fetchall()
copies = db.execute('SELECT start, end, bytes, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY start').fetchall() \
    if 'CUPTI_ACTIVITY_KIND_MEMCPY' in tables else []

# Prefills: runs of kernels without a gap longer than split-ms.
runs, cur = [], [kernels[0]]
for k in kernels[1:]:
    if k[0] - cur[-1][1] > args.split_ms * 1e6:
        runs.append(cur)
        cur = []
    cur.append(k)
runs.append(cur)

out = []
for i, run in enumerate(runs):
    t0, t1 = run[0][0], max(k[1] for k in run)
    busy, gaps, last = 0, [], t0
    for k in run:
        if k[0] > last:
            gaps.append((k[0] - last, last, k[0], k[2]))
        busy += k[1] - k[0]
        last = max(last, k[1])
    # The host's CUDA calls within the prefill, and within its gaps of gap-us or more.
    calls, in_gaps = defaultdict(lambda: [0, 0.0]), defaultdict(float)
    long_gaps = [g for g in gaps if g[0] >= args.gap_us * 1e3]
    for a0, a1, n in api:
        if a1 < t0 or a0 > t1:
            continue
        c = calls[names.get(n, str(n)).split('_v')[0]]
        c[0] += 1
        c[1] += (a1 - a0) / 1e6
        for g, g0, g1, _ in long_gaps:
            lo, hi = max(a0, g0), min(a1, g1)
            if hi > lo:
                in_gaps[names.get(n, str(n)).split('_v')[0]] += (hi - lo) / 1e6
    cp = [(b, kind, (c1 - c0) / 1e6) for c0, c1, b, kind in copies if c0 >= t0 and c1 <= t1]
    by_name = defaultdict(float)
    for k0, k1, n in run:
        by_name[names.get(n, str(n))[:70]] += (k1 - k0) / 1e6
    after = defaultdict(lambda: [0, 0.0])  # the kernel that ends each long gap: what the GPU waited to start
    for g, _, _, n in long_gaps:
        a = after[names.get(n, str(n))[:60]]
        a[0] += 1
        a[1] += g / 1e6
    out.append({
        'prefill': i,
        'span_ms': round((t1 - t0) / 1e6, 3),
        'kernel_ms': round(busy / 1e6, 3),
        'kernels': len(run),
        'top_kernels_ms': {k: round(v, 3) for k, v in sorted(by_name.items(), key=lambda x: -x[1])[:12]},
        'gap_ms': round(sum(g[0] for g in gaps) / 1e6, 3),
        'gaps': len(gaps),
        'long_gap_ms': round(sum(g[0] for g in long_gaps) / 1e6, 3),
        'long_gaps': len(long_gaps),
        'calls': {k: [v[0], round(v[1], 3)] for k, v in sorted(calls.items(), key=lambda x: -x[1][1])[:10]},
        'calls_in_long_gaps_ms': {k: round(v, 3) for k, v in sorted(in_gaps.items(), key=lambda x: -x[1])[:8]},
        'long_gaps_before': {k: [v[0], round(v[1], 3)] for k, v in sorted(after.items(), key=lambda x: -x[1][1])[:8]},
        'copies': {'count': len(cp), 'bytes': sum(c[0] for c in cp), 'ms': round(sum(c[2] for c in cp), 3)},
    })
print(json.dumps(out, indent=1))
