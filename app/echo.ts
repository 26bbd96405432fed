// `percept echo`: what arrives on a running percept's topics, one line per message, with seq gaps,
// age and staleness. It reads through percept/client, the client robot stacks use.
//   text:   actions #12 run 3f2a… frame 34 cam_front level 0 age 45.2 ms STALE {"target":{"label":"door",…}
//   --json: {"header": …, "body": …} per line (gaps and invalid messages go to stderr as text)
import { readCurveKey } from '../pipeline/endpoint.ts';
import { STOP_SIGNALS } from '../pipeline/graph/graph.ts';
import { subscribe, type Message } from '../client/index.ts';

export interface EchoOptions {
  readonly connect?: string;
  readonly topic?: readonly string[];
  readonly json?: boolean;
  readonly schema?: string;
  readonly serverKey?: string;
  /** Stop after this many messages. Default: until the run's `end` event, or an interrupt. */
  readonly count?: number;
  /** Go on past a run's `end` event, for the runs after it. */
  readonly keepGoing?: boolean;
}

export async function echo(
  options: EchoOptions,
  out: NodeJS.WritableStream = process.stdout,
  err: NodeJS.WritableStream = process.stderr,
): Promise<number> {
  const topics = options.topic?.length ? options.topic : ['actions'];
  // The events topic is always read: its `end` event ends the echo, printed or not.
  const sub = subscribe({
    connect: options.connect,
    topics: topics.includes('events') ? topics : [...topics, 'events'],
    actionSchema: options.schema,
    serverKey: options.serverKey ? readCurveKey(options.serverKey, 'server public key') : undefined,
  });
  const stop = (): void => sub.close();
  for (const signal of STOP_SIGNALS) process.once(signal, stop);
  let seen = 0;
  try {
    for await (const m of sub) {
      const shown = topics.includes(m.topic);
      if (shown && m.type !== 'invalid' && m.lost > 0)
        err.write(`percept echo: ${m.lost} ${m.topic} message(s) lost before seq ${m.header.seq}\n`);
      if (m.type === 'invalid') err.write(`percept echo: invalid ${m.topic} message: ${m.reason}\n`);
      else if (shown) out.write(`${options.json ? JSON.stringify({ header: m.header, body: bodyOf(m) }) : describe(m)}\n`);
      if (shown && options.count !== undefined && ++seen >= options.count) break;
      if (m.type === 'event' && m.event.type === 'end' && !options.keepGoing) {
        err.write(`percept echo: run ${m.header.run_id.slice(0, 8)} ended\n`);
        break;
      }
    }
  } finally {
    for (const signal of STOP_SIGNALS) process.off(signal, stop);
    sub.close();
  }
  const counts = Object.entries(sub.counts)
    .filter(([t]) => topics.includes(t))
    .map(([t, c]) => `${t} ${c.received} (lost ${c.lost}, invalid ${c.invalid}, stale ${c.stale})`);
  if (counts.length) err.write(`percept echo: ${counts.join('; ')}\n`);
  return 0;
}

function bodyOf(m: Exclude<Message, { type: 'invalid' }>): unknown {
  return m.type === 'action' ? m.action : m.type === 'event' ? m.event : m.telemetry;
}

function describe(m: Exclude<Message, { type: 'invalid' }>): string {
  const run = m.header.run_id.slice(0, 8);
  if (m.type === 'action') {
    const h = m.header;
    const age = m.ageMs === null ? `virtual ${h.virtual_capture_ms} ms` : `age ${m.ageMs.toFixed(1)} ms${m.stale ? ' STALE' : ''}`;
    return `${m.topic} #${h.seq} run ${run} frame ${h.frame_id} ${h.source_id} level ${h.degrade_level} ${age} ${JSON.stringify(m.action)}`;
  }
  if (m.type === 'telemetry') {
    const s = m.telemetry.summary;
    return `${m.topic} #${m.header.seq} run ${run} stats: frames in ${s.frames.in} out ${s.frames.out} dropped ${s.frames.dropped}`;
  }
  const { type, ...rest } = m.event;
  return `${m.topic} #${m.header.seq} run ${run} ${type} ${JSON.stringify(rest)}`;
}
