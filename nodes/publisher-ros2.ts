// publisher-ros2: validated actions, their targets and the graph's decisions as ROS 2 topics over DDS (Cyclone DDS,
// native/dds), so ROS 2 nodes subscribe without a bridge. It runs beside the ZeroMQ publisher, after it in the chain.
//   /percept/actions     std_msgs/msg/String: {"header": …, "body": …}, the ZeroMQ wire's v1 header and action
//   /percept/detections  vision_msgs/msg/Detection2DArray: the target, bbox in pixels, stamped with its frame
//   /diagnostics         diagnostic_msgs/msg/DiagnosticArray: each event, stats, and the run's end summary
// The stage only serializes and queues: writes go out on the addon's thread. Topics and QoS: docs/ros2.md
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageWriter } from '@foxglove/rosmsg2-serialization';
import { DdsParticipant, ROS2_DEFAULT_QOS, type DdsQos, type DdsWriter } from '../native/dds/binding.ts';
import type { ActionMessage } from './payloads.ts';
import { actionFrameFields, closeHeader, headerCommon, headerHead, unixMs } from './action-header.ts';
import { RealClock, type Clock } from '../pipeline/clock.ts';
import { eventToJson, type RunSummary, type TelemetryEvent, type TelemetrySink } from '../pipeline/telemetry/events.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';

const EVENT_SCHEMA_ID = 'percept/wire/messages/v1#/definitions/Event';
/** Frames remembered for their detections' pixel size at most. */
const MAX_FRAMES_TRACKED = 1024;

/** The ROS 2 message types this publisher writes. */
export const ROS2_PUBLISHED_TYPES = [
  'std_msgs/msg/String',
  'vision_msgs/msg/Detection2DArray',
  'diagnostic_msgs/msg/DiagnosticArray',
] as const;
export type Ros2PublishedType = (typeof ROS2_PUBLISHED_TYPES)[number];

export interface Ros2Topics {
  readonly actions: string;
  readonly detections: string;
  readonly diagnostics: string;
}
export const DEFAULT_ROS2_TOPICS: Ros2Topics = {
  actions: '/percept/actions',
  detections: '/percept/detections',
  diagnostics: '/diagnostics',
};

export interface Ros2PublisherOptions {
  /** ROS_DOMAIN_ID. */
  readonly domainId: number;
  /** Cyclone DDS XML or file:// URI; '' (default): CYCLONEDDS_URI when set, else loopback only. */
  readonly cyclonedds?: string;
  readonly topics?: Partial<Ros2Topics>;
  /** Per topic; default ROS 2's default profile (reliable, volatile, keep last 10). */
  readonly qos?: Partial<Record<keyof Ros2Topics, DdsQos>>;
  /** The ros2msg definitions (rosbag2's text: the type, then its dependencies) of ROS2_PUBLISHED_TYPES. */
  readonly definitions: Readonly<Record<Ros2PublishedType, string>>;
  /** The run's id, as the ZeroMQ publisher's: the same action carries the same header on both. */
  readonly runId: string;
  readonly clock?: Clock;
  /** Role → model id, copied into every action header. */
  readonly models?: Readonly<Record<string, string>>;
  /** Samples waiting for DDS, all topics together (default 1024); past it the oldest is dropped and counted. */
  readonly queueCapacity?: number;
  /** How long close() waits for queued samples and reliable readers' acknowledgements (ms, default 2000). */
  readonly lingerMs?: number;
}

export type Ros2PublisherStage = Stage<ActionMessage, ActionMessage>;

/** A topic's counters, in the ZeroMQ publisher's shape (PublisherCounters) so run summaries list both alike. */
export interface Ros2TopicCounters {
  readonly accepted: number;
  readonly sent: number;
  /** Dropped from the write queue, refused by DDS, or left unsent at close. */
  readonly dropped: number;
  readonly queued: number;
  readonly highWaterMark: number;
}

export interface Ros2Publisher {
  readonly stage: Ros2PublisherStage;
  readonly sink: TelemetrySink & { readonly accept: (event: TelemetryEvent) => void };
  /** The pixel size of a frame in the graph, for its action's detection (bbox in pixels). */
  noteFrame(frameId: number, size: { readonly width: number; readonly height: number } | undefined): void;
  /** Per ROS 2 topic, keyed `ros2:/topic`. */
  stats(): Record<string, Ros2TopicCounters>;
  /** Readers matched on each topic now. */
  matched(): Record<keyof Ros2Topics, number>;
  /** Publishes the end summary on /diagnostics, waits up to lingerMs for delivery, leaves the domain. Idempotent. */
  close(summary?: RunSummary): Promise<Record<string, Ros2TopicCounters>>;
}

