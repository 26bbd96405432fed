// recorder: a run's MCAP recording, readable by Foxglove and by `percept eval`, even after a crash.
// Topics /frames, /actions, /events and /stats. Chunks close on time as well as size.
// Profile 'ros2': the MCAP ros2 profile instead (ROS2_TOPICS; sensor_msgs images, std_msgs/msg/String JSON; all CDR), for rosbag2.
// Calls are serialised on one promise chain. After a write fails, every later call rejects with that first error (`failure`).
// Layout, times, chunks and backpressure: nodes/README.md#recorder
import { open, stat, statfs, unlink } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { FileHandle } from 'node:fs/promises';
import type { McapTypes } from '@mcap/core';
import * as zstd from '@foxglove/wasm-zstd';
import { CompressedImage, RawImage } from '@foxglove/schemas/jsonschema.js';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageWriter } from '@foxglove/rosmsg2-serialization';
import type { ActionSchema } from './action-schema.ts';
import { ChunkedMcapFile } from './mcap-write.ts';
import type { ActionMessage, CameraFrame } from './payloads.ts';

export const FRAMES_TOPIC = '/frames';
export const ACTIONS_TOPIC = '/actions';
export const EVENTS_TOPIC = '/events';
export const STATS_TOPIC = '/stats';

/** The topics of a `profile: 'ros2'` recording (ROS 2 names, as `ros2 bag play` republishes them). */
export const ROS2_TOPICS = {
  /** sensor_msgs/msg/CompressedImage: JPEG and PNG frames. */
  compressed: '/percept/camera/compressed',
  /** sensor_msgs/msg/Image: raw frames. */
  raw: '/percept/camera/image_raw',
  /** std_msgs/msg/String, data = the action JSON. */
  actions: '/percept/actions',
  /** std_msgs/msg/String, data = a telemetry event's JSON. */
  events: '/percept/events',
  /** std_msgs/msg/String, data = a summary's JSON. */
  stats: '/percept/stats',
} as const;

/** The recording's layout: '' (default) Foxglove JSON; 'ros2' the MCAP ros2 profile (ros2msg schemas, CDR messages). */
export type RecorderProfile = '' | 'ros2';

const ROS_DEPENDENCIES = `================================================================================
MSG: std_msgs/Header
builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec
`;

/** The ros2msg schema texts as rosbag2 stores them: the type's .msg, then each dependency after a '=' line and `MSG: pkg/Type`. */
export const ROS2_DEFINITIONS = {
  'sensor_msgs/msg/CompressedImage': `std_msgs/Header header
string format
uint8[] data
${ROS_DEPENDENCIES}`,
  'sensor_msgs/msg/Image': `std_msgs/Header header
uint32 height
uint32 width
string encoding
uint8 is_bigendian
uint32 step
uint8[] data
${ROS_DEPENDENCIES}`,
  'std_msgs/msg/String': 'string data\n',
} as const;

/** offered_qos_profiles of every channel of a ros2 recording: one reliable, volatile, keep-last publisher with
 * default deadline, lifespan and liveliness, in the YAML rosbag2 writes (enum values as numbers:
 * history 1 keep_last, reliability 1 reliable, durability 2 volatile, liveliness 1 automatic). */
export const ROS2_OFFERED_QOS = `- history: 1
  depth: 10
  reliability: 1
  durability: 2
  deadline:
    sec: 9223372036
    nsec: 854775807
  lifespan:
    sec: 9223372036
    nsec: 854775807
  liveliness: 1
  liveliness_lease_duration:
    sec: 9223372036
    nsec: 854775807
  avoid_ros_namespace_conventions: false
`;

