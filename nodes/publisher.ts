// publisher: validated actions, the graph's decisions and its stats go out on one ZeroMQ PUB socket.
// Three topics (actions, events, telemetry); every message is [topic, header JSON, body JSON].
// Its own per-topic queues keep a slow subscriber from blocking the graph or crowding out actions.
// Topics, queues and replay: nodes/README.md#publisher
//
// Concurrency: zeromq allows one pending send per socket; the pump below is the only sender.
import { Publisher as PubSocket } from 'zeromq';
import type { ActionMessage } from './payloads.ts';
import { actionFrameFields, closeHeader, headerCommon, headerHead, unixMs } from './action-header.ts';
import type { PublisherStats, TopicStats } from '../client/wire-types.ts';
import { eventToJson, type RunSummary, type TelemetryEvent, type TelemetrySink } from '../pipeline/telemetry/events.ts';
import type { CurveConfig, PublisherConfig } from '../pipeline/config.ts';
import { insecureEndpointProblem, parseEndpoint, readCurveKey } from '../pipeline/endpoint.ts';
import { RealClock, type Clock } from '../pipeline/clock.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';

const EVENT_SCHEMA_ID = 'percept/wire/messages/v1#/definitions/Event';
const TELEMETRY_SCHEMA_ID = 'percept/wire/messages/v1#/definitions/Telemetry';

export interface PublisherOptions extends Pick<PublisherConfig, 'endpoint' | 'topic' | 'sendHighWaterMark'> {
  /** How long (wall ms) one message may wait for a subscriber whose queue is full before the socket stops
   * waiting for that subscriber (default 1000). From then on a message goes to every subscriber with room
   * and is lost to the full one (it sees a seq gap), until every subscriber takes messages again.
   * null: wait for ever (one subscriber that stops reading then holds back all others). */
  readonly stallTimeoutMs?: number | null;
  /** The socket's kernel send buffer (ZMQ_SNDBUF, bytes); default the OS's. Tests make it small to fill it fast. */
  readonly sendBufferSize?: number;
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
  /** How many times a subscriber stopped taking messages for longer than stallTimeoutMs (the socket then stopped waiting for it). */
  readonly stalls: number;
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
  readonly name: string;
  readonly frame: Buffer;
  readonly highWaterMark: number;
  readonly #items: (Pending | undefined)[] = [];
  #first = 0;
  accepted = 0;
  sent = 0;
  dropped = 0;

