// publisher: validated actions, the graph's decisions and its stats go out on one ZeroMQ PUB socket.
// Three topics (actions, events, telemetry); every message is [topic, header JSON, body JSON].
// Its own per-topic queues keep a slow subscriber from blocking the graph or crowding out actions.
// Topics, queues and replay: nodes/README.md#publisher
//
// Concurrency: zeromq allows one pending send per socket; the pump below is the only sender.
import { Publisher as PubSocket } from 'zeromq';
import type { ActionMessage } from './payloads.ts';
import type { PublisherStats, TopicStats } from '../client/wire-types.ts';
import { eventToJson, type RunSummary, type TelemetryEvent, type TelemetrySink } from '../pipeline/telemetry/events.ts';
import type { CurveConfig, PublisherConfig } from '../pipeline/config.ts';
import { insecureEndpointProblem, parseEndpoint, readCurveKey } from '../pipeline/endpoint.ts';
import { RealClock, type Clock } from '../pipeline/clock.ts';
import type { Stage, StageContext, Stamp } from '../pipeline/types.ts';

const HEADER_VERSION = 1;
const EVENT_SCHEMA_ID = 'percept/wire/messages/v1#/definitions/Event';
const TELEMETRY_SCHEMA_ID = 'percept/wire/messages/v1#/definitions/Telemetry';

export interface PublisherOptions extends Pick<PublisherConfig, 'endpoint' | 'topic' | 'sendHighWaterMark'> {
  /** CURVE server key (required for an endpoint other hosts can reach, unless `insecure`). */
  readonly curve?: CurveConfig | null;
  readonly insecure?: boolean;
  readonly highWaterMarks?: Partial<PublisherConfig['highWaterMarks']>;
  /** How long close() lets queued messages reach connected subscribers (ms, default 2000). */
  readonly lingerMs?: number;
  /** The run's id, by default a random UUID on a real clock.
   * Required on a virtual clock: the same replay must publish the same bytes, so the caller derives it from the replay. */
  readonly runId?: string;
  /** The run's clock (default real). On a virtual clock, times go out as virtual_*, never as wall times.
   * A frame's time comes from its context, an event's from its atNs, the end's from clock.nowNs(). */
  readonly clock?: Clock;
  /** Role → model id, copied into every action header. */
  readonly models?: Readonly<Record<string, string>>;
  /** Topics of the events and the stats (defaults 'events', 'telemetry'). */
  readonly eventsTopic?: string;
  readonly telemetryTopic?: string;
}

/** The publish stage: enqueues the action (never waits for the socket) and passes it on. */
export type PublisherStage = Stage<ActionMessage, ActionMessage>;

export interface PublisherSink extends TelemetrySink {
  /** Queues one event: decisions, source and control events on the events topic, stats on the
   * telemetry topic; other event types are not published. */
  readonly accept: (event: TelemetryEvent) => void;
}

export interface Publisher {
  /** The endpoint actually bound (a wildcard port resolved), usable by connect(). */
  readonly endpoint: string;
  readonly runId: string;
  readonly stage: PublisherStage;
  readonly sink: PublisherSink;
  /** Per topic: accepted (the next seq), sent, dropped and queued. All are counted on either clock. */
  stats(): PublisherCounters;
  /** Sends what is queued, then the `end` event with `summary` and the final counters.
   * Waits up to lingerMs for it all to go out, then closes the socket. Idempotent.
   * Resolves with the final counters; what could not be sent by then counts as dropped. */
  close(summary?: RunSummary): Promise<PublisherCounters>;
}

/** A topic's counters as the publisher keeps them; the wire's TopicStats may leave some out (null). */
export type TopicCounters = { readonly [K in keyof TopicStats]-?: NonNullable<TopicStats[K]> };
export type PublisherCounters = Record<string, TopicCounters>;

type TopicName = 'actions' | 'events' | 'telemetry';
/** A message waiting in a topic queue; its header is finished when it is sent. */
interface Pending {
  readonly seq: number;
  /** Its place among all the messages the publisher took in, every topic together. */
  readonly order: number;
  /** The header's JSON without its closing brace and without seq and the publish times. */
  readonly head: string;
  /** On a virtual clock, the publish time (ms on the replay's clock); undefined on a real one. */
  readonly virtualMs: number | undefined;
  /** The body, or (the end event) a function that makes it when it is sent. */
  readonly body: string | (() => string);
}

/** One topic: its frame, its seq counter and its bounded queue (oldest dropped when full). */
class TopicQueue {
  readonly frame: Buffer;
  readonly highWaterMark: number;
  readonly #items: (Pending | undefined)[] = [];
  #first = 0;
  accepted = 0;
  sent = 0;
  dropped = 0;

