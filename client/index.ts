// percept/client: subscribe to a running percept's action stream from TypeScript.
//
//   import { subscribe } from 'percept/client';
//   const sub = subscribe({ connect: 'tcp://127.0.0.1:5556', topics: ['actions', 'events'] });
//   for await (const m of sub) {
//     if (m.type === 'action' && !m.stale) drive(m.action);   // m.action: RobotAction, validated
//     if (m.type === 'event' && m.event.type === 'end') break; // the run's final summary
//   }
//   sub.close();
//
// Every message is validated: the header against configs/wire/header.schema.json, an action body
// against the action schema, events and telemetry against configs/wire/messages.schema.json.
// The action schema's $id must be the header's schema_id. What fails is yielded as
// { type: 'invalid', reason } and counted, never as an action.
// Per topic and run, `lost` counts the seq numbers that never arrived since the first message seen.
// On a real clock an action is `stale` once its frame's deadline has passed. A replay's times are not
// wall times, so on a virtual clock `stale` is null.
// Types come from the schemas through the generated client/wire-types.ts. The tests fail when they drift.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Ajv, type ValidateFunction } from 'ajv';
import { Subscriber, curveKeyPair } from 'zeromq';
import type { ActionHeader, Event, MessageHeader, RobotAction, Telemetry } from './wire-types.ts';

export type * from './wire-types.ts';

export interface SubscribeOptions {
  /** The publisher's endpoint (default tcp://127.0.0.1:5556, percept's default). */
  readonly connect?: string;
  /** Topics to receive from actions, events and telemetry. Default ['actions']. */
  readonly topics?: readonly string[];
  /** The actions topic's name when the publisher renamed it (default 'actions'). */
  readonly actionsTopic?: string;
  /** The action schema file (default percept's configs/actions/robot-action.schema.json). */
  readonly actionSchema?: string;
  /** The publisher's CURVE public key (Z85, 40 characters) when it encrypts. */
  readonly serverKey?: string;
  /** ZeroMQ receive queue (default 10000). */
  readonly receiveHighWaterMark?: number;
}

interface Received {
  readonly topic: string;
  /** Messages of this topic and run that never arrived, between the previous one and this one. */
  readonly lost: number;
}
export interface ActionMessage<A = RobotAction> extends Received {
  readonly type: 'action';
  readonly header: ActionHeader;
  readonly action: A;
  /** Past its deadline (valid_until_wall_ms) when it arrived. Null on a virtual clock. */
  readonly stale: boolean | null;
  /** Arrival − capture, ms; null on a virtual clock. */
  readonly ageMs: number | null;
}
export interface EventMessage extends Received {
  readonly type: 'event';
  readonly header: MessageHeader;
  readonly event: Event;
}
export interface TelemetryMessage extends Received {
  readonly type: 'telemetry';
  readonly header: MessageHeader;
  readonly telemetry: Telemetry;
}
export interface InvalidMessage {
  readonly type: 'invalid';
  readonly topic: string;
  readonly reason: string;
  readonly frames: readonly Buffer[];
}
export type Message<A = RobotAction> = ActionMessage<A> | EventMessage | TelemetryMessage | InvalidMessage;

export interface TopicCounts {
  received: number;
  lost: number;
  invalid: number;
  stale: number;
}

export interface Subscription<A = RobotAction> extends AsyncIterable<Message<A>> {
  /** Per topic: messages received, lost to seq gaps, invalid, and stale actions. */
  readonly counts: Readonly<Record<string, Readonly<TopicCounts>>>;
  close(): void;
}

const here = (path: string): string => fileURLToPath(new URL(path, import.meta.url));
const readJson = (path: string): object => JSON.parse(readFileSync(path, 'utf8')) as object;

