// source-bag: replays image messages from an MCAP file (a percept recording, or a ROS 2 bag written
// with the MCAP storage plugin) in log-time order.
// Decoded schemas (schema name / message encoding):
//   foxglove.CompressedImage        json   (jpeg, png)
//   foxglove.RawImage               json   (rgb8, bgr8, rgba8, bgra8, mono8, mono16)
//   sensor_msgs/msg/CompressedImage cdr    (jpeg, png)   } with the small CDR reader below:
//   sensor_msgs/msg/Image           cdr    (as RawImage) } @foxglove/rosmsg2-serialization is not installed
// Timing: message k is due at start + (logTime_k − logTime_0 + loopOffset) / rate. A VirtualClock is
// advanced to that instant (no waiting); a RealClock is slept until it.
// A message that cannot be decoded (unsupported schema or format, corrupt payload) is counted and
// reported with its topic and sequence; replay continues. Errors in the file itself (cannot open,
// not MCAP, bad chunk) are fatal and name the path.
import { open } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { McapIndexedReader } from '@mcap/core';
import type { McapTypes } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import type { Clock } from '../pipeline/clock.ts';
import type { CameraFrame, FrameEncoding } from './payloads.ts';
import type { FrameSource, SourceItem } from '../pipeline/types.ts';
import { waitUntilDue, wallMsAt } from '../pipeline/pacing.ts';

export interface BagSourceOptions {
  readonly path: string;
  /** Image topic to replay; if left out, the bag must have exactly one topic with a supported image schema. */
  readonly topic?: string;
  /** Replay speed (default 1 = recorded timing, 2 = twice as fast). */
  readonly rate?: number;
  /** Start again from the first message after the last (default false). */
  readonly loop?: boolean;
  /** FrameSource id (default: the topic). */
  readonly id?: string;
  /** Called for each message that could not be decoded. */
  readonly onIssue?: (issue: BagIssue) => void;
}

export interface BagIssue {
  readonly topic: string;
  /** The MCAP message's own sequence field. */
  readonly sequence: number;
  /** Position of the message in this replay (0-based, counting every message on the topic, across loops). */
  readonly index: number;
  readonly logTimeNs: bigint;
  readonly schema: string;
  readonly reason: string;
}

export interface BagSourceCounters {
  /** Messages read from the topic. */
  readonly read: number;
  readonly yielded: number;
  /** Messages that could not be decoded (see `issues`). */
  readonly bad: number;
}

export interface BagSource extends FrameSource<CameraFrame> {
  readonly path: string;
  readonly topic: string;
  readonly messageCount: number;
  readonly counters: BagSourceCounters;
  /** The first 100 issues (all of them go to onIssue). */
  readonly issues: readonly BagIssue[];
  close(): Promise<void>;
}

type Decoder = (data: Uint8Array) => CameraFrame;
const MAX_KEPT_ISSUES = 100;