export interface RecorderOptions {
  /** Output .mcap file (created or truncated). */
  readonly path: string;
  /** The action schema, loaded once with loadActionSchema: its file becomes the /actions channel schema. */
  readonly actionSchema: ActionSchema;
  /** 'zstd' (default) or 'none'. */
  readonly compression?: 'zstd' | 'none';
  /** zstd level (default 1: frames are mostly JPEG, which does not compress). */
  readonly zstdLevel?: number;
  /** A chunk is written when it spans this much log time (default 1000 ms). */
  readonly chunkMs?: number;
  /** … or holds this many uncompressed bytes (default 32 MiB). */
  readonly chunkBytes?: number;
  /** Real clock: a chunk is written at the latest this long (wall time) after its first message. Default: chunkMs.
   * null: never by wall time, as for a virtual-clock run, whose file must not depend on how fast it ran. */
  readonly flushAfterMs?: number | null;
  /** Frame bytes waiting to be written beyond which a frame is not recorded (default 256 MiB). */
  readonly maxPendingBytes?: number;
  /** MCAP header.library (default "percept recorder"). */
  readonly library?: string;
  /** '' (default): Foxglove JSON on /frames, /actions, /events, /stats. 'ros2': the MCAP ros2 profile on ROS2_TOPICS,
   * every channel ros2msg/cdr (sensor_msgs images, std_msgs/msg/String JSON), so rosbag2 can play it. */
  readonly profile?: RecorderProfile;
  /** Called once, at the first write that fails (the recording stops there), with that error. */
  readonly onFailure?: ((failure: Error) => void) | null;
}

export interface RecorderCounts {
  readonly frames: number;
  readonly actions: number;
  readonly events: number;
  readonly stats: number;
  /** Frames not recorded because `maxPendingBytes` of frames were waiting to be written. */
  readonly framesNotRecorded: number;
  readonly chunks: number;
}

/** Where a message came from: its frame, the frame's stamp and the source. */
export interface RecordedFrameMeta {
  readonly frameId: number;
  readonly sourceId: string;
  /** The input's stamp, Unix ns (publish_time). */
  readonly stampNs: bigint;
}

export interface Recorder {
  readonly path: string;
  readonly counts: RecorderCounts;
  /** The first write error (the file is unusable after it), if any. */
  readonly failure: Error | undefined;
  /** Bytes handed to the file. */
  readonly bytesWritten: number;
  /** After a failure: bytes recorded that never reached the file (the failed write's, the open chunk's and every
   * message's since). 0 while the recording is sound. */
  readonly bytesLost: number;
  writeMetadata(name: string, entries: Readonly<Record<string, string>>): Promise<void>;
  /** Resolves false when the frame was not recorded (too many frame bytes waiting). */
  recordFrame(frame: CameraFrame, meta: RecordedFrameMeta, logTimeNs: bigint): Promise<boolean>;
  recordAction(msg: ActionMessage, stampNs: bigint, logTimeNs: bigint): Promise<void>;
  /** `stampNs`: the stamp of the frame the event is about (publish_time; default logTimeNs). */
  recordEvent(event: object, logTimeNs: bigint, stampNs?: bigint): Promise<void>;
  recordStats(summary: object, logTimeNs: bigint): Promise<void>;
  /** Waits for pending writes, writes the last chunk and the summary, closes the file. Idempotent. */
  close(): Promise<void>;
}

/** RecorderOptions with every default filled in, as checkRecorderOptions returns them. */
export type CheckedRecorderOptions = Required<RecorderOptions>;

/** Checks `options` and fills in the defaults; throws naming the first bad option. */
export function checkRecorderOptions(options: RecorderOptions): CheckedRecorderOptions {
  if (options === null || typeof options !== 'object') throw new TypeError('createRecorder: expected an options object { path }');
  const {
    path,
    actionSchema,
    compression = 'zstd',
    zstdLevel = 1,
    chunkMs = 1000,
    chunkBytes = 32 * 1024 * 1024,
    maxPendingBytes = 256 * 1024 * 1024,
    library = 'percept recorder',
    profile = '',
    onFailure = null,
  } = options;
  const flushAfterMs = options.flushAfterMs === undefined ? chunkMs : options.flushAfterMs;
  if (typeof path !== 'string' || path.length === 0)
    throw new TypeError(`createRecorder: expected a non-empty path but received ${JSON.stringify(path)}`);
  if (compression !== 'zstd' && compression !== 'none') {
    throw new TypeError(`createRecorder: expected compression 'zstd' or 'none' but received ${JSON.stringify(compression)}`);
  }
  intAtLeast('chunkMs', chunkMs, 1);
  intAtLeast('chunkBytes', chunkBytes, 1024);
  intAtLeast('maxPendingBytes', maxPendingBytes, 0);
  intAtLeast('zstdLevel', zstdLevel, 1);
  if (flushAfterMs !== null && !(Number.isFinite(flushAfterMs) && flushAfterMs > 0))
    throw new RangeError(`createRecorder: expected flushAfterMs > 0 or null but received ${flushAfterMs}`);
  if (typeof actionSchema?.mcapSchema !== 'object')
    throw new TypeError('createRecorder: expected actionSchema to be the result of loadActionSchema()');
  if (onFailure !== null && typeof onFailure !== 'function') throw new TypeError('createRecorder: expected onFailure to be a function');
  if (profile !== '' && profile !== 'ros2')
    throw new TypeError(`createRecorder: expected profile '' or 'ros2' but received ${JSON.stringify(profile)}`);
  return { path, actionSchema, compression, zstdLevel, chunkMs, chunkBytes, flushAfterMs, maxPendingBytes, library, profile, onFailure };
}