  constructor(name: string, highWaterMark: number) {
    this.frame = Buffer.from(name);
    this.highWaterMark = highWaterMark;
  }
  get length(): number {
    return this.#items.length - this.#first;
  }
  /** The oldest message waiting, if any. */
  peek(): Pending | undefined {
    return this.length > 0 ? this.#items[this.#first] : undefined;
  }
  push(make: (seq: number) => Pending): void {
    if (this.length >= this.highWaterMark) {
      this.shift();
      this.dropped += 1;
    }
    this.#items.push(make(this.accepted++));
  }
  shift(): Pending | undefined {
    if (this.length === 0) return undefined;
    const item = this.#items[this.#first];
    this.#items[this.#first++] = undefined;
    // Compact now and then instead of Array.shift() per message.
    if (this.#first > 1024 && this.#first * 2 > this.#items.length) {
      this.#items.splice(0, this.#first);
      this.#first = 0;
    }
    return item;
  }
  stats(): TopicCounters {
    return { accepted: this.accepted, sent: this.sent, dropped: this.dropped, queued: this.length, highWaterMark: this.highWaterMark };
  }
}

/** The events published on the events topic; stats go to telemetry; the rest stays inside. */
const EVENT_TYPES: ReadonlySet<TelemetryEvent['type']> = new Set(['drop', 'cancel', 'degrade', 'error', 'source', 'control']);

const num = (value: number): string => (Number.isFinite(value) ? String(value) : 'null');
const stampJson = (stamp: Stamp | null | undefined): string => (stamp ? `{"sec":${stamp.sec},"nanosec":${stamp.nanosec}}` : 'null');
const requireSecretKey = (curve: CurveConfig): string => {
  if (!curve.secretKeyFile) throw new TypeError('createPublisher: curve.secretKeyFile (the server secret key) is required');
  return curve.secretKeyFile;
};
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
/** ms since the Unix epoch of the instant `ns` on `clock`, exact to the ns (no float of the whole). */
const unixMs = (clock: Clock, ns: bigint): number => {
  const unixNs = clock.unixNs(ns);
  return Number(unixNs / 1_000_000n) + Number(unixNs % 1_000_000n) / 1e6;
};

/** A header's last fields, written at send time: the per-topic seq and the publish time.
 * The publish time is wall time, or the replay clock's on a virtual clock.
 * They close the header that `head` opens: everything before the seq, without a trailing comma. */
export function closeHeader(head: string, seq: number, virtualMs?: number): string {
  const times =
    virtualMs === undefined
      ? `"publish_wall_ms":${Date.now()},"virtual_publish_ms":null`
      : `"publish_wall_ms":null,"virtual_publish_ms":${num(virtualMs)}`;
  return `${head},"seq":${seq},${times}}`;
}