/** Opens the bag and checks the topic; fatal problems throw here, naming the path. */
export async function createBagSource(options: BagSourceOptions): Promise<BagSource> {
  if (options === null || typeof options !== 'object') throw new TypeError('createBagSource: expected an options object { path }');
  const { path, rate = 1, loop = false, onIssue } = options;
  if (typeof path !== 'string' || path.length === 0)
    throw new TypeError(`createBagSource: expected a non-empty path but received ${JSON.stringify(path)}`);
  if (typeof rate !== 'number' || !Number.isFinite(rate) || rate <= 0)
    throw new RangeError(`createBagSource: expected finite number > 0 for rate but received ${rate}`);
  if (typeof loop !== 'boolean') throw new TypeError(`createBagSource: expected boolean for loop but received ${JSON.stringify(loop)}`);

  let handle: FileHandle;
  try {
    handle = await open(path, 'r');
  } catch (err) {
    throw new Error(`bag source: cannot open ${path}: ${(err as Error).message}`, { cause: err });
  }
  let reader: McapIndexedReader;
  try {
    reader = await McapIndexedReader.Initialize({
      readable: new FileHandleReadable(handle),
      decompressHandlers: await loadDecompressHandlers(),
    });
  } catch (err) {
    await handle.close();
    throw new Error(`bag source: ${path} is not a readable indexed MCAP file: ${(err as Error).message}`, { cause: err });
  }

  const schemaOf = (channel: McapTypes.Channel): string => {
    const schema = reader.schemasById.get(channel.schemaId);
    return schema ? `${schema.name} (${schema.encoding}/${channel.messageEncoding})` : `(no schema) (${channel.messageEncoding})`;
  };
  const decoders = new Map<number, Decoder | undefined>();
  for (const channel of reader.channelsById.values()) {
    decoders.set(channel.id, decoderFor(reader.schemasById.get(channel.schemaId)?.name ?? '', channel.messageEncoding));
  }
  const channels = [...reader.channelsById.values()];
  let topic = options.topic;
  try {
    if (topic === undefined) {
      const imageTopics = [...new Set(channels.filter((c) => decoders.get(c.id)).map((c) => c.topic))];
      if (imageTopics.length !== 1) {
        const all = channels.map((c) => `${c.topic}: ${schemaOf(c)}`).join(', ') || 'none';
        throw new Error(
          imageTopics.length === 0
            ? `bag source: ${path} has no topic with a supported image schema (channels: ${all})`
            : `bag source: ${path} has several image topics (${imageTopics.join(', ')}): pass topic`,
        );
      }
      topic = imageTopics[0];
    } else {
      const onTopic = channels.filter((c) => c.topic === topic);
      if (onTopic.length === 0) {
        throw new Error(
          `bag source: ${path} has no topic ${topic} (topics: ${[...new Set(channels.map((c) => c.topic))].join(', ') || 'none'})`,
        );
      }
      if (!onTopic.some((c) => decoders.get(c.id))) {
        throw new Error(`bag source: ${path} topic ${topic} has no supported image schema: ${onTopic.map(schemaOf).join(', ')}`);
      }
    }
  } catch (err) {
    await handle.close();
    throw err;
  }
  const replayTopic = topic;
  const topicChannelIds = channels.filter((c) => c.topic === replayTopic).map((c) => c.id);
  const messageCount = topicChannelIds.reduce((n, id) => n + Number(reader.statistics?.channelMessageCounts.get(id) ?? 0n), 0);
  const id = options.id ?? replayTopic;
  const counters = { read: 0, yielded: 0, bad: 0 };
  const issues: BagIssue[] = [];
  let closed = false;

  const report = (issue: BagIssue): void => {
    counters.bad += 1;
    if (issues.length < MAX_KEPT_ISSUES) issues.push(issue);
    onIssue?.(issue);
  };

  async function* generate(clock: Clock, signal: AbortSignal): AsyncGenerator<SourceItem<CameraFrame>> {
    const startNs = clock.nowNs();
    let firstLogNs: bigint | undefined;
    let loopOffsetNs = 0n;
    let index = 0;
    do {
      let lastLogNs: bigint | undefined;
      let firstThisPass: bigint | undefined;
      let inPass = 0;
      const yieldedBefore = counters.yielded;
      try {
        for await (const message of reader.readMessages({ topics: [replayTopic], validateCrcs: true })) {
          if (signal.aborted || closed) return;
          firstLogNs ??= message.logTime;
          firstThisPass ??= message.logTime;
          lastLogNs = message.logTime;
          inPass += 1;
          counters.read += 1;
          const k = index++;
          const decode = decoders.get(message.channelId);
          const channel = reader.channelsById.get(message.channelId)!;
          let payload: CameraFrame;
          try {
            if (!decode) throw new Error(`unsupported schema ${schemaOf(channel)}`);
            payload = decode(message.data);
          } catch (err) {
            report({
              topic: replayTopic,
              sequence: message.sequence,
              index: k,
              logTimeNs: message.logTime,
              schema: schemaOf(channel),
              reason: (err as Error).message,
            });
            continue;
          }
          const dueNs = startNs + scale(message.logTime - firstLogNs + loopOffsetNs, rate);
          const captureNs = await waitUntilDue(clock, dueNs, signal);
          if (captureNs === null) return;
          counters.yielded += 1;
          yield { sourceId: id, captureNs, captureWallMs: wallMsAt(clock, captureNs), payload };
        }
      } catch (err) {
        if (closed) return;
        throw new Error(`bag source: reading ${path} failed: ${(err as Error).message}`, { cause: err });
      }
      // A pass that yielded nothing would loop forever without producing a frame.
      if (counters.yielded === yieldedBefore || firstThisPass === undefined || lastLogNs === undefined) return;
      // The next pass starts one mean frame interval after this pass's last message.
      const span = lastLogNs - firstThisPass;
      const gapNs = inPass > 1 ? span / BigInt(inPass - 1) : 100_000_000n;
      loopOffsetNs += span + (gapNs > 0n ? gapNs : 1n);
    } while (loop && !signal.aborted);
  }

  return {
    id,
    path,
    topic: replayTopic,
    messageCount,
    get counters(): BagSourceCounters {
      return { ...counters };
    },
    issues,
    frames: generate,
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      await handle.close();
    },
  };
}

