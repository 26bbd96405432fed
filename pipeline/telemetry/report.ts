// The run summary for humans and files: formatSummary() for text, writeJsonSummary() for --json-summary.
// The LiveTable redraws the latest stats in place on a TTY.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { Observable, Subscription } from 'rxjs';
import type { FinalRunSummary, LatencyStats, RunSummary, TelemetryEvent } from './events.ts';

const fmtMs = (ms: number | null): string => (ms === null ? '-' : ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2));
const fmtCounts = (counts: Readonly<Record<string, number | undefined>> | undefined): string => {
  const parts = Object.entries(counts ?? {}).map(([k, n]) => `${k} ${n}`);
  return parts.length === 0 ? '-' : parts.join(', ');
};

function table(rows: readonly (readonly string[])[]): string[] {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  return rows.map((r) =>
    r
      .map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!)))
      .join('  ')
      .trimEnd(),
  );
}

/** The per-stage table both the live view and the summary print. */
function formatStageTable(summary: RunSummary): string[] {
  const rows: string[][] = [['stage', 'runs', 'p50 ms', 'p95 ms', 'p99 ms', 'max ms', 'drops', 'cancels', 'errors']];
  const add = (name: string, s: LatencyStats | undefined): void => {
    rows.push([
      name,
      String(s?.count ?? 0),
      fmtMs(s?.p50Ms ?? null),
      fmtMs(s?.p95Ms ?? null),
      fmtMs(s?.p99Ms ?? null),
      fmtMs(s?.maxMs ?? null),
      fmtCounts(summary.drops.byStage[name]),
      fmtCounts(summary.cancels[name]),
      String(summary.errors[name] ?? 0),
    ]);
  };
  if (summary.drops.byStage.source || summary.errors.source) add('source', undefined);
  for (const [name, stats] of Object.entries(summary.stages)) add(name, stats);
  add('end-to-end', summary.endToEnd);
  return table(rows);
}

/** Per camera, for a run of several: frames, drops, misses, level and latency. */
function formatCameraTable(summary: RunSummary): string[] {
  if (!summary.cameras) return [];
  const rows: string[][] = [['camera', 'in', 'out', 'dropped', 'late', 'misses', 'level', 'p50 ms', 'p99 ms', 'max ms']];
  for (const [id, s] of Object.entries(summary.cameras)) {
    rows.push([
      id,
      String(s.frames.in),
      String(s.frames.out),
      s.frames.dropped === 0 ? '0' : `${s.frames.dropped} (${fmtCounts(s.drops.byReason)})`,
      String(s.frames.late),
      String(s.deadlineMisses),
      String(s.degrade.level),
      fmtMs(s.endToEnd.p50Ms),
      fmtMs(s.endToEnd.p99Ms),
      fmtMs(s.endToEnd.maxMs),
    ]);
  }
  return table(rows);
}

function formatHeadline(summary: RunSummary): string {
  const f = summary.frames;
  return (
    `frames in ${f.in}  out ${f.out}  dropped ${f.dropped} (${fmtCounts(summary.drops.byReason)})` +
    `  in flight ${f.inFlight}  late ${f.late}  level ${summary.degrade.level}` +
    `  [${summary.clock} ${fmtMs(summary.durationMs)} ms]`
  );
}

/** Drop causes shown in the text summary (the JSON summary has them all). */
const SHOWN_CAUSES = 10;

/** The source's incidents with their details, and the drops by cause, most frequent first. */
function formatAccounts(summary: RunSummary): string[] {
  const lines: string[] = [];
  const { counts, details } = summary.source;
  const incidents = Object.values(counts).reduce((sum, n) => sum + (n ?? 0), 0);
  if (incidents > 0) {
    lines.push(`source incidents: ${fmtCounts(counts)}`);
    for (const detail of details) lines.push(`  ${detail}`);
    if (incidents > details.length) lines.push(`  … ${incidents - details.length} more in the events stream`);
  }
  const causes = Object.entries(summary.drops.causes);
  if (causes.length > 0) {
    lines.push('drops by cause:');
    const width = String(causes[0]![1]).length;
    for (const [cause, n] of causes.slice(0, SHOWN_CAUSES)) lines.push(`  ${String(n).padStart(width)}  ${cause}`);
    if (causes.length > SHOWN_CAUSES) lines.push(`  … ${causes.length - SHOWN_CAUSES} more causes in the JSON summary`);
  }
  return lines;
}

