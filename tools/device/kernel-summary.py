#!/usr/bin/env python3
# Summarizes kernel times by kind (quantized matmul, attention, ...) and the top kernels: an ncu --csv dump, an nsys
# cuda_gpu_kern_sum, a file of sections headed "## NAME" holding either, each of one prefill, or nsys's SQLite
# export, of which `--last-of N` keeps the last N-th of the kernels in launch order (the last of N equal ubatches).
import csv, io, re, sys
from collections import defaultdict
from nsys_kernels import kernel_rows, kind
def from_sqlite(path, last_of):
    """One section: ms and launches per kernel name from nsys's export, the last `last_of`-th of them."""
    rows = kernel_rows(path)
    rows = rows[len(rows) - len(rows) // last_of:]
    per = defaultdict(float); cnt = defaultdict(int)
    for start, end, _, name in rows: per[name[:90]] += (end - start) / 1e6; cnt[name[:90]] += 1
    yield f'{path} (last 1/{last_of}: {len(rows)} kernels)', per, cnt
def from_csv(path):
    """One section per "## NAME" (or the whole file): ms and launches per kernel name from ncu's or nsys's CSV."""
    text = open(path).read()
    for sec in re.split(r'^## ', text, flags=re.M)[1:] or [f'{path}\n{text}']:
        tag, body = sec.split('\n', 1)
        lines = [l for l in body.splitlines() if l[:1] == '"' or l[:1].isdigit() or l.startswith('Time') or l.startswith('ID')]
        rows = list(csv.reader(io.StringIO('\n'.join(lines))))
        per = defaultdict(float); cnt = defaultdict(int)
        if not rows: yield tag, per, cnt; continue
        hdr = rows[0]
        if 'Metric Value' in hdr:
            ni, vi, ui = hdr.index('Kernel Name'), hdr.index('Metric Value'), hdr.index('Metric Unit')
            for r in rows[1:]:
                if len(r) <= vi: continue
                v = float(r[vi].replace(',', '')); u = r[ui]
                ms = v / 1e6 if u == 'nsecond' else v / 1e3 if u == 'usecond' else v if u == 'msecond' else v / 1e6
                per[r[ni][:90]] += ms; cnt[r[ni][:90]] += 1
        else:
            ni, ti, ci = hdr.index('Name'), hdr.index('Total Time (ns)'), hdr.index('Instances')
            for r in rows[1:]:
                per[r[ni][:90]] += float(r[ti]) / 1e6; cnt[r[ni][:90]] += int(r[ci])
        yield tag, per, cnt
args = sys.argv[1:]
last_of = int(args[args.index('--last-of') + 1]) if '--last-of' in args else 1
with open(args[0], 'rb') as f: is_sqlite = f.read(16) == b'SQLite format 3\x00'
for tag, per, cnt in from_sqlite(args[0], last_of) if is_sqlite else from_csv(args[0]):
    if not per: print(tag, 'no rows'); continue
    total = sum(per.values())
    bykind = defaultdict(float)
    for k, v in per.items(): bykind[kind(k)] += v
    print(f'== {tag}: {total:.2f} ms of kernels')
    for k, v in sorted(bykind.items(), key=lambda x: -x[1]): print(f'   {k:24s} {v:8.2f} ms {100*v/total:5.1f} %')
    for k, v in sorted(per.items(), key=lambda x: -x[1])[:15]: print(f'   {v:8.3f} ms x{cnt[k]:<5d} {k}')
