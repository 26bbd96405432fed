// Labels for `percept eval`: the expected action of some frames of a bag.
//
// Format: JSON lines in UTF-8, blank lines skipped. Each object names its frame with exactly one key:
//   {"log_time_ns": "1700000000100000000", "action": {...}}   the bag message's log time in ns
//   {"frame_id": 3, "action": {...}}                          the frame's 0-based position in the replay
// A log time is a decimal string or a safe integer. A frame id counts every message of the topic.
// `action` is validated against the action schema, so it is written as the pipeline would publish it.
// `target.bbox` is [x0, y0, x1, y1], normalised to the image. An optional "note" string is for people.
// bags/sample.labels.jsonl is an example.
import { readFileSync } from 'node:fs';
import { formatAjvErrors, type ActionSchema } from '../../nodes/action-schema.ts';

export type LabelKey = { readonly logTimeNs: bigint } | { readonly frameId: number };

export interface Label {
  readonly key: LabelKey;
  readonly action: Readonly<Record<string, unknown>>;
  /** 1-based line in the file. */
  readonly line: number;
}

const KNOWN = new Set(['log_time_ns', 'frame_id', 'action', 'note']);

/** Reads and checks a labels file; throws naming the file, the line and what is wrong. */
export function loadLabels(path: string, schema: ActionSchema): Label[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new Error(`labels: cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
  const labels: Label[] = [];
  const seen = new Map<string, number>();
  text.split('\n').forEach((raw, index) => {
    const line = index + 1;
    if (raw.trim() === '') return;
    const fail = (why: string): never => {
      throw new Error(`labels: ${path}:${line}: ${why}`);
    };
    let value: unknown;
    try {
      value = JSON.parse(raw);
    } catch (err) {
      fail(`not JSON (${(err as Error).message})`);
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) fail('expected a JSON object');
    const record = value as Record<string, unknown>;
    const unknown = Object.keys(record).filter((k) => !KNOWN.has(k));
    if (unknown.length > 0)
      fail(`unknown key ${unknown.map((k) => JSON.stringify(k)).join(', ')} (expected log_time_ns or frame_id, action, note)`);
    const hasTime = 'log_time_ns' in record;
    if (hasTime === 'frame_id' in record) fail('expected exactly one of log_time_ns and frame_id');
    let key: LabelKey;
    if (hasTime) {
      const t = record.log_time_ns;
      if (typeof t === 'string' && /^\d+$/.test(t)) key = { logTimeNs: BigInt(t) };
      else if (Number.isSafeInteger(t) && (t as number) >= 0) key = { logTimeNs: BigInt(t as number) };
      else fail(`log_time_ns must be a decimal string of ns (or a safe integer), got ${JSON.stringify(t)}`);
    } else {
      const f = record.frame_id;
      if (!Number.isInteger(f) || (f as number) < 0) fail(`frame_id must be an integer >= 0, got ${JSON.stringify(f)}`);
      key = { frameId: f as number };
    }
    if ('note' in record && typeof record.note !== 'string') fail('note must be a string');
    if (!schema.validate(record.action)) fail(`action fails ${schema.id}: ${formatAjvErrors(schema.validate.errors)}`);
    const id = 'logTimeNs' in key! ? `t${key.logTimeNs}` : `f${key!.frameId}`;
    const earlier = seen.get(id);
    if (earlier !== undefined) fail(`the same frame as line ${earlier}`);
    seen.set(id, line);
    labels.push({ key: key!, action: record.action as Record<string, unknown>, line });
  });
  if (labels.length === 0) throw new Error(`labels: ${path} holds no labels`);
  return labels;
}
