// percept trace: a recording made by percept's recorder from a real graph run (fake stages on the virtual clock:
// spans, drops, cancels, degrade steps, errors) → a Chrome trace. The trace is checked against the format's rules
// (validateTrace below) and against the recorded events: every frame's spans are there with their durations.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { eventsToTrace, readRecordedEvents, traceRecording, type ChromeTrace, type TraceEvent } from '../../app/trace.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { createRecorder } from '../../nodes/recorder.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import type { SpanEvent, TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import { eventfulRun, runGraph } from '../support/pipeline-fakes.ts';

const root = new URL('../..', import.meta.url).pathname;
const dir = join(root, '.cache/test-trace');
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));

/** A run with a bit of everything (as the determinism test in test/pipeline/graph.test.ts), recorded as `percept run`
 * records one: every event but stats on /events, stats on /stats, log times in Unix ns. */
async function recordRun(path: string): Promise<TelemetryEvent[]> {
  const clock = new VirtualClock(0n, 1_700_000_000_000);
  const recorder = await createRecorder({ path, actionSchema: schema, flushAfterMs: null });
  const writes: Promise<void>[] = [];
  const result = await runGraph({
    clock,
    ...eventfulRun(),
    onEvent: (event) => {
      const atNs = clock.unixNs(event.atNs);
      writes.push(event.type === 'stats' ? recorder.recordStats(event.summary, atNs) : recorder.recordEvent(event, atNs));
    },
  });
  await Promise.all(writes);
  await recorder.close();
  return result.events;
}

/** The Chrome Trace Event format's rules for what percept writes; throws naming the first event that breaks one. */
function validateTrace(trace: ChromeTrace): void {
  assert.ok(Array.isArray(trace.traceEvents), 'traceEvents is an array');
  assert.ok(['ms', 'ns'].includes(trace.displayTimeUnit), 'displayTimeUnit is ms or ns');
  const processNames = new Set<number>();
  const threadNames = new Set<string>();
  const lastTs = new Map<string, number>();
  const open = new Map<string, number[]>(); // track → end times of the enclosing slices
  for (const [i, e] of trace.traceEvents.entries()) {
    const where = `event ${i} ${JSON.stringify(e)}`;
    assert.equal(typeof e.name, 'string', `${where}: name`);
    assert.ok(['X', 'i', 'M'].includes(e.ph), `${where}: ph`);
    assert.ok(Number.isInteger(e.pid) && e.pid > 0 && Number.isInteger(e.tid) && e.tid >= 0, `${where}: pid and tid`);
    assert.ok(Number.isFinite(e.ts) && e.ts >= 0, `${where}: ts`);
    const track = `${e.pid}/${e.tid}`;
    if (e.ph === 'M') {
      assert.ok(['process_name', 'thread_name', 'process_sort_index', 'thread_sort_index'].includes(e.name), `${where}: metadata name`);
      if (e.name === 'process_name') processNames.add(e.pid);
      if (e.name === 'thread_name') threadNames.add(track);
      const value = e.name.endsWith('_name') ? e.args?.name : e.args?.sort_index;
      assert.ok(e.name.endsWith('_name') ? typeof value === 'string' : Number.isInteger(value), `${where}: metadata args`);
      continue;
    }
    // Every slice and instant is on a named process; a thread's events on a named thread, in time order.
    assert.ok(processNames.has(e.pid), `${where}: its process is named first`);
    if (e.ph === 'X' || e.s === 't') assert.ok(threadNames.has(track), `${where}: its thread is named first`);
    assert.ok(e.ts >= (lastTs.get(track) ?? 0), `${where}: ts is monotonic on its track`);
    lastTs.set(track, e.ts);
    if (e.ph === 'X') {
      assert.ok(Number.isFinite(e.dur) && e.dur! >= 0, `${where}: dur`);
      // Slices of one thread nest: each ends before the one it starts in.
      const stack = open.get(track) ?? [];
      while (stack.length > 0 && stack.at(-1)! <= e.ts) stack.pop();
      if (stack.length > 0) assert.ok(e.ts + e.dur! <= stack.at(-1)!, `${where}: overlaps a slice it is not nested in`);
      stack.push(e.ts + e.dur!);
      open.set(track, stack);
    } else {
      assert.equal(e.dur, undefined, `${where}: an instant has no dur`);
      assert.ok(e.s === 't' || e.s === 'p', `${where}: instant scope`);
    }
  }
}