function intAtLeast(name: string, value: number, least: number): void {
  if (!Number.isInteger(value) || value < least)
    throw new RangeError(`createRecorder: expected integer >= ${least} for ${name} but received ${value}`);
}

/** Path prefixes of kernel filesystems, where a "file" is an interface, not storage. */
const SPECIAL_PREFIXES = ['/proc/', '/sys/', '/dev/'];
/** Except these, which are ordinary (tmpfs) storage. */
const ORDINARY_UNDER_DEV = ['/dev/shm/'];
/** statfs f_type of filesystems that cannot hold a recording: proc, sysfs, devpts, debugfs, tracefs, securityfs,
 * cgroup, cgroup2, bpf, configfs, pstore, efivarfs. */
const SPECIAL_FS_TYPES: ReadonlyMap<number, string> = new Map([
  [0x9fa0, 'proc'],
  [0x62656572, 'sysfs'],
  [0x1cd1, 'devpts'],
  [0x64626720, 'debugfs'],
  [0x74726163, 'tracefs'],
  [0x73636673, 'securityfs'],
  [0x27e0eb, 'cgroup'],
  [0x63677270, 'cgroup2'],
  [0xcafe4a11, 'bpf'],
  [0x62656570, 'configfs'],
  [0x6165676c, 'pstore'],
  [0xde5e81e4, 'efivarfs'],
]);

/** Throws `recorder: cannot create PATH: why` when `path` cannot hold a recording: a path on a kernel filesystem
 * (/proc, /sys, /dev, or one whose statfs type says so), or an existing file that is not a regular file
 * (a directory, a device, a FIFO). Nothing is created. */
export async function checkRecordingPath(path: string): Promise<void> {
  const full = resolve(path);
  const refuse = (why: string): never => {
    throw new Error(`recorder: cannot create ${path}: ${why}`);
  };
  const prefix = SPECIAL_PREFIXES.find((p) => `${full}/`.startsWith(p));
  if (prefix && !ORDINARY_UNDER_DEV.some((p) => full.startsWith(p)))
    refuse(`${prefix} is a kernel filesystem, not storage (choose a path on a disk)`);
  const existing = await stat(full).catch(() => undefined);
  if (existing && !existing.isFile()) {
    const kind = existing.isDirectory() ? 'a directory' : existing.isFIFO() ? 'a FIFO' : existing.isSocket() ? 'a socket' : 'a device';
    refuse(`it is ${kind}, not a regular file`);
  }
  const fs = await statfs(existing ? full : resolve(full, '..')).catch(() => undefined);
  const special = fs ? SPECIAL_FS_TYPES.get(fs.type) : undefined;
  if (special) refuse(`it is on a ${special} filesystem, not storage (choose a path on a disk)`);
}

/** Creates (or truncates) the file and writes its header; throws naming the path when it cannot. */
export async function createRecorder(options: RecorderOptions): Promise<Recorder> {
  return McapRecorder.open(checkRecorderOptions(options));
}

class McapRecorder implements Recorder {
  readonly path: string;
  readonly #maxPendingBytes: number;
  readonly #flushAfterMs: number | null;
  readonly #handle: FileHandle;
  readonly #file: ChunkedMcapFile;
  readonly #eventsChannel: number;
  readonly #statsChannel: number;
  readonly #actionChannels: SourceChannels;
  readonly #compressedChannels: SourceChannels;
  readonly #rawChannels: SourceChannels;
  readonly #encoding: MessageEncoding;
  readonly #counts = { frames: 0, actions: 0, events: 0, stats: 0, framesNotRecorded: 0 };
  #pendingFrameBytes = 0;
  readonly #onFailure: ((failure: Error) => void) | null;
  /** Bytes of the messages refused after the failure. */
  #lostAfter = 0;
  #tail: Promise<unknown> = Promise.resolve();
  #failure: Error | undefined;
  #closing: Promise<void> | undefined;
  // The wall-time flush: armed while a chunk is open, disarmed when that chunk is written.
  #flushTimer: NodeJS.Timeout | undefined;
  #chunksSeen = 0;