  constructor(name: string, highWaterMark: number) {
    this.name = name;
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

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** How long open() retries a bind refused as EADDRINUSE: a socket closed on that address frees it on ZeroMQ's reaper thread. */
const BIND_RETRY_MS = 1000;

/** PublisherOptions with every default filled in and the run id chosen, as checkPublisherOptions returns them. */
export type CheckedPublisherOptions = Required<Omit<PublisherOptions, 'highWaterMarks' | 'sendBufferSize'>> & {
  readonly highWaterMarks: PublisherConfig['highWaterMarks'];
  readonly sendBufferSize: number | undefined;
};

/** Checks `options` and fills in the defaults; throws naming the first bad option. */
export function checkPublisherOptions(options: PublisherOptions): CheckedPublisherOptions {
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
    stallTimeoutMs = 1000,
    sendBufferSize,
  } = options;
  if (!clock || typeof clock.nowNs !== 'function' || typeof clock.unixNs !== 'function')
    throw new TypeError('createPublisher: expected clock to be a Clock');
  if (clock.virtual && options.runId === undefined)
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
  nonEmptyString('topic', topic);
  nonEmptyString('eventsTopic', eventsTopic);
  nonEmptyString('telemetryTopic', telemetryTopic);
  nonEmptyString('runId', runId);
  const highWaterMarks = { actions: 1000, events: 1000, telemetry: 16, ...options.highWaterMarks };
  intAtLeast('sendHighWaterMark', sendHighWaterMark, 1);
  intAtLeast('highWaterMarks.actions', highWaterMarks.actions, 1);
  intAtLeast('highWaterMarks.events', highWaterMarks.events, 1);
  intAtLeast('highWaterMarks.telemetry', highWaterMarks.telemetry, 1);
  intAtLeast('lingerMs', lingerMs, 0);
  if (stallTimeoutMs !== null) intAtLeast('stallTimeoutMs', stallTimeoutMs, 0);
  if (sendBufferSize !== undefined) intAtLeast('sendBufferSize', sendBufferSize, 1);
  if (curve && !curve.secretKeyFile) throw new TypeError('createPublisher: curve.secretKeyFile (the server secret key) is required');
  return {
    endpoint,
    topic,
    sendHighWaterMark,
    curve,
    insecure,
    highWaterMarks,
    lingerMs,
    runId,
    clock,
    models,
    eventsTopic,
    telemetryTopic,
    stallTimeoutMs,
    sendBufferSize,
  };
}

function nonEmptyString(name: string, value: unknown): void {
  if (typeof value !== 'string' || value.length === 0)
    throw new TypeError(`createPublisher: expected a non-empty string for ${name} but received ${JSON.stringify(value)}`);
}

function intAtLeast(name: string, value: number, least: number): void {
  if (!Number.isInteger(value) || value < least)
    throw new RangeError(`createPublisher: expected integer >= ${least} for ${name} but received ${value}`);
}

const LATE_OPTION_WARNING = 'Socket option will not take effect until next connect/bind.';

/** Sets ZMQ_XPUB_NODROP on a bound socket. libzmq reads it on every send (xpub.cpp: `if (_lossy || _dist.check_hwm())`),
 * so it takes effect at once; zeromq.js warns for any option it does not know to, which would print twice per message
 * while a subscriber is stalled. That one warning is left out here; any other still goes out. */
function setNoDrop(socket: PubSocket, value: boolean): void {
  const emitWarning = process.emitWarning;
  process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
    if ((typeof warning === 'string' ? warning : warning.message) === LATE_OPTION_WARNING) return;
    (emitWarning as (...args: unknown[]) => void).call(process, warning, ...rest);
  }) as typeof process.emitWarning;
  try {
    socket.noDrop = value;
  } finally {
    process.emitWarning = emitWarning;
  }
}

/** Binds the socket; throws naming the endpoint when it cannot. */
export async function createPublisher(options: PublisherOptions): Promise<Publisher> {
  return WirePublisher.open(checkPublisherOptions(options));
}

class WirePublisher implements Publisher {
  readonly endpoint: string;
  readonly runId: string;
  readonly stage: PublisherStage;
  readonly sink: PublisherSink;
  readonly #socket: PubSocket;
  readonly #clock: Clock;
  readonly #virtual: boolean;
  readonly #lingerMs: number;
  readonly #topics: Record<TopicName, TopicQueue>;
  readonly #byPriority: readonly TopicQueue[];
  // The parts of every header that do not change within a run; seq and the publish times are added
  // when a message is sent.
  readonly #common: string;
  readonly #eventHead: string;
  readonly #telemetryHead: string;
  readonly #modelsJson: string;
  readonly #actionHeads = new Map<string, string>(); // schema id → its head
  readonly #sourceIds = new Map<string, string>(); // source id → its JSON
  #takenIn = 0;
  #closing = false;
  #closed: Promise<PublisherCounters> | undefined;
  #pumping: Promise<void> | undefined;
  #undelivered = 0;
  readonly #stallTimeoutMs: number | null;
  /** A subscriber held a message back past stallTimeoutMs and has not taken one since: sends do not wait for it. */
  #stalled = false;
  #stalls = 0;
  /** Topic queues that dropped and have not drained to half since: their overflow was said once. */
  readonly #overflowing = new Set<TopicQueue>();