function scale(ns: bigint, rate: number): bigint {
  return rate === 1 ? ns : BigInt(Math.round(Number(ns) / rate));
}

// ---- decoders ---------------------------------------------------------------------------------

const RAW_ENCODINGS: Readonly<Record<string, { encoding: FrameEncoding; bytesPerPixel: number }>> = {
  rgb8: { encoding: 'rgb8', bytesPerPixel: 3 },
  bgr8: { encoding: 'bgr8', bytesPerPixel: 3 },
  rgba8: { encoding: 'rgba8', bytesPerPixel: 4 },
  bgra8: { encoding: 'bgra8', bytesPerPixel: 4 },
  mono8: { encoding: 'mono8', bytesPerPixel: 1 },
  mono16: { encoding: 'mono16', bytesPerPixel: 2 },
};

/** The decoder for a schema name + message encoding, or undefined when it is not an image we read. */
export function decoderFor(schemaName: string, messageEncoding: string): Decoder | undefined {
  switch (`${schemaName}|${messageEncoding}`) {
    case 'foxglove.CompressedImage|json':
      return (data) => {
        const msg = parseJsonObject(data);
        return compressedFrame(expectString(msg, 'format'), base64Field(msg, 'data'));
      };
    case 'foxglove.RawImage|json':
      return (data) => {
        const msg = parseJsonObject(data);
        return rawFrame(
          expectUint(msg, 'width'),
          expectUint(msg, 'height'),
          expectString(msg, 'encoding'),
          expectUint(msg, 'step'),
          base64Field(msg, 'data'),
          false,
        );
      };
    case 'sensor_msgs/msg/CompressedImage|cdr':
      return (data) => {
        const cdr = new CdrReader(data);
        skipRosHeader(cdr);
        const format = cdr.string();
        return compressedFrame(format, cdr.uint8Sequence());
      };
    case 'sensor_msgs/msg/Image|cdr':
      return (data) => {
        const cdr = new CdrReader(data);
        skipRosHeader(cdr);
        const height = cdr.uint32();
        const width = cdr.uint32();
        const encoding = cdr.string();
        const bigEndian = cdr.uint8() !== 0;
        const step = cdr.uint32();
        return rawFrame(width, height, encoding, step, cdr.uint8Sequence(), bigEndian);
      };
    default:
      return undefined;
  }
}

function compressedFrame(format: string, data: Uint8Array): CameraFrame {
  const sniffed = sniffImage(data);
  if (!sniffed)
    throw new Error(
      `payload is not a JPEG or PNG image (format ${JSON.stringify(format)}, ${data.length} bytes, starts ${hexStart(data)})`,
    );
  // The format string is free text ("jpeg", "png", "rgb8; jpeg compressed bgr8"); when it names a
  // codec it must agree with the bytes.
  const named = /jpe?g/i.test(format) ? 'jpeg' : /png/i.test(format) ? 'png' : undefined;
  if (named && named !== sniffed) throw new Error(`format ${JSON.stringify(format)} but the data is ${sniffed}`);
  if (!named && format.trim() !== '') throw new Error(`unsupported format ${JSON.stringify(format)}`);
  return { encoding: sniffed, data };
}

function rawFrame(width: number, height: number, encodingName: string, step: number, data: Uint8Array, bigEndian: boolean): CameraFrame {
  const known = RAW_ENCODINGS[encodingName];
  if (!known)
    throw new Error(`unsupported raw encoding ${JSON.stringify(encodingName)} (supported: ${Object.keys(RAW_ENCODINGS).join(', ')})`);
  if (width === 0 || height === 0) throw new Error(`empty image ${width}x${height}`);
  if (step < width * known.bytesPerPixel) throw new Error(`step ${step} is less than width ${width} × ${known.bytesPerPixel} bytes`);
  if (data.length < step * height)
    throw new Error(`data has ${data.length} bytes, expected step ${step} × height ${height} = ${step * height}`);
  if (bigEndian && known.bytesPerPixel === 2) throw new Error('big-endian mono16 is not supported');
  return { encoding: known.encoding, data, width, height, stride: step };
}