  static async open(options: CheckedRecorderOptions): Promise<McapRecorder> {
    const { path, compression, zstdLevel } = options;
    if (compression === 'zstd') await zstd.isLoaded;
    await checkRecordingPath(path);
    let handle: FileHandle;
    try {
      handle = await open(path, 'w');
    } catch (err) {
      throw new Error(`recorder: cannot create ${path}: ${(err as Error).message}`, { cause: err });
    }
    // Checked again on what was opened: the path may have changed in between.
    const opened = await handle.stat();
    if (!opened.isFile()) {
      await handle.close().catch(() => undefined);
      throw new Error(`recorder: cannot create ${path}: it is not a regular file`);
    }
    const file = new ChunkedMcapFile(handle, {
      chunkMs: BigInt(options.chunkMs) * 1_000_000n,
      chunkBytes: options.chunkBytes,
      compress: compression === 'zstd' ? (data) => zstd.compress(data, zstdLevel) : undefined,
    });
    const recorder = new McapRecorder(options, handle, file);
    try {
      await recorder.#enqueue('start', () => file.start({ profile: options.profile, library: options.library }));
    } catch (err) {
      await handle.close().catch(() => undefined);
      // A file without even its header would be an empty recording.
      await unlink(path).catch(() => undefined);
      throw err;
    }
    return recorder;
  }