  static async open(options: CheckedPublisherOptions): Promise<WirePublisher> {
    const { endpoint } = options;
    const secretKeyFile = options.curve?.secretKeyFile;
    const socket = new PubSocket({
      sendHighWaterMark: options.sendHighWaterMark,
      noDrop: true,
      sendTimeout: 0,
      linger: 0,
      ...(options.sendBufferSize !== undefined ? { sendBufferSize: options.sendBufferSize } : {}),
      ...(secretKeyFile ? { curveServer: true, curveSecretKey: readCurveKey(secretKeyFile, 'publisher secret key') } : {}),
    });
    // A publisher closed just before on this address frees it on ZeroMQ's reaper thread, moments later.
    for (const start = Date.now(); ;) {
      try {
        await socket.bind(endpoint);
        break;
      } catch (err) {
        const code = (err as { code?: string }).code;
        if (code === 'EADDRINUSE' && Date.now() - start < BIND_RETRY_MS) {
          await sleep(10);
          continue;
        }
        socket.close();
        throw new Error(`publisher: cannot bind ${endpoint}${code ? ` (${code})` : ''}: ${(err as Error).message}`, { cause: err });
      }
    }
    return new WirePublisher(options, socket, socket.lastEndpoint ?? endpoint);
  }

  private constructor(options: CheckedPublisherOptions, socket: PubSocket, bound: string) {
    const { runId, clock, highWaterMarks } = options;
    this.endpoint = bound;
    this.runId = runId;
    this.#socket = socket;
    this.#clock = clock;
    this.#virtual = clock.virtual;
    this.#lingerMs = options.lingerMs;
    this.#stallTimeoutMs = options.stallTimeoutMs;
    this.#topics = {
      actions: new TopicQueue(options.topic, highWaterMarks.actions),
      events: new TopicQueue(options.eventsTopic, highWaterMarks.events),
      telemetry: new TopicQueue(options.telemetryTopic, highWaterMarks.telemetry),
    };
    this.#byPriority = [this.#topics.actions, this.#topics.events, this.#topics.telemetry];
    this.#common = headerCommon(runId, this.#virtual);
    this.#eventHead = headerHead(EVENT_SCHEMA_ID, this.#common);
    this.#telemetryHead = headerHead(TELEMETRY_SCHEMA_ID, this.#common);
    this.#modelsJson = JSON.stringify(options.models);
    this.stage = { name: 'publish', process: (msg, ctx) => this.#publish(msg, ctx) };
    const undelivered = (): number => this.#undelivered;
    this.sink = {
      accept: (event) => this.#accept(event),
      get undelivered() {
        return undelivered();
      },
    };
  }

  /** How many times a subscriber stopped taking messages for longer than stallTimeoutMs. */
  get stalls(): number {
    return this.#stalls;
  }