function sniffImage(data: Uint8Array): 'jpeg' | 'png' | undefined {
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return 'jpeg';
  if (
    data.length >= 8 &&
    data[0] === 0x89 &&
    data[1] === 0x50 &&
    data[2] === 0x4e &&
    data[3] === 0x47 &&
    data[4] === 0x0d &&
    data[5] === 0x0a &&
    data[6] === 0x1a &&
    data[7] === 0x0a
  )
    return 'png';
  return undefined;
}

function hexStart(data: Uint8Array): string {
  return Buffer.from(data.subarray(0, 4)).toString('hex') || '(empty)';
}

function parseJsonObject(data: Uint8Array): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString('utf8'));
  } catch (err) {
    throw new Error(`payload is not JSON: ${(err as Error).message}`, { cause: err });
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw new Error('payload is not a JSON object');
  return value as Record<string, unknown>;
}

function expectString(msg: Record<string, unknown>, field: string): string {
  const v = msg[field];
  if (typeof v !== 'string') throw new Error(`field ${field} is not a string`);
  return v;
}

function expectUint(msg: Record<string, unknown>, field: string): number {
  const v = msg[field];
  if (!Number.isInteger(v) || (v as number) < 0) throw new Error(`field ${field} is not a non-negative integer`);
  return v as number;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
function base64Field(msg: Record<string, unknown>, field: string): Uint8Array {
  const v = expectString(msg, field);
  // Buffer.from(…, 'base64') silently skips bad characters; check first so corruption is reported.
  if (v.length % 4 !== 0 || !BASE64.test(v)) throw new Error(`field ${field} is not valid base64`);
  return Buffer.from(v, 'base64');
}

/** Reads OMG CDR (XCDR1) as ROS 2 writes it: a 4-byte encapsulation header (0x00 0x01 little endian,
 * 0x00 0x00 big endian), then fields aligned to their size relative to the end of that header. */
export class CdrReader {
  readonly #view: DataView;
  readonly #bytes: Uint8Array;
  readonly #littleEndian: boolean;
  #offset = 4;

  constructor(data: Uint8Array) {
    if (data.length < 4) throw new Error(`CDR payload of ${data.length} bytes has no encapsulation header`);
    const kind = data[1];
    if (data[0] !== 0 || (kind !== 0 && kind !== 1)) throw new Error(`unsupported CDR encapsulation ${hexStart(data)}`);
    this.#bytes = data;
    this.#view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    this.#littleEndian = kind === 1;
  }

  uint8(): number {
    this.#need(1, 'uint8');
    return this.#view.getUint8(this.#offset++);
  }
  int32(): number {
    this.#align(4);
    this.#need(4, 'int32');
    const v = this.#view.getInt32(this.#offset, this.#littleEndian);
    this.#offset += 4;
    return v;
  }
  uint32(): number {
    this.#align(4);
    this.#need(4, 'uint32');
    const v = this.#view.getUint32(this.#offset, this.#littleEndian);
    this.#offset += 4;
    return v;
  }
  /** A CDR string: uint32 length including the terminating NUL, the bytes, the NUL. */
  string(): string {
    const length = this.uint32();
    if (length === 0) return '';
    this.#need(length, 'string');
    const bytes = this.#bytes.subarray(this.#offset, this.#offset + length - 1);
    this.#offset += length;
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8');
  }
  /** uint8[]: uint32 count, then the bytes (a view, not a copy). */
  uint8Sequence(): Uint8Array {
    const length = this.uint32();
    this.#need(length, 'uint8[]');
    const bytes = this.#bytes.subarray(this.#offset, this.#offset + length);
    this.#offset += length;
    return bytes;
  }

  #align(size: number): void {
    const rel = this.#offset - 4;
    this.#offset += (size - (rel % size)) % size;
  }
  #need(size: number, what: string): void {
    if (this.#offset + size > this.#bytes.length) {
      throw new Error(`CDR payload truncated: ${what} of ${size} bytes at offset ${this.#offset} runs past ${this.#bytes.length}`);
    }
  }
}

/** std_msgs/Header: builtin_interfaces/Time stamp (int32 sec, uint32 nanosec), string frame_id. */
function skipRosHeader(cdr: CdrReader): void {
  cdr.int32();
  cdr.uint32();
  cdr.string();
}

// ---- pacing (kept in step with the other sources) ------------------------------------------------