  private constructor(options: CheckedRecorderOptions, handle: FileHandle, file: ChunkedMcapFile) {
    this.path = options.path;
    this.#maxPendingBytes = options.maxPendingBytes;
    this.#flushAfterMs = options.flushAfterMs;
    this.#onFailure = options.onFailure;
    this.#handle = handle;
    this.#file = file;
    const schema = options.actionSchema;
    const actionMetadata = (sourceId: string): [string, string][] => [
      ['source_id', sourceId],
      ['schema_id', schema.wireSchemaId],
      ['schema_sha256', schema.sha256],
    ];
    if (options.profile === 'ros2') {
      // Every channel ros2msg/cdr: rosbag2 refuses a bag whose topics differ in serialization format.
      const rosSchema = (name: keyof typeof ROS2_DEFINITIONS): number =>
        file.registerSchema({ name, encoding: 'ros2msg', data: new TextEncoder().encode(ROS2_DEFINITIONS[name]) });
      const qos = (entries: [string, string][]): [string, string][] => [['offered_qos_profiles', ROS2_OFFERED_QOS], ...entries];
      const stringSchemaId = rosSchema('std_msgs/msg/String');
      const oneChannel = (topic: string): number =>
        file.registerChannel({ topic, schemaId: stringSchemaId, messageEncoding: 'cdr', metadata: new Map(qos([])) });
      this.#encoding = ROS2_ENCODING;
      this.#eventsChannel = oneChannel(ROS2_TOPICS.events);
      this.#statsChannel = oneChannel(ROS2_TOPICS.stats);
      this.#actionChannels = new SourceChannels(file, ROS2_TOPICS.actions, stringSchemaId, (s) => qos(actionMetadata(s)), 'cdr');
      const compressedId = rosSchema('sensor_msgs/msg/CompressedImage');
      const rawId = rosSchema('sensor_msgs/msg/Image');
      this.#compressedChannels = new SourceChannels(file, ROS2_TOPICS.compressed, compressedId, (s) => qos([['source_id', s]]), 'cdr');
      this.#rawChannels = new SourceChannels(file, ROS2_TOPICS.raw, rawId, (s) => qos([['source_id', s]]), 'cdr');
      return;
    }
    this.#encoding = JSON_ENCODING;
    const actionSchemaId = file.registerSchema(schema.mcapSchema);
    const compressedSchemaId = file.registerSchema(jsonSchema(CompressedImage.title, CompressedImage));
    const rawSchemaId = file.registerSchema(jsonSchema(RawImage.title, RawImage));
    this.#eventsChannel = file.registerChannel({
      topic: EVENTS_TOPIC,
      schemaId: file.registerSchema(jsonSchema('percept.TelemetryEvent', { title: 'percept.TelemetryEvent', type: 'object' })),
      messageEncoding: 'json',
      metadata: new Map(),
    });
    this.#statsChannel = file.registerChannel({
      topic: STATS_TOPIC,
      schemaId: file.registerSchema(jsonSchema('percept.RunSummary', { title: 'percept.RunSummary', type: 'object' })),
      messageEncoding: 'json',
      metadata: new Map(),
    });
    this.#actionChannels = new SourceChannels(file, ACTIONS_TOPIC, actionSchemaId, actionMetadata, 'json');
    this.#compressedChannels = new SourceChannels(file, FRAMES_TOPIC, compressedSchemaId, (sourceId) => [['source_id', sourceId]], 'json');
    this.#rawChannels = new SourceChannels(file, FRAMES_TOPIC, rawSchemaId, (sourceId) => [['source_id', sourceId]], 'json');
  }

  get counts(): RecorderCounts {
    return { ...this.#counts, chunks: this.#file.chunksWritten };
  }

  get failure(): Error | undefined {
    return this.#failure;
  }

  get bytesWritten(): number {
    return this.#file.bytesWritten;
  }

  get bytesLost(): number {
    return this.#failure ? this.#file.bytesUnwritten + this.#lostAfter : 0;
  }

  async writeMetadata(name: string, entries: Readonly<Record<string, string>>): Promise<void> {
    this.#checkOpen('writeMetadata');
    await this.#enqueue(`writeMetadata(${name})`, () => this.#file.addMetadata({ name, metadata: new Map(Object.entries(entries)) }));
  }

  async recordFrame(frame: CameraFrame, meta: RecordedFrameMeta, logTimeNs: bigint): Promise<boolean> {
    checkTime('recordFrame', logTimeNs);
    checkTime('recordFrame', meta?.stampNs, 'meta.stampNs');
    if (frame === null || typeof frame !== 'object' || !(frame.data instanceof Uint8Array))
      throw new TypeError('recorder.recordFrame: expected a CameraFrame { encoding, data }');
    this.#checkOpen('recordFrame');
    if (this.#pendingFrameBytes + frame.data.length > this.#maxPendingBytes && this.#pendingFrameBytes > 0) {
      this.#counts.framesNotRecorded += 1;
      return false;
    }
    this.#pendingFrameBytes += frame.data.length;
    const timestamp = { sec: Number(meta.stampNs / 1_000_000_000n), nsec: Number(meta.stampNs % 1_000_000_000n) };
    const compressed = frame.encoding === 'jpeg' || frame.encoding === 'png';
    const encoding = this.#encoding;
    try {
      await this.#add(
        `recordFrame(frame ${meta.frameId})`,
        {
          sequence: meta.frameId >>> 0,
          logTime: logTimeNs,
          publishTime: meta.stampNs,
          // Encoded when its turn comes, so a waiting frame holds its bytes once, not twice.
          get data() {
            return compressed
              ? encoding.compressedImage(frame, timestamp, meta.sourceId)
              : encoding.rawImage(frame, timestamp, meta.sourceId);
          },
        },
        () => (compressed ? this.#compressedChannels : this.#rawChannels).of(meta.sourceId),
        frame.data.length,
      );
      this.#counts.frames += 1;
      return true;
    } finally {
      this.#pendingFrameBytes -= frame.data.length;
    }
  }

  async recordAction(msg: ActionMessage, stampNs: bigint, logTimeNs: bigint): Promise<void> {
    checkTime('recordAction', logTimeNs);
    checkTime('recordAction', stampNs, 'stampNs');
    if (msg === null || typeof msg !== 'object' || typeof msg.sourceId !== 'string' || !Number.isInteger(msg.frameId)) {
      throw new TypeError('recorder.recordAction: expected an ActionMessage { frameId, sourceId, captureWallMs, action }');
    }
    this.#checkOpen('recordAction');
    const data = this.#encoding.json(msg.action);
    await this.#add(
      `recordAction(frame ${msg.frameId})`,
      // MCAP sequence is uint32; frame ids are non-negative and far below 2^32 in practice.
      { sequence: msg.frameId >>> 0, logTime: logTimeNs, publishTime: stampNs, data },
      () => this.#actionChannels.of(msg.sourceId),
    );
    this.#counts.actions += 1;
  }

  async recordEvent(event: object, logTimeNs: bigint, stampNs: bigint = logTimeNs): Promise<void> {
    checkTime('recordEvent', logTimeNs);
    checkTime('recordEvent', stampNs, 'stampNs');
    if (event === null || typeof event !== 'object')
      throw new TypeError(`recorder.recordEvent: expected an event object but received ${String(event)}`);
    this.#checkOpen('recordEvent');
    const data = this.#encoding.json(event);
    const sequence = this.#counts.events++;
    await this.#add('recordEvent', { sequence, logTime: logTimeNs, publishTime: stampNs, data }, () => this.#eventsChannel);
  }

  async recordStats(summary: object, logTimeNs: bigint): Promise<void> {
    checkTime('recordStats', logTimeNs);
    this.#checkOpen('recordStats');
    const data = this.#encoding.json(summary);
    const sequence = this.#counts.stats++;
    await this.#add('recordStats', { sequence, logTime: logTimeNs, publishTime: logTimeNs, data }, () => this.#statsChannel);
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      clearTimeout(this.#flushTimer);
      try {
        await this.#enqueue('end', () => this.#file.end());
      } finally {
        await this.#handle.close();
      }
    })();
    return this.#closing;
  }

  #checkOpen(fn: string): void {
    if (this.#closing) throw new Error(`recorder ${this.path}: ${fn} after close`);
  }

  /** Appends `op` to the chain. The first failure poisons the recorder: the layout is undefined
   * after a failed write, so carrying on would write a corrupt file. */
  #enqueue<T>(what: string, op: () => Promise<T>, bytes = 0): Promise<T> {
    const run = this.#tail.then(async () => {
      if (this.#failure) {
        // Refused because of an earlier failure: its bytes are lost. (The failed write's own are the file's bytesUnwritten.)
        this.#lostAfter += bytes;
        throw this.#failure;
      }
      try {
        return await op();
      } catch (err) {
        if (!this.#failure) {
          this.#failure = new Error(`recorder ${this.path}: ${what} failed: ${(err as Error).message}`, { cause: err });
          try {
            this.#onFailure?.(this.#failure);
          } catch {
            // The callback's own trouble must not hide the recording's.
          }
        }
        throw this.#failure;
      } finally {
        this.#rearm();
      }
    });
    this.#tail = run.catch(() => undefined);
    return run;
  }

  #add(what: string, message: Omit<McapTypes.Message, 'channelId'>, channel: () => number, bytes?: number): Promise<void> {
    return this.#enqueue(what, () => this.#file.addMessage({ ...message, channelId: channel() }), bytes ?? message.data.byteLength);
  }

  /** Disarms the wall-time flush when its chunk was written, and arms it while a chunk is open. */
  #rearm(): void {
    const file = this.#file;
    if (file.chunksWritten !== this.#chunksSeen) {
      this.#chunksSeen = file.chunksWritten;
      clearTimeout(this.#flushTimer);
      this.#flushTimer = undefined;
    }
    if (this.#flushAfterMs === null || this.#flushTimer || !file.chunkOpen || this.#closing) return;
    this.#flushTimer = setTimeout(() => {
      this.#flushTimer = undefined;
      void this.#enqueue('flush', () => file.flushChunk()).catch(() => undefined);
    }, this.#flushAfterMs);
    this.#flushTimer.unref();
  }
}

