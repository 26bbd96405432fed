// publisher: validated actions → ZeroMQ PUB. Each message is three frames:
//   [topic, header JSON, body JSON]
//   header = { schema_id, seq, frame_id, source_id, capture_wall_ms, publish_wall_ms }
//   body   = the action, exactly as it passed the schema
// Subscribers filter on the topic frame (ZeroMQ filters are byte prefixes: 'actions' also matches
// 'actions/rear'). createPublisher() returns two faces over one socket: the `stage` that publishes
// actions, and a telemetry `sink` that publishes the graph's decisions (drop, cancel, degrade,
// error) on the events topic and its periodic stats on the telemetry topic, as [topic, JSON].
// Concurrency: zeromq allows one pending send per socket, so sends are serialised by a lock: a
// caller's await returns when its own message is handed to ZeroMQ (no queue grows behind it beyond
// the callers that are awaiting). Use it behind concatMap.
import { Publisher as PubSocket } from 'zeromq';
import type { ActionMessage } from './payloads.ts';
import { eventToJson, type TelemetryEvent } from '../pipeline/telemetry/events.ts';
import type { PublisherConfig } from '../pipeline/config.ts';
import type { Stage, StageContext, TelemetrySink } from '../pipeline/types.ts';

/** The publisher section of a defaulted config: `endpoint` (e.g. 'tcp://127.0.0.1:5556', 'tcp://*:5556',
 * 'tcp://127.0.0.1:*' for any free port, 'ipc:///tmp/percept.sock'), the actions `topic`, and
 * `sendHighWaterMark` (ZeroMQ SNDHWM: messages queued per subscriber before PUB drops for it); and
 * the publisher's own settings. */
export interface PublisherOptions extends PublisherConfig {
  /** Topics of the sink's stats and of its decision events (defaults 'telemetry', 'events'). */
  readonly telemetryTopic?: string;
  readonly eventsTopic?: string;
  /** How long close() keeps sending already-queued messages (ms, default 1000). */
  readonly lingerMs?: number;
}

export interface WireHeader {
  readonly schema_id: string;
  readonly seq: number;
  readonly frame_id: number;
  readonly source_id: string;
  readonly capture_wall_ms: number;
  readonly publish_wall_ms: number;
}

export interface PublisherStage extends Stage<ActionMessage, ActionMessage> {
  /** The endpoint actually bound (a wildcard port resolved), usable by connect(). */
  readonly endpoint: string;
  readonly topic: string;
  /** Action messages handed to ZeroMQ so far (= the next seq). */
  readonly sent: number;
  close(): Promise<void>;
}

export interface PublisherSink extends TelemetrySink {
  /** Sends one event as `[topic, JSON]` (bigints as decimal strings) and resolves when ZeroMQ has it;
   * resolves without sending for the event types that are not published (frame, span, note, output). */
  publish(event: TelemetryEvent): Promise<void>;
}

export interface Publisher {
  readonly stage: PublisherStage;
  readonly sink: PublisherSink;
}

/** The events that go out on the events topic: every decision the graph makes about a frame. */
const DECISIONS: ReadonlySet<TelemetryEvent['type']> = new Set(['drop', 'cancel', 'degrade', 'error']);

const ENDPOINT = /^(tcp|ipc|inproc):\/\/.+/;

export async function createPublisher(options: PublisherOptions): Promise<Publisher> {
  if (options === null || typeof options !== 'object')
    throw new TypeError('createPublisher: expected an options object { endpoint, topic }');
  const { endpoint, topic, sendHighWaterMark, telemetryTopic = 'telemetry', eventsTopic = 'events', lingerMs = 1000 } = options;
  if (typeof endpoint !== 'string' || !ENDPOINT.test(endpoint)) {
    throw new TypeError(
      `createPublisher: expected endpoint like tcp://host:port, ipc://path or inproc://name but received ${JSON.stringify(endpoint)}`,
    );
  }
  for (const [name, value] of [
    ['topic', topic],
    ['telemetryTopic', telemetryTopic],
    ['eventsTopic', eventsTopic],
  ] as const) {
    if (typeof value !== 'string' || value.length === 0) {
      throw new TypeError(`createPublisher: expected a non-empty string for ${name} but received ${JSON.stringify(value)}`);
    }
  }
  if (!Number.isInteger(lingerMs) || lingerMs < 0)
    throw new RangeError(`createPublisher: expected integer >= 0 for lingerMs but received ${lingerMs}`);
  if (!Number.isInteger(sendHighWaterMark) || sendHighWaterMark < 0) {
    throw new RangeError(`createPublisher: expected integer >= 0 for sendHighWaterMark but received ${sendHighWaterMark}`);
  }

  const socket = new PubSocket({ sendHighWaterMark, linger: 0 });
  try {
    await socket.bind(endpoint);
  } catch (err) {
    socket.close();
    const code = (err as { code?: string }).code;
    throw new Error(`publisher: cannot bind ${endpoint}${code ? ` (${code})` : ''}: ${(err as Error).message}`, { cause: err });
  }
  const bound = socket.lastEndpoint ?? endpoint;
  const topicFrame = Buffer.from(topic);
  const telemetryFrame = Buffer.from(telemetryTopic);
  const eventsFrame = Buffer.from(eventsTopic);

  let seq = 0;
  let closed = false;
  let lock: Promise<unknown> = Promise.resolve();
  // Runs `send` after every earlier send has settled; a failed send does not block later ones.
  const serialised = (send: () => Promise<void>): Promise<void> => {
    if (closed) return Promise.reject(new Error(`publisher ${bound}: send after close`));
    const next = lock.then(send);
    lock = next.catch(() => undefined);
    return next;
  };

  const stage: PublisherStage = {
    name: 'publish',
    endpoint: bound,
    topic,
    get sent() {
      return seq;
    },
    process(msg: ActionMessage, ctx: StageContext): Promise<ActionMessage> {
      return serialised(async () => {
        const header: WireHeader = {
          schema_id: msg.schemaId,
          seq,
          frame_id: msg.frameId,
          source_id: msg.sourceId,
          capture_wall_ms: msg.captureWallMs,
          publish_wall_ms: ctx.clock.wallMs(),
        };
        await socket.send([topicFrame, JSON.stringify(header), JSON.stringify(msg.action)]);
        seq += 1;
      }).then(() => msg);
    },
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      await lock;
      // Queued actions still go out to connected subscribers for up to lingerMs (with linger 0
      // the last actions of a run would vanish silently at shutdown); then they are dropped.
      socket.linger = lingerMs;
      // close() releases the endpoint later, on ZeroMQ's reaper thread; unbind first so the
      // address is free when close() resolves (a restart can bind it again at once).
      await socket.unbind(bound).catch(() => undefined);
      socket.close();
    },
  };

  let undelivered = 0;
  const publish = (event: TelemetryEvent): Promise<void> => {
    const frame = event.type === 'stats' ? telemetryFrame : DECISIONS.has(event.type) ? eventsFrame : undefined;
    if (!frame) return Promise.resolve();
    return serialised(() => socket.send([frame, eventToJson(event)]));
  };
  const sink: PublisherSink = {
    publish,
    accept: (event) => void publish(event).catch(() => void (undelivered += 1)),
    get undelivered() {
      return undelivered;
    },
  };
  return { stage, sink };
}