export async function createPublisher(options: PublisherOptions): Promise<Publisher> {
  if (options === null || typeof options !== 'object')
    throw new TypeError('createPublisher: expected an options object { endpoint, topic, sendHighWaterMark }');
  const {
    endpoint,
    topic,
    sendHighWaterMark,
    curve = null,
    insecure = false,
    lingerMs = 2000,
    clock = new RealClock(),
    models = {},
    eventsTopic = 'events',
    telemetryTopic = 'telemetry',
  } = options;
  if (!clock || typeof clock.nowNs !== 'function' || typeof clock.unixNs !== 'function')
    throw new TypeError('createPublisher: expected clock to be a Clock');
  const virtual = clock.virtual;
  if (virtual && options.runId === undefined)
    throw new TypeError(
      'createPublisher: a virtual clock needs runId (derived from what makes the replay, so that it publishes the same bytes)',
    );
  const runId = options.runId ?? crypto.randomUUID();
  let parsed;
  try {
    parsed = parseEndpoint(endpoint);
  } catch (err) {
    throw new TypeError(`createPublisher: ${(err as Error).message}`, { cause: err });
  }
  const refused = insecureEndpointProblem(parsed, endpoint, { bind: true, curve: curve !== null, insecure });
  if (refused) throw new Error(`publisher: ${refused}`);
  for (const [name, value] of [
    ['topic', topic],
    ['eventsTopic', eventsTopic],
    ['telemetryTopic', telemetryTopic],
    ['runId', runId],
  ] as const) {
    if (typeof value !== 'string' || value.length === 0) {
      throw new TypeError(`createPublisher: expected a non-empty string for ${name} but received ${JSON.stringify(value)}`);
    }
  }
  const hwm = { actions: 1000, events: 1000, telemetry: 16, ...options.highWaterMarks };
  for (const [name, value] of [
    ['sendHighWaterMark', sendHighWaterMark],
    ['highWaterMarks.actions', hwm.actions],
    ['highWaterMarks.events', hwm.events],
    ['highWaterMarks.telemetry', hwm.telemetry],
  ] as const) {
    if (!Number.isInteger(value) || value < 1)
      throw new RangeError(`createPublisher: expected integer >= 1 for ${name} but received ${value}`);
  }
  if (!Number.isInteger(lingerMs) || lingerMs < 0)
    throw new RangeError(`createPublisher: expected integer >= 0 for lingerMs but received ${lingerMs}`);

  const socket = new PubSocket({
    sendHighWaterMark,
    noDrop: true,
    sendTimeout: 0,
    linger: 0,
    ...(curve ? { curveServer: true, curveSecretKey: readCurveKey(requireSecretKey(curve), 'publisher secret key') } : {}),
  });
  try {
    await socket.bind(endpoint);
  } catch (err) {
    socket.close();
    const code = (err as { code?: string }).code;
    throw new Error(`publisher: cannot bind ${endpoint}${code ? ` (${code})` : ''}: ${(err as Error).message}`, { cause: err });
  }
  const bound = socket.lastEndpoint ?? endpoint;

  const topics: Record<TopicName, TopicQueue> = {
    actions: new TopicQueue(topic, hwm.actions),
    events: new TopicQueue(eventsTopic, hwm.events),
    telemetry: new TopicQueue(telemetryTopic, hwm.telemetry),
  };
  const byPriority = [topics.actions, topics.events, topics.telemetry];
  const stats = (): PublisherCounters => ({
    [topic]: topics.actions.stats(),
    [eventsTopic]: topics.events.stats(),
    [telemetryTopic]: topics.telemetry.stats(),
  });
  /** The counters that go out in stats and end bodies: on a virtual clock, without those that
   * depend on how fast the socket drains. */
  const wireStats = (): PublisherStats => {
    const counters = stats();
    if (!virtual) return counters;
    return Object.fromEntries(Object.entries(counters).map(([name, c]) => [name, { ...c, sent: null, queued: null }]));
  };
  /** The queue whose message goes next: by topic priority on a real clock, in the order taken in on
   * a virtual one. */
  const nextQueue = (): TopicQueue | undefined => {
    if (!virtual) return byPriority.find((q) => q.length > 0);
    let next: TopicQueue | undefined;
    for (const q of byPriority) if (q.length > 0 && (!next || q.peek()!.order < next.peek()!.order)) next = q;
    return next;
  };
  let takenIn = 0;

  // The parts of every header that do not change within a run; seq and the publish times are added
  // when a message is sent.
  const common = `"run_id":${JSON.stringify(runId)},"clock":"${virtual ? 'virtual' : 'real'}"`;
  const eventHead = `{"header_version":${HEADER_VERSION},"schema_id":"${EVENT_SCHEMA_ID}",${common}`;
  const telemetryHead = `{"header_version":${HEADER_VERSION},"schema_id":"${TELEMETRY_SCHEMA_ID}",${common}`;
  const modelsJson = JSON.stringify(models);
  const actionHeads = new Map<string, string>(); // schema id → its head
  const sourceIds = new Map<string, string>(); // source id → its JSON

  let closing = false;
  let closed: Promise<PublisherCounters> | undefined;
  let pumping: Promise<void> | undefined;
  let undelivered = 0;

  /** Sends while anything is queued, highest priority first.
   * A full subscriber makes send() fail with EAGAIN (no-drop). The message is retried after a short wait, growing to 16 ms. */
  async function pump(): Promise<void> {
    let waitMs = 0;
    for (;;) {
      const queue = nextQueue();
      if (!queue) return;
      const item = queue.shift()!;
      const body = typeof item.body === 'string' ? item.body : item.body();
      for (;;) {
        const header = closeHeader(item.head, item.seq, item.virtualMs);
        try {
          await socket.send([queue.frame, header, body]);
          queue.sent += 1;
          waitMs = 0;
          break;
        } catch (err) {
          if ((err as { code?: string }).code !== 'EAGAIN' || socket.closed) {
            queue.dropped += 1;
            break;
          }
          waitMs = Math.min(16, Math.max(1, waitMs * 2));
          await sleep(waitMs);
        }
      }
    }
  }
  const kick = (): void => {
    pumping ??= pump().finally(() => {
      pumping = undefined;
      if (byPriority.some((q) => q.length > 0) && !socket.closed) kick();
    });
  };

  /** Queues one message; `virtualMs` is its publish time on a virtual clock (undefined on a real one). */
  function enqueue(queue: TopicQueue, head: string, body: Pending['body'], virtualMs: number | undefined): void {
    queue.push((seq) => ({ seq, order: takenIn++, head, virtualMs, body }));
    kick();
  }

  const stage: PublisherStage = {
    name: 'publish',
    process(msg: ActionMessage, ctx: StageContext): Promise<ActionMessage> {
      if (closing) return Promise.reject(new Error(`publisher ${bound}: publish after close`));
      const frame = ctx.frame;
      let head = actionHeads.get(msg.schemaId);
      if (head === undefined) {
        head = `{"header_version":${HEADER_VERSION},"schema_id":${JSON.stringify(msg.schemaId)},${common}`;
        actionHeads.set(msg.schemaId, head);
      }
      let sourceId = sourceIds.get(msg.sourceId);
      if (sourceId === undefined) {
        sourceId = JSON.stringify(msg.sourceId);
        if (sourceIds.size < 1024) sourceIds.set(msg.sourceId, sourceId);
      }
      const budgetMs = Number(frame.deadlineNs - frame.captureNs) / 1e6;
      const untilMs = msg.captureWallMs + budgetMs;
      const frameFields =
        `,"frame_id":${msg.frameId},"source_id":${sourceId},"source_stamp":${stampJson(frame.sourceStamp)}` +
        `,"capture_wall_ms":${virtual ? 'null' : num(msg.captureWallMs)},"valid_until_wall_ms":${virtual ? 'null' : num(untilMs)}` +
        `,"virtual_capture_ms":${virtual ? num(msg.captureWallMs) : 'null'},"virtual_valid_until_ms":${virtual ? num(untilMs) : 'null'}` +
        `,"degrade_level":${frame.degradeLevel},"models":${modelsJson}`;
      // On a virtual clock, published when the stage takes it in, on the call's clock.
      const virtualMs = virtual ? unixMs(ctx.clock, ctx.clock.nowNs()) : undefined;
      enqueue(topics.actions, head + frameFields, JSON.stringify(msg.action), virtualMs);
      return Promise.resolve(msg);
    },
  };

  const sink: PublisherSink = {
    accept(event: TelemetryEvent): void {
      const isStats = event.type === 'stats';
      if (!isStats && !EVENT_TYPES.has(event.type)) return;
      if (closing) {
        undelivered += 1;
        return;
      }
      if (event.type === 'stats') {
        const body = JSON.stringify({ type: 'stats', atNs: String(event.atNs), summary: event.summary, publisher: wireStats() });
        enqueue(topics.telemetry, telemetryHead, body, virtual ? unixMs(clock, event.atNs) : undefined);
      } else {
        enqueue(topics.events, eventHead, eventToJson(event), virtual ? unixMs(clock, event.atNs) : undefined);
      }
    },
    get undelivered() {
      return undelivered;
    },
  };

  async function close(summary?: RunSummary): Promise<PublisherCounters> {
    closing = true;
    if (summary) {
      // The end summary goes out last, with the counters as they are when it is sent.
      // On a real clock it supersedes stats still waiting, which count as dropped: events go first.
      // On a virtual one they go before it, as they were taken in.
      if (!virtual) while (topics.telemetry.shift()) topics.telemetry.dropped += 1;
      const end = () => JSON.stringify({ type: 'end', summary, publisher: wireStats() });
      enqueue(topics.events, eventHead, end, virtual ? unixMs(clock, clock.nowNs()) : undefined);
    }
    const deadline = Date.now() + lingerMs;
    if (pumping) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<void>((resolve) => (timer = setTimeout(resolve, lingerMs)));
      // pump() re-kicks itself while anything is queued, so wait for the chain, not one round.
      const drained = (async () => {
        while (pumping) await pumping;
      })();
      await Promise.race([drained, timeout]);
      clearTimeout(timer);
    }
    // What is still queued will not go out: it counts as dropped.
    for (const queue of byPriority) while (queue.shift()) queue.dropped += 1;
    // Handed to ZeroMQ is not yet on the wire: let it flush for what is left of lingerMs.
    socket.linger = Math.max(0, deadline - Date.now());
    // close() releases the endpoint later, on ZeroMQ's reaper thread.
    // Unbind first, so the address is free when close() resolves and a restart can bind it at once.
    await socket.unbind(bound).catch(() => undefined);
    socket.close();
    await pumping;
    return stats();
  }

  return {
    endpoint: bound,
    runId,
    stage,
    sink,
    stats,
    close: (summary) => (closed ??= close(summary)),
  };
}