/** One channel per source id on a topic, registered when the source first appears. */
class SourceChannels {
  readonly #file: ChunkedMcapFile;
  readonly #topic: string;
  readonly #schemaId: number;
  readonly #metadata: (sourceId: string) => [string, string][];
  readonly #messageEncoding: string;
  readonly #ids = new Map<string, number>();

  constructor(
    file: ChunkedMcapFile,
    topic: string,
    schemaId: number,
    metadata: (sourceId: string) => [string, string][],
    messageEncoding: string,
  ) {
    this.#file = file;
    this.#topic = topic;
    this.#schemaId = schemaId;
    this.#metadata = metadata;
    this.#messageEncoding = messageEncoding;
  }

  of(sourceId: string): number {
    let id = this.#ids.get(sourceId);
    if (id === undefined) {
      id = this.#file.registerChannel({
        topic: this.#topic,
        schemaId: this.#schemaId,
        messageEncoding: this.#messageEncoding,
        metadata: new Map(this.#metadata(sourceId)),
      });
      this.#ids.set(sourceId, id);
    }
    return id;
  }
}

function jsonSchema(name: string, body: object): Omit<McapTypes.Schema, 'id'> {
  return { name, encoding: 'jsonschema', data: new TextEncoder().encode(JSON.stringify(body)) };
}

