#!/usr/bin/env python3
# nsys's trace of llama-bench's decode steps (`decode_kernels` in setup.sh), exported to SQLite: the steps are runs of
# kernels apart by more than 200 us. Per step of the last six: its kernels, GPU span and summed kernel time; then the
# host's time between steps. Kernel times overlap under programmatic dependent launch, so their sum may pass the span.
#   python3 tools/device/decode-steps.py trace.sqlite
import json, sqlite3, sys

rows = sqlite3.connect(sys.argv[1]).execute('select start, end from CUPTI_ACTIVITY_KIND_KERNEL order by start').fetchall()
steps, cur = [], [rows[0]]
for r in rows[1:]:
    if r[0] - cur[-1][1] > 200_000:
        steps.append(cur)
        cur = [r]
    else:
        cur.append(r)
steps.append(cur)
out = {'kernels': len(rows), 'steps': len(steps), 'last': []}
for s in steps[-6:]:
    out['last'].append({'kernels': len(s), 'span_ms': round((s[-1][1] - s[0][0]) / 1e6, 3),
                        'kernel_ms': round(sum(e - b for b, e in s) / 1e6, 3)})
out['between_steps_ms'] = [round((steps[i + 1][0][0] - steps[i][-1][1]) / 1e6, 3) for i in range(len(steps) - 7, len(steps) - 1) if i >= 0]
print(json.dumps(out))