/** The end-of-run summary as text. */
export function formatSummary(summary: FinalRunSummary): string {
  const lines = [
    `percept run ${summary.endReason === 'stopped' ? `stopped (${summary.stopReason ?? 'stop'})` : (summary.endReason ?? 'running')}`,
    formatHeadline(summary),
    `deadline misses ${summary.deadlineMisses}  degrade steps down ${summary.degrade.down} up ${summary.degrade.up} (max level ${summary.degrade.maxLevel})`,
    ...formatAccounts(summary),
    ...formatStageTable(summary),
    ...formatCameraTable(summary),
    ...formatRecorder(summary),
  ];
  return lines.join('\n') + '\n';
}

/** The recording's line, when the run had one. */
function formatRecorder(summary: FinalRunSummary): string[] {
  const r = summary.recorder;
  if (!r) return [];
  if (r.ok) return [`recording: ${r.bytesWritten} bytes written`];
  const at = r.failedAtMs === null ? '' : ` at ${r.failedAtMs.toFixed(0)} ms`;
  return [
    `recording FAILED${at} (${r.onError === 'stop' ? 'run stopped' : 'run continued unrecorded'}): ${r.bytesWritten} bytes written, ${r.bytesLost} lost`,
    `  ${r.error ?? ''}`,
  ];
}

/** Writes the summary as pretty JSON (creating the folder), for `--json-summary FILE`. */
export function writeJsonSummary(path: string, summary: RunSummary): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, JSON.stringify(summary, null, 2) + '\n');
}

export interface LiveTableOptions {
  readonly stream?: NodeJS.WriteStream;
  /** auto: only when `stream` is a TTY; on: always; off: never. */
  readonly mode?: 'auto' | 'on' | 'off';
  /** Real-time redraw period (ms). */
  readonly intervalMs?: number;
}

/** Shows the latest stats snapshot as a table redrawn in place, at most once per interval of real time.
 * A virtual-clock replay may emit stats far faster. Draws nothing when disabled. */
export class LiveTable {
  readonly #stream: NodeJS.WriteStream;
  readonly #enabled: boolean;
  readonly #intervalMs: number;
  #latest: RunSummary | undefined;
  #dirty = false;
  #linesDrawn = 0;
  #timer: NodeJS.Timeout | undefined;
  #subscription: Subscription | undefined;

  constructor({ stream = process.stdout, mode = 'auto', intervalMs = 1000 }: LiveTableOptions = {}) {
    if (!(Number.isFinite(intervalMs) && intervalMs > 0))
      throw new RangeError(`LiveTable: expected intervalMs > 0 but received ${intervalMs}`);
    this.#stream = stream;
    this.#enabled = mode === 'on' || (mode === 'auto' && stream.isTTY === true);
    this.#intervalMs = intervalMs;
  }

  get enabled(): boolean {
    return this.#enabled;
  }

  /** Starts following `events`; a no-op when the table is disabled. */
  attach(events: Observable<TelemetryEvent>): this {
    if (!this.#enabled || this.#subscription) return this;
    this.#subscription = events.subscribe({
      next: (event) => {
        if (event.type !== 'stats') return;
        this.#latest = event.summary;
        this.#dirty = true;
      },
      complete: () => this.detach(),
    });
    this.#timer = setInterval(() => this.#draw(), this.#intervalMs);
    this.#timer.unref();
    return this;
  }

  /** Stops redrawing and erases the table, so the final summary prints where it stood. */
  detach(): void {
    this.#subscription?.unsubscribe();
    this.#subscription = undefined;
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
    if (this.#linesDrawn > 0) this.#stream.write(`\x1b[${this.#linesDrawn}F\x1b[0J`);
    this.#linesDrawn = 0;
  }

  #draw(): void {
    if (!this.#dirty || !this.#latest) return;
    this.#dirty = false;
    const lines = [formatHeadline(this.#latest), ...formatStageTable(this.#latest), ...formatCameraTable(this.#latest)];
    const up = this.#linesDrawn > 0 ? `\x1b[${this.#linesDrawn}F` : '';
    this.#stream.write(up + lines.map((l) => `\x1b[2K${l}\n`).join('') + '\x1b[0J');
    this.#linesDrawn = lines.length;
  }
}