function checkTime(fn: string, ns: bigint, name = 'logTimeNs'): void {
  if (typeof ns !== 'bigint' || ns < 0n) {
    throw new TypeError(`recorder.${fn}: expected a bigint ${name} >= 0 but received ${String(ns)} of type ${typeof ns}`);
  }
}

/** JSON with bigints as decimal strings. */
function jsonText(value: unknown): string {
  return JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v));
}

function encode(value: unknown): Uint8Array {
  return new TextEncoder().encode(jsonText(value));
}

type Stamp = { readonly sec: number; readonly nsec: number };

/** How a profile serialises each kind of message. */
interface MessageEncoding {
  compressedImage(frame: CameraFrame, timestamp: Stamp, frameId: string): Uint8Array;
  rawImage(frame: CameraFrame, timestamp: Stamp, frameId: string): Uint8Array;
  /** A JSON document (action, event, summary): the JSON itself, or a std_msgs/msg/String holding it. */
  json(value: unknown): Uint8Array;
}

const JSON_ENCODING: MessageEncoding = {
  compressedImage: (frame, timestamp, frameId) => encode(compressedImage(frame, timestamp, frameId)),
  rawImage: (frame, timestamp, frameId) => encode(rawImage(frame, timestamp, frameId)),
  json: encode,
};

const cdrWriter = (name: keyof typeof ROS2_DEFINITIONS): MessageWriter =>
  new MessageWriter(parseRosMsg(ROS2_DEFINITIONS[name], { ros2: true }));
const CDR_WRITERS = {
  compressed: cdrWriter('sensor_msgs/msg/CompressedImage'),
  raw: cdrWriter('sensor_msgs/msg/Image'),
  string: cdrWriter('std_msgs/msg/String'),
};
const rosHeader = (timestamp: Stamp, frameId: string) => ({ stamp: { sec: timestamp.sec, nanosec: timestamp.nsec }, frame_id: frameId });

const ROS2_ENCODING: MessageEncoding = {
  compressedImage: (frame, timestamp, frameId) =>
    CDR_WRITERS.compressed.writeMessage({ header: rosHeader(timestamp, frameId), format: frame.encoding, data: frame.data }),
  rawImage: (frame, timestamp, frameId) => {
    const width = frame.width ?? 0;
    return CDR_WRITERS.raw.writeMessage({
      header: rosHeader(timestamp, frameId),
      height: frame.height ?? 0,
      width,
      encoding: frame.encoding,
      // percept's frames are little endian.
      is_bigendian: 0,
      step: frame.stride ?? width * (BYTES_PER_PIXEL[frame.encoding] ?? 1),
      data: frame.data,
    });
  },
  json: (value) => CDR_WRITERS.string.writeMessage({ data: jsonText(value) }),
};

function compressedImage(frame: CameraFrame, timestamp: Stamp, frameId: string): object {
  return {
    timestamp,
    frame_id: frameId,
    data: Buffer.from(frame.data.buffer, frame.data.byteOffset, frame.data.byteLength).toString('base64'),
    format: frame.encoding,
  };
}

const BYTES_PER_PIXEL: Readonly<Record<string, number>> = { rgb8: 3, bgr8: 3, rgba8: 4, bgra8: 4, mono8: 1, mono16: 2 };

function rawImage(frame: CameraFrame, timestamp: Stamp, frameId: string): object {
  const width = frame.width ?? 0;
  const bytesPerPixel = BYTES_PER_PIXEL[frame.encoding] ?? 1;
  return {
    timestamp,
    frame_id: frameId,
    width,
    height: frame.height ?? 0,
    encoding: frame.encoding,
    step: frame.stride ?? width * bytesPerPixel,
    data: Buffer.from(frame.data.buffer, frame.data.byteOffset, frame.data.byteLength).toString('base64'),
  };
}