  stats(): PublisherCounters {
    return Object.fromEntries(this.#byPriority.map((q) => [q.name, q.stats()]));
  }

  close(summary?: RunSummary): Promise<PublisherCounters> {
    return (this.#closed ??= this.#close(summary));
  }

  #publish(msg: ActionMessage, ctx: StageContext): Promise<ActionMessage> {
    if (this.#closing) return Promise.reject(new Error(`publisher ${this.endpoint}: publish after close`));
    const frame = ctx.frame;
    const virtual = this.#virtual;
    let head = this.#actionHeads.get(msg.schemaId);
    if (head === undefined) {
      head = headerHead(msg.schemaId, this.#common);
      this.#actionHeads.set(msg.schemaId, head);
    }
    let sourceId = this.#sourceIds.get(msg.sourceId);
    if (sourceId === undefined) {
      sourceId = JSON.stringify(msg.sourceId);
      if (this.#sourceIds.size < 1024) this.#sourceIds.set(msg.sourceId, sourceId);
    }
    const frameFields = actionFrameFields(msg, frame, virtual, this.#modelsJson, sourceId);
    // On a virtual clock, published when the stage takes it in, on the call's clock.
    const virtualMs = virtual ? unixMs(ctx.clock, ctx.clock.nowNs()) : undefined;
    this.#enqueue(this.#topics.actions, head + frameFields, JSON.stringify(msg.action), virtualMs);
    return Promise.resolve(msg);
  }

  #accept(event: TelemetryEvent): void {
    const isStats = event.type === 'stats';
    if (!isStats && !EVENT_TYPES.has(event.type)) return;
    if (this.#closing) {
      this.#undelivered += 1;
      return;
    }
    const virtualMs = this.#virtual ? unixMs(this.#clock, event.atNs) : undefined;
    if (event.type === 'stats') {
      const body = JSON.stringify({ type: 'stats', atNs: String(event.atNs), summary: event.summary, publisher: this.#wireStats() });
      this.#enqueue(this.#topics.telemetry, this.#telemetryHead, body, virtualMs);
    } else {
      this.#enqueue(this.#topics.events, this.#eventHead, eventToJson(event), virtualMs);
    }
  }

  /** The counters that go out in stats and end bodies: on a virtual clock, without those that
   * depend on how fast the socket drains. */
  #wireStats(): PublisherStats {
    const counters = this.stats();
    if (!this.#virtual) return counters;
    return Object.fromEntries(Object.entries(counters).map(([name, c]) => [name, { ...c, sent: null, queued: null }]));
  }

  /** The queue whose message goes next: by topic priority on a real clock, in the order taken in on
   * a virtual one. */
  #nextQueue(): TopicQueue | undefined {
    if (!this.#virtual) return this.#byPriority.find((q) => q.length > 0);
    let next: TopicQueue | undefined;
    for (const q of this.#byPriority) if (q.length > 0 && (!next || q.peek()!.order < next.peek()!.order)) next = q;
    return next;
  }

  /** Queues one message; `virtualMs` is its publish time on a virtual clock (undefined on a real one). */
  #enqueue(queue: TopicQueue, head: string, body: Pending['body'], virtualMs: number | undefined): void {
    const droppedBefore = queue.dropped;
    queue.push((seq) => ({ seq, order: this.#takenIn++, head, virtualMs, body }));
    if (queue.dropped > droppedBefore) this.#queueOverflowed(queue);
    else if (queue.length <= queue.highWaterMark / 2) this.#overflowing.delete(queue);
    this.#kick();
  }

  /** A topic queue dropped its oldest message: said at once on the events topic, once per overflow.
   * Drops on the events topic itself are not said there (that would drop another): stats and seq gaps show them. */
  #queueOverflowed(queue: TopicQueue): void {
    if (this.#overflowing.has(queue) || queue === this.#topics.events || this.#closing) return;
    this.#overflowing.add(queue);
    this.#sayError(
      `the ${queue.name} queue is full (${queue.highWaterMark} messages): its oldest are dropped, seen as seq gaps, ` +
        'until the socket drains it; publisher.sendHighWaterMark sets its size',
    );
  }

  #kick(): void {
    this.#pumping ??= this.#pump().finally(() => {
      this.#pumping = undefined;
      if (this.#byPriority.some((q) => q.length > 0) && !this.#socket.closed) this.#kick();
    });
  }

  /** Sends while anything is queued, highest priority first.
   * A full subscriber makes a no-drop send() fail with EAGAIN: the socket holds every message back
   * until the slowest subscriber has room. The message is retried after a short wait, growing to 16 ms.
   * Past stallTimeoutMs that subscriber has stopped reading: the message is sent without no-drop, so
   * ZeroMQ hands it to every subscriber with room and drops it for the full one (a seq gap there).
   * While stalled, each message is still tried with no-drop first; the first that goes out that way
   * (every subscriber has room again) ends the stall. */
  async #pump(): Promise<void> {
    const socket = this.#socket;
    let waitMs = 0;
    for (;;) {
      const queue = this.#nextQueue();
      if (!queue) return;
      const item = queue.shift()!;
      const body = typeof item.body === 'string' ? item.body : item.body();
      const heldSince = Date.now();
      for (;;) {
        const header = closeHeader(item.head, item.seq, item.virtualMs);
        try {
          await socket.send([queue.frame, header, body]);
          queue.sent += 1;
          this.#stalled = false;
          waitMs = 0;
          break;
        } catch (err) {
          if ((err as { code?: string }).code !== 'EAGAIN' || socket.closed) {
            queue.dropped += 1;
            break;
          }
          const limit = this.#stallTimeoutMs;
          if (limit !== null && (this.#stalled || Date.now() - heldSince >= limit)) {
            if (!this.#stalled) this.#stall(Date.now() - heldSince);
            if (await this.#sendPast([queue.frame, header, body])) queue.sent += 1;
            else queue.dropped += 1;
            waitMs = 0;
            break;
          }
          waitMs = Math.min(16, Math.max(1, waitMs * 2));
          await sleep(waitMs);
        }
      }
    }
  }

  /** Sends one message to every subscriber with room, dropping it for those without (no-drop off for one send). */
  async #sendPast(parts: (Buffer | string)[]): Promise<boolean> {
    const socket = this.#socket;
    if (socket.closed) return false;
    setNoDrop(socket, false);
    try {
      await socket.send(parts);
      return true;
    } catch {
      return false;
    } finally {
      if (!socket.closed) setNoDrop(socket, true);
    }
  }

  /** A subscriber stopped reading: said at once on the events topic (every reading subscriber gets it). */
  #stall(heldMs: number): void {
    this.#stalled = true;
    this.#stalls += 1;
    // After close() the end event is queued: nothing may follow it. The end's counters still show the stall's drops.
    if (this.#closing) {
      this.#undelivered += 1;
      return;
    }
    this.#sayError(
      `a subscriber took nothing for ${heldMs} ms (its queue is full): ` +
        'messages go on to the other subscribers and are lost to it (seq gaps there) until it reads again',
    );
  }

  /** The publisher's own trouble, as an error event on the events topic: every reading subscriber gets it at once. */
  #sayError(message: string): void {
    const atNs = this.#clock.nowNs();
    const event: TelemetryEvent = { type: 'error', atNs, frameId: -1, stage: 'publish', message };
    this.#enqueue(this.#topics.events, this.#eventHead, eventToJson(event), this.#virtual ? unixMs(this.#clock, atNs) : undefined);
  }

  async #close(summary?: RunSummary): Promise<PublisherCounters> {
    const topics = this.#topics;
    const socket = this.#socket;
    const lingerMs = this.#lingerMs;
    this.#closing = true;
    if (summary) {
      // The end summary goes out last, with the counters as they are when it is sent.
      // On a real clock it supersedes stats still waiting, which count as dropped: events go first.
      // On a virtual one they go before it, as they were taken in.
      if (!this.#virtual) while (topics.telemetry.shift()) topics.telemetry.dropped += 1;
      const end = () => JSON.stringify({ type: 'end', summary, publisher: this.#wireStats() });
      this.#enqueue(topics.events, this.#eventHead, end, this.#virtual ? unixMs(this.#clock, this.#clock.nowNs()) : undefined);
    }
    const deadline = Date.now() + lingerMs;
    if (this.#pumping) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<void>((resolve) => (timer = setTimeout(resolve, lingerMs)));
      // pump() re-kicks itself while anything is queued, so wait for the chain, not one round.
      const drained = (async () => {
        while (this.#pumping) await this.#pumping;
      })();
      await Promise.race([drained, timeout]);
      clearTimeout(timer);
    }
    // What is still queued will not go out: it counts as dropped.
    for (const queue of this.#byPriority) while (queue.shift()) queue.dropped += 1;
    // Handed to ZeroMQ is not yet on the wire: let it flush for what is left of lingerMs.
    // Not unbind: it drops what its connections still hold. close() frees the address moments later (open() retries).
    socket.linger = Math.max(0, deadline - Date.now());
    socket.close();
    await this.#pumping;
    return this.stats();
  }
}