export function subscribe<A = RobotAction>(options: SubscribeOptions = {}): Subscription<A> {
  const {
    connect = 'tcp://127.0.0.1:5556',
    topics = ['actions'],
    actionsTopic = 'actions',
    actionSchema = here('../configs/actions/robot-action.schema.json'),
    serverKey,
    receiveHighWaterMark = 10_000,
  } = options;
  if (!Array.isArray(topics) || topics.length === 0) throw new TypeError('subscribe: expected topics to be a non-empty array');
  const v = validators(actionSchema);
  const socket = new Subscriber({
    receiveHighWaterMark,
    linger: 0,
    ...(serverKey ? { curveServerKey: serverKey, ...ownKeys() } : {}),
  });
  socket.connect(connect);
  for (const topic of topics) socket.subscribe(topic);

  const counts: Record<string, TopicCounts> = {};
  const next = new Map<string, { runId: string; seq: number }>(); // topic → the seq expected next
  const countsOf = (topic: string): TopicCounts => (counts[topic] ??= { received: 0, lost: 0, invalid: 0, stale: 0 });

  function decode(frames: Buffer[]): Message<A> {
    const topic = frames[0]?.toString() ?? '';
    const c = countsOf(topic);
    const invalid = (reason: string): InvalidMessage => {
      c.invalid += 1;
      return { type: 'invalid', topic, reason, frames };
    };
    if (frames.length !== 3) return invalid(`expected [topic, header, body], got ${frames.length} frames`);
    let header: unknown;
    let body: unknown;
    try {
      header = JSON.parse(frames[1]!.toString());
      body = JSON.parse(frames[2]!.toString());
    } catch (err) {
      return invalid(`not JSON: ${(err as Error).message}`);
    }
    const isAction = topic === actionsTopic;
    const headerCheck = isAction ? v.actionHeader : v.messageHeader;
    if (!headerCheck(header)) return invalid(`header: ${describe(headerCheck)}`);
    const h = header as ActionHeader | MessageHeader;
    // Seq gaps, per topic and run.
    const expected = next.get(topic);
    const lost = expected && expected.runId === h.run_id && h.seq > expected.seq ? h.seq - expected.seq : 0;
    next.set(topic, { runId: h.run_id, seq: h.seq + 1 });
    c.received += 1;
    c.lost += lost;
    if (isAction) {
      const ah = h as ActionHeader;
      if (ah.schema_id !== v.actionSchemaId) return invalid(`schema_id ${ah.schema_id} is not the action schema's $id ${v.actionSchemaId}`);
      if (!v.action(body)) return invalid(`action: ${describe(v.action)}`);
      const real = ah.clock === 'real';
      const now = Date.now();
      const stale = real ? now > ah.valid_until_wall_ms! : null;
      if (stale) c.stale += 1;
      return { type: 'action', topic, lost, header: ah, action: body as A, stale, ageMs: real ? now - ah.capture_wall_ms! : null };
    }
    const mh = h as MessageHeader;
    if (mh.schema_id.endsWith('/Telemetry')) {
      if (!v.telemetry(body)) return invalid(`telemetry: ${describe(v.telemetry)}`);
      return { type: 'telemetry', topic, lost, header: mh, telemetry: body as Telemetry };
    }
    if (!v.event(body)) return invalid(`event: ${describe(v.event)}`);
    return { type: 'event', topic, lost, header: mh, event: body as Event };
  }

  return {
    counts,
    close: () => socket.close(),
    async *[Symbol.asyncIterator]() {
      try {
        for (;;) {
          let frames: Buffer[];
          try {
            frames = await socket.receive();
          } catch (err) {
            if (socket.closed) return;
            throw err;
          }
          yield decode(frames);
        }
      } finally {
        // Leaving the loop (break, return, throw) ends the subscription.
        if (!socket.closed) socket.close();
      }
    },
  };
}

/** A CURVE client's own key pair, made per subscription. The publisher authenticates by its own
 * key, and clients are not identified. */
function ownKeys(): { curvePublicKey: string; curveSecretKey: string } {
  const { publicKey, secretKey } = curveKeyPair();
  return { curvePublicKey: publicKey, curveSecretKey: secretKey };
}

interface Validators {
  readonly actionHeader: ValidateFunction;
  readonly messageHeader: ValidateFunction;
  readonly event: ValidateFunction;
  readonly telemetry: ValidateFunction;
  readonly action: ValidateFunction;
  readonly actionSchemaId: string;
}

function validators(actionSchemaPath: string): Validators {
  const ajv = new Ajv({ strict: true, allErrors: true });
  ajv.addSchema(readJson(here('../configs/wire/header.schema.json')));
  ajv.addSchema(readJson(here('../configs/wire/messages.schema.json')));
  const actionSchema = readJson(actionSchemaPath) as Record<string, unknown>;
  const actionSchemaId = actionSchema.$id;
  if (typeof actionSchemaId !== 'string') throw new Error(`subscribe: the action schema ${actionSchemaPath} has no $id`);
  const get = (ref: string): ValidateFunction => ajv.getSchema(ref)!;
  return {
    actionHeader: get('percept/wire/header/v1#/definitions/ActionHeader'),
    messageHeader: get('percept/wire/header/v1#/definitions/MessageHeader'),
    event: get('percept/wire/messages/v1#/definitions/Event'),
    telemetry: get('percept/wire/messages/v1#/definitions/Telemetry'),
    action: ajv.compile(actionSchema),
    actionSchemaId,
  };
}

function describe(validate: ValidateFunction): string {
  return (validate.errors ?? []).map((e) => `${e.instancePath || '(root)'} ${e.message ?? e.keyword}`).join('; ');
}