/** Joins the DDS domain (building the DDS addon on first use) and creates the three writers. */
export async function createRos2Publisher(options: Ros2PublisherOptions): Promise<Ros2Publisher> {
  if (options === null || typeof options !== 'object')
    throw new TypeError('createRos2Publisher: expected an options object { domainId, runId }');
  const { runId, lingerMs = 2000, queueCapacity = 1024 } = options;
  if (typeof runId !== 'string' || runId === '')
    throw new TypeError(`createRos2Publisher: expected a non-empty runId but received ${JSON.stringify(runId)}`);
  if (!Number.isInteger(lingerMs) || lingerMs < 0)
    throw new RangeError(`createRos2Publisher: expected integer >= 0 for lingerMs but received ${lingerMs}`);
  for (const type of ROS2_PUBLISHED_TYPES)
    if (typeof options.definitions?.[type] !== 'string') throw new TypeError(`createRos2Publisher: definitions lacks ${type}`);
  const topics = { ...DEFAULT_ROS2_TOPICS, ...options.topics };
  const participant = await DdsParticipant.open({ domainId: options.domainId, config: options.cyclonedds ?? '', queueCapacity });
  try {
    const qos = (name: keyof Ros2Topics): DdsQos => options.qos?.[name] ?? ROS2_DEFAULT_QOS;
    const writers = {
      actions: participant.createWriter(topics.actions, 'std_msgs/msg/String', qos('actions')),
      detections: participant.createWriter(topics.detections, 'vision_msgs/msg/Detection2DArray', qos('detections')),
      diagnostics: participant.createWriter(topics.diagnostics, 'diagnostic_msgs/msg/DiagnosticArray', qos('diagnostics')),
    };
    return new DdsRos2Publisher(options, participant, writers, queueCapacity, lingerMs);
  } catch (err) {
    participant.close();
    throw err;
  }
}

const writerFor = (definition: string): MessageWriter => new MessageWriter(parseRosMsg(definition, { ros2: true }));
/** A Unix ns instant as builtin_interfaces/Time. */
const rosTime = (unixNs: bigint): { sec: number; nanosec: number } => ({
  sec: Number(unixNs / 1_000_000_000n),
  nanosec: Number(unixNs % 1_000_000_000n),
});

/** diagnostic_msgs/msg/DiagnosticStatus levels. */
const LEVEL = { OK: 0, WARN: 1, ERROR: 2 } as const;

class DdsRos2Publisher implements Ros2Publisher {
  readonly stage: Ros2PublisherStage;
  readonly sink: Ros2Publisher['sink'];
  readonly #participant: DdsParticipant;
  readonly #writers: Record<keyof Ros2Topics, DdsWriter>;
  readonly #serialize: { string: MessageWriter; detections: MessageWriter; diagnostics: MessageWriter };
  readonly #clock: Clock;
  readonly #virtual: boolean;
  readonly #runId: string;
  readonly #common: string;
  readonly #modelsJson: string;
  readonly #capacity: number;
  readonly #lingerMs: number;
  readonly #accepted: Record<keyof Ros2Topics, number> = { actions: 0, detections: 0, diagnostics: 0 };
  readonly #frameSizes = new Map<number, { width: number; height: number } | undefined>();
  #undelivered = 0;
  #closing = false;
  #closed: Promise<Record<string, Ros2TopicCounters>> | undefined;
  #final: Record<string, Ros2TopicCounters> | undefined;

  constructor(
    options: Ros2PublisherOptions,
    participant: DdsParticipant,
    writers: Record<keyof Ros2Topics, DdsWriter>,
    capacity: number,
    lingerMs: number,
  ) {
    this.#participant = participant;
    this.#writers = writers;
    this.#capacity = capacity;
    this.#lingerMs = lingerMs;
    this.#clock = options.clock ?? new RealClock();
    this.#virtual = this.#clock.virtual;
    this.#runId = options.runId;
    this.#common = headerCommon(options.runId, this.#virtual);
    this.#modelsJson = JSON.stringify(options.models ?? {});
    this.#serialize = {
      string: writerFor(options.definitions['std_msgs/msg/String']),
      detections: writerFor(options.definitions['vision_msgs/msg/Detection2DArray']),
      diagnostics: writerFor(options.definitions['diagnostic_msgs/msg/DiagnosticArray']),
    };
    this.stage = { name: 'publish-ros2', process: (msg, ctx) => this.#publish(msg, ctx) };
    const undelivered = (): number => this.#undelivered;
    this.sink = {
      accept: (event) => this.#accept(event),
      get undelivered() {
        return undelivered();
      },
    };
  }