const spansOf = (events: readonly TelemetryEvent[]): SpanEvent[] => events.filter((e): e is SpanEvent => e.type === 'span');

describe('percept trace', () => {
  test('a recording becomes a valid trace: every span with its duration, every drop, cancel, degrade step and error', async () => {
    const path = join(dir, 'run.mcap');
    const live = await recordRun(path);
    const out = join(dir, 'run.trace.json');
    const result = await traceRecording({ recording: path, out });
    assert.deepEqual(result.warnings, []);
    const trace = JSON.parse(readFileSync(out, 'utf8')) as ChromeTrace;
    validateTrace(trace);
    const count = (type: TelemetryEvent['type']) => live.filter((e) => e.type === type).length;
    assert.equal(result.frames, count('frame'));
    assert.equal(result.spans, count('span'));
    assert.equal(result.instants, count('drop') + count('cancel') + count('degrade') + count('error'));
    for (const kind of ['drop', 'cancel', 'degrade', 'error'] as const) assert.ok(count(kind) > 0, `the run has a ${kind}`);

    // One process, the fake source; a thread per stage, in stage order, plus the source edge's drops.
    const meta = (name: string) => trace.traceEvents.filter((e) => e.ph === 'M' && e.name === name).map((e) => e.args!.name);
    assert.deepEqual(meta('process_name'), ['camera fake']);
    const threads = meta('thread_name') as string[];
    for (const stage of ['preprocess', 'encode', 'decode', 'actions', 'publish']) assert.ok(threads.includes(stage), stage);
    assert.equal(threads.filter((t) => t.includes('#')).length, 0, 'no stage ran two frames at once');
    const tidOf = new Map(
      trace.traceEvents.filter((e) => e.name === 'thread_name').map((e) => [e.tid, (e.args!.name as string).replace(/ #\d+$/, '')]),
    );

    // Every span of every frame, once, with its recorded duration and entry time (µs from the first event).
    const slices = trace.traceEvents.filter((e) => e.ph === 'X');
    const origin = BigInt(trace.otherData.origin_ns!);
    const byKey = new Map<string, TraceEvent>(slices.map((e) => [`${e.args!.frame as number} ${e.cat!}`, e]));
    assert.equal(byKey.size, slices.length, 'one slice per frame and stage');
    const recorded = spansOf((await readRecordedEvents(path)).events as unknown as TelemetryEvent[]);
    assert.equal(recorded.length, spansOf(live).length, 'the recording holds every span');
    for (const span of spansOf(live)) {
      const slice = byKey.get(`${span.frameId} ${span.stage}`);
      assert.ok(slice, `frame ${span.frameId} ${span.stage}`);
      assert.equal(tidOf.get(slice.tid), span.stage, 'on its stage track');
      assert.equal(slice.name, `frame ${span.frameId}`);
      assert.equal(BigInt(Math.round(slice.dur! * 1000)), span.exitNs - span.enterNs, 'dur = exit − enter');
      assert.equal(BigInt(Math.round(slice.ts * 1000)), span.enterNs - origin, 'ts = enter − origin');
      assert.equal(slice.args!.degradeLevel, span.degradeLevel);
    }
    // Drops and cancels as instants on their stage's track, with their reason.
    const instants = trace.traceEvents.filter((e) => e.ph === 'i');
    for (const drop of live.filter((e) => e.type === 'drop')) {
      const hit = instants.find((e) => e.name === `drop: ${drop.reason}` && e.args!.frame === drop.frameId);
      assert.ok(hit, `drop of frame ${drop.frameId}`);
      assert.equal(hit.args!.reason, drop.reason);
      assert.equal(hit.args!.detail, drop.detail);
      assert.equal(tidOf.get(hit.tid), drop.stage);
      assert.equal(BigInt(Math.round(hit.ts * 1000)), drop.atNs - origin);
    }
    for (const cancel of live.filter((e) => e.type === 'cancel')) {
      const hit = instants.find((e) => e.name === `cancel: ${cancel.reason}` && e.args!.frame === cancel.frameId);
      assert.ok(hit && tidOf.get(hit.tid) === cancel.stage, `cancel of frame ${cancel.frameId}`);
    }
    const degrades = live.filter((e) => e.type === 'degrade');
    assert.deepEqual(
      instants.filter((e) => e.cat === 'degrade').map((e) => [e.name, e.s, e.args!.frame, e.args!.reason]),
      degrades.map((d) => [`degrade ${d.from}→${d.to}`, 'p', d.frameId, d.reason]),
    );

    // The command line writes the same file and says what it wrote.
    const cliOut = join(dir, 'cli.trace.json');
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [join(root, 'tools/percept.mjs'), 'trace', path, '-o', cliOut, '--json'],
      {
        cwd: root,
      },
    );
    assert.deepEqual(JSON.parse(stdout), {
      frames: result.frames,
      spans: result.spans,
      instants: result.instants,
      tracks: result.tracks,
      out: cliOut,
    });
    const cliTrace = JSON.parse(readFileSync(cliOut, 'utf8')) as ChromeTrace;
    assert.deepEqual(cliTrace.traceEvents, trace.traceEvents);
  });

  test('several cameras get a process each; spans of one stage that overlap go on a second lane', () => {
    const ev = (e: Record<string, unknown>) => JSON.parse(JSON.stringify(e, (_k, v: unknown) => (typeof v === 'bigint' ? String(v) : v)));
    const frame = (frameId: number, sourceId: string, atNs: bigint) =>
      ev({ type: 'frame', atNs, frameId, sourceId, captureNs: atNs, degradeLevel: 0 });
    const span = (frameId: number, stage: string, enterNs: bigint, exitNs: bigint) =>
      ev({ type: 'span', atNs: exitNs, frameId, stage, enterNs, exitNs, degradeLevel: 0 });
    const { trace, tracks } = eventsToTrace([
      frame(0, 'front', 1000n),
      frame(1, 'rear', 1500n),
      frame(2, 'front', 1600n),
      span(0, 'encode', 2000n, 5000n),
      span(1, 'encode', 2500n, 4000n),
      span(2, 'encode', 3000n, 6000n), // front's encode is still busy with frame 0
      ev({ type: 'error', atNs: 7000n, frameId: -1, stage: 'source', message: 'gone' }),
    ]);
    validateTrace(trace);
    const names = trace.traceEvents.filter((e) => e.ph === 'M' && e.name.endsWith('_name')).map((e) => [e.pid, e.tid, e.args!.name]);
    assert.deepEqual(names, [
      [1, 0, 'camera front'],
      [2, 0, 'camera rear'],
      [1, 1, 'encode'],
      [2, 2, 'encode'],
      [1, 3, 'encode #2'],
      [3, 0, 'percept'],
    ]);
    assert.equal(tracks, 3);
    const slices = trace.traceEvents.filter((e) => e.ph === 'X').map((e) => [e.name, e.pid, e.tid, e.ts, e.dur]);
    assert.deepEqual(slices, [
      ['frame 0', 1, 1, 1, 3],
      ['frame 1', 2, 2, 1.5, 1.5],
      ['frame 2', 1, 3, 2, 3],
    ]);
    const error = trace.traceEvents.find((e) => e.ph === 'i')!;
    assert.deepEqual([error.name, error.pid, error.s, error.ts, error.args!.message], ['error', 3, 'p', 6, 'gone']);
  });
});