  noteFrame(frameId: number, size: { readonly width: number; readonly height: number } | undefined): void {
    this.#frameSizes.set(frameId, size && { width: size.width, height: size.height });
    // Frames the graph never ends (none should) cannot pile up.
    if (this.#frameSizes.size > MAX_FRAMES_TRACKED) this.#frameSizes.delete(this.#frameSizes.keys().next().value!);
  }

  stats(): Record<string, Ros2TopicCounters> {
    if (this.#final) return this.#final;
    return Object.fromEntries(
      (Object.keys(this.#writers) as (keyof Ros2Topics)[]).map((name) => {
        const writer = this.#writers[name];
        const s = writer.stats();
        return [
          `ros2:${writer.topic}`,
          {
            accepted: this.#accepted[name],
            sent: s.written,
            dropped: s.dropped + s.failed,
            queued: s.queued,
            highWaterMark: this.#capacity,
          },
        ];
      }),
    );
  }

  matched(): Record<keyof Ros2Topics, number> {
    const w = this.#writers;
    return { actions: w.actions.matched(), detections: w.detections.matched(), diagnostics: w.diagnostics.matched() };
  }

  close(summary?: RunSummary): Promise<Record<string, Ros2TopicCounters>> {
    return (this.#closed ??= this.#close(summary));
  }

  async #close(summary?: RunSummary): Promise<Record<string, Ros2TopicCounters>> {
    if (summary) this.#diagnose(this.#clock.nowNs(), endStatus(summary, this.#runId));
    this.#closing = true;
    await this.#participant.drain(this.#lingerMs);
    // Read after closing: the write in flight has finished, and what the queue still held counts as dropped.
    this.#participant.close();
    this.#final = this.stats();
    return this.#final;
  }

  #publish(msg: ActionMessage, ctx: StageContext): Promise<ActionMessage> {
    if (this.#closing) return Promise.reject(new Error('ros2 publisher: publish after close'));
    const frame = ctx.frame;
    const virtual = this.#virtual;
    const seq = this.#accepted.actions++;
    // The ZeroMQ wire's ActionHeader (configs/wire/header.schema.json), by the same functions.
    const head = headerHead(msg.schemaId, this.#common) + actionFrameFields(msg, frame, virtual, this.#modelsJson);
    const header = closeHeader(head, seq, virtual ? unixMs(ctx.clock, ctx.clock.nowNs()) : undefined);
    const data = `{"header":${header},"body":${JSON.stringify(msg.action)}}`;
    this.#writers.actions.write(this.#serialize.string.writeMessage({ data }));
    const stamp = rosTime(frame.stampNs ?? ctx.clock.unixNs(frame.captureNs));
    const size = this.#frameSizes.get(msg.frameId);
    this.#frameSizes.delete(msg.frameId);
    this.#accepted.detections += 1;
    this.#writers.detections.write(this.#serialize.detections.writeMessage(detectionArray(msg, stamp, size)));
    return Promise.resolve(msg);
  }

  #accept(event: TelemetryEvent): void {
    const status = eventStatus(event, this.#runId);
    if (!status) return;
    if (this.#closing) {
      this.#undelivered += 1;
      return;
    }
    this.#diagnose(event.atNs, status);
  }

  #diagnose(atNs: bigint, status: DiagnosticStatus): void {
    this.#accepted.diagnostics += 1;
    const header = { stamp: rosTime(this.#clock.unixNs(atNs)), frame_id: '' };
    this.#writers.diagnostics.write(this.#serialize.diagnostics.writeMessage({ header, status: [status] }));
  }
}

interface DiagnosticStatus {
  readonly level: number;
  readonly name: string;
  readonly message: string;
  readonly hardware_id: string;
  readonly values: readonly { readonly key: string; readonly value: string }[];
}

/** Every field of a JSON object as diagnostic_msgs/msg/KeyValue: strings as they are, anything else as JSON. */
function keyValues(json: Record<string, unknown>): DiagnosticStatus['values'] {
  return Object.entries(json).map(([key, value]) => ({ key, value: typeof value === 'string' ? value : JSON.stringify(value) }));
}

/** The /diagnostics status of an event the ZeroMQ events and telemetry topics carry; undefined for the rest. */
export function eventStatus(event: TelemetryEvent, runId: string): DiagnosticStatus | undefined {
  const json = JSON.parse(eventToJson(event)) as Record<string, unknown>;
  const status = (level: number, message: string): DiagnosticStatus => ({
    level,
    name: `percept: ${event.type}`,
    message,
    hardware_id: runId,
    values: [...keyValues(json), { key: 'schema_id', value: EVENT_SCHEMA_ID }],
  });
  switch (event.type) {
    case 'drop':
      return status(
        LEVEL.WARN,
        `frame ${event.frameId} dropped at ${event.stage}: ${event.reason}${event.detail ? ` (${event.detail})` : ''}`,
      );
    case 'cancel':
      return status(LEVEL.WARN, `frame ${event.frameId} cancelled in ${event.stage}: ${event.reason}`);
    case 'degrade':
      return status(LEVEL.WARN, `degrade ladder step at frame ${event.frameId}`);
    case 'error':
      return status(LEVEL.ERROR, `${event.stage}: ${event.message}`);
    case 'source':
      return status(LEVEL.WARN, `source ${event.sourceId} ${event.kind}: ${event.detail}`);
    case 'control':
      return status(LEVEL.OK, `control ${event.command}: ${event.detail}`);
    case 'stats': {
      const f = event.summary.frames;
      return {
        level: LEVEL.OK,
        name: 'percept: stats',
        message: `frames in ${f.in}, out ${f.out}, dropped ${f.dropped}`,
        hardware_id: runId,
        values: keyValues({ ...event.summary }),
      };
    }
    default:
      return undefined;
  }
}

/** The run's end: OK, or ERROR when its source failed. The summary's fields are the values. */
function endStatus(summary: RunSummary, runId: string): DiagnosticStatus {
  const f = summary.frames;
  return {
    level: summary.endReason === 'source_error' ? LEVEL.ERROR : LEVEL.OK,
    name: 'percept: end',
    message: `run ended (${summary.endReason ?? 'unknown'}): frames in ${f.in}, out ${f.out}, dropped ${f.dropped}`,
    hardware_id: runId,
    values: keyValues({ ...summary }),
  };
}

type Ros2Time = { sec: number; nanosec: number };

/** vision_msgs/msg/Detection2DArray (vision_msgs 4.x, ROS 2 Humble on) of one action: its target, if it names one, as one
 * detection (class_id the label, score the confidence, bbox [x0, y0, x1, y1] in 0..1 scaled to pixels); none otherwise. */
export function detectionArray(msg: ActionMessage, stamp: Ros2Time, size: { width: number; height: number } | undefined): object {
  const header = { stamp, frame_id: msg.sourceId };
  const a = (msg.action ?? {}) as { confidence?: unknown; target?: { label?: unknown; bbox?: unknown } };
  const target = a.target;
  if (!target || typeof target.label !== 'string' || target.label === 'none' || !size) return { header, detections: [] };
  const bbox =
    Array.isArray(target.bbox) && target.bbox.length === 4 && target.bbox.every((v) => typeof v === 'number')
      ? (target.bbox as number[])
      : [0, 0, 1, 1];
  const [x0, y0, x1, y1] = [bbox[0]! * size.width, bbox[1]! * size.height, bbox[2]! * size.width, bbox[3]! * size.height];
  const zero3 = { x: 0, y: 0, z: 0 };
  return {
    header,
    detections: [
      {
        header,
        results: [
          {
            hypothesis: { class_id: target.label, score: typeof a.confidence === 'number' ? a.confidence : 0 },
            pose: { pose: { position: zero3, orientation: { ...zero3, w: 1 } }, covariance: new Float64Array(36) },
          },
        ],
        bbox: {
          center: { position: { x: (x0 + x1) / 2, y: (y0 + y1) / 2 }, theta: 0 },
          size_x: Math.abs(x1 - x0),
          size_y: Math.abs(y1 - y0),
        },
        id: String(msg.frameId),
      },
    ],
  };
}
