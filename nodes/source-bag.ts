// source-bag: replays the image messages of one topic of an MCAP file.
// It reads ROS 2 bags (MCAP storage plugin), Foxglove recordings and percept's own recordings, and survives damage.
// Schemas, reading, damage and timing: nodes/README.md#bag-source
import type { McapTypes } from '@mcap/core';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageReader } from '@foxglove/rosmsg2-serialization';
import type { Clock } from '../pipeline/clock.ts';
import { McapFile, type McapEnd } from './mcap-read.ts';
import type { CameraFrame, FrameEncoding } from './payloads.ts';
import type { FrameSource, SourceIncident, SourceItem, SourceRejection, Stamp } from '../pipeline/types.ts';
import { waitUntilDue, wallMsAt } from '../pipeline/pacing.ts';

export interface BagSourceOptions {
  readonly path: string;
  /** Image topic to replay. */
  readonly topic?: string;
  /** Or: the message type (schema name) whose one topic to replay, e.g. 'sensor_msgs/msg/Image'. */
  readonly type?: string;
  /** 'recorded' (default): at the recorded timing / rate; 'fast': each message as soon as it is read. */
  readonly pace?: 'recorded' | 'fast';
  /** Replay speed for pace 'recorded' (default 1 = recorded timing, 2 = twice as fast). */
  readonly rate?: number;
  /** Start again from the first message after the last (default false). */
  readonly loop?: boolean;
  /** FrameSource id (default: the topic). */
  readonly id?: string;
}

export interface BagSourceCounters {
  /** Messages of the topic met (decoded, rejected, or lost in a bad chunk). */
  readonly read: number;
  readonly yielded: number;
  /** Messages of the topic that became rejected frames. */
  readonly rejected: number;
}

export interface BagSource extends FrameSource<CameraFrame> {
  readonly path: string;
  readonly topic: string;
  /** What is replayed, e.g. `bag /data/run.mcap, topic /cam (sensor_msgs/msg/Image, cdr), indexed`. */
  readonly description: string;
  /** Messages on the replayed (decodable) channels, from the summary or the scan. */
  readonly messageCount: number;
  /** 'indexed': the file has a readable summary; 'streamed': it has not (damaged or unfinished). */
  readonly mode: 'indexed' | 'streamed';
  /** Log time of the file's first message (Unix ns for ROS 2 and percept bags). */
  readonly startNs: bigint;
  readonly expectedItems: number;
  readonly counters: BagSourceCounters;
  frames(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection>;
  close(): Promise<void>;
}

/** Opens the bag and picks the topic; fatal problems throw here, naming the path. */
export async function createBagSource(options: BagSourceOptions): Promise<BagSource> {
  if (options === null || typeof options !== 'object') throw new TypeError('createBagSource: expected an options object { path }');
  const { path, rate = 1, loop = false, pace = 'recorded' } = options;
  if (typeof path !== 'string' || path.length === 0)
    throw new TypeError(`createBagSource: expected a non-empty path but received ${JSON.stringify(path)}`);
  if (typeof rate !== 'number' || !Number.isFinite(rate) || rate <= 0)
    throw new RangeError(`createBagSource: expected finite number > 0 for rate but received ${rate}`);
  if (typeof loop !== 'boolean') throw new TypeError(`createBagSource: expected boolean for loop but received ${JSON.stringify(loop)}`);
  if (pace !== 'recorded' && pace !== 'fast')
    throw new TypeError(`createBagSource: expected pace 'recorded' or 'fast' but received ${JSON.stringify(pace)}`);

  const file = await McapFile.open(path);
  let selection: Selection;
  try {
    selection = selectChannels(file, options, path);
  } catch (err) {
    await file.close();
    throw err;
  }
  // What opening found, reported at the start of each replay.
  const found: SourceIncident[] = [];
  if (file.summaryError) {
    found.push({ kind: 'damaged', detail: `${path}: ${file.summaryError}; read by streaming up to where the file is valid` });
  }
  for (const skipped of selection.skipped) {
    const { channel, reason } = skipped;
    found.push({
      kind: 'skipped',
      detail: `${path}: channel ${channel.id} of ${channel.topic} skipped (${file.countOf(channel.id)} messages): ${reason}`,
    });
  }
  if (file.end && file.mode === 'streamed') found.push({ kind: 'damaged', detail: `${path}: ${describeEnd(file.end)}` });

  const { topic, decoders } = selection;
  const id = options.id ?? topic;
  const messageCount = [...decoders.keys()].reduce((n, channelId) => n + file.countOf(channelId), 0);
  const counters = { read: 0, yielded: 0, rejected: 0 };
  const schemas = [...new Set([...decoders.keys()].map((c) => file.describeChannel(c)))].join(', ');
  const description = `bag ${path}, topic ${topic} (${schemas}), ${file.mode === 'indexed' ? 'indexed' : 'streamed (no summary)'}`;
  let closed = false;

  async function* generate(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection> {
    for (const incident of found) report?.(incident);
    const startNs = clock.nowNs();
    let firstLogNs: bigint | undefined;
    let loopOffsetNs = 0n;
    let pass = 0;
    // The instant a message of the replay is due (waiting for it), or null when the replay must stop.
    const due = async (logTime: bigint): Promise<bigint | null> => {
      firstLogNs ??= logTime;
      const dueNs = pace === 'fast' ? clock.nowNs() : startNs + scale(logTime - firstLogNs + loopOffsetNs, rate);
      return waitUntilDue(clock, dueNs, signal);
    };
    const rejection = (captureNs: bigint, logTime: bigint, rejected: string, detail: string): SourceRejection => {
      counters.rejected += 1;
      return { sourceId: id, captureNs, captureWallMs: wallMsAt(clock, captureNs), stampNs: logTime, rejected, detail };
    };
    do {
      let firstThisPass: bigint | undefined;
      let lastLogNs: bigint | undefined;
      let inPass = 0;
      const yieldedBefore = counters.yielded;
      for await (const event of file.read(new Set(decoders.keys()))) {
        if (signal.aborted || closed) return;
        if (event.kind === 'badChunk') {
          if (pass === 0) {
            const lost = event.lost ? [...decoders.keys()].reduce((n, c) => n + (event.lost!.get(c)?.length ?? 0), 0) : undefined;
            report?.({
              kind: 'damaged',
              detail:
                `${path}: the chunk at byte ${event.offset} (${event.length} bytes) was skipped: ${event.reason}; ` +
                (lost === undefined ? 'its messages are unknown (no message index follows it)' : `${lost} messages of ${topic} rejected`),
            });
          }
          const lostTimes = [...decoders.keys()].flatMap((c) => event.lost?.get(c) ?? []).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
          const cause = /crc/i.test(event.reason) ? 'chunk failed its CRC check' : 'chunk unreadable';
          for (const logTime of lostTimes) {
            counters.read += 1;
            const captureNs = await due(logTime);
            if (captureNs === null) return;
            yield rejection(captureNs, logTime, cause, `${path}: chunk at byte ${event.offset}: ${event.reason}`);
          }
          continue;
        }
        if (event.kind !== 'message') continue;
        const { message } = event;
        const decode = decoders.get(message.channelId);
        if (!decode) continue;
        counters.read += 1;
        inPass += 1;
        firstThisPass ??= message.logTime;
        lastLogNs = message.logTime;
        let decoded: Decoded | undefined;
        let problem: string | undefined;
        try {
          decoded = decode(message.data);
        } catch (err) {
          problem = (err as Error).message;
        }
        const captureNs = await due(message.logTime);
        if (captureNs === null) return;
        if (decoded === undefined) {
          const [cause] = (problem ?? 'undecodable').split(':', 1);
          yield rejection(
            captureNs,
            message.logTime,
            cause!,
            `${topic} sequence ${message.sequence} (log time ${message.logTime}): ${problem}`,
          );
          continue;
        }
        counters.yielded += 1;
        const captureWallMs = wallMsAt(clock, captureNs);
        // The wire's source_stamp is the header's capture stamp where the message states one, so actions
        // match other sensors by capture time; the recording's time line stays the log time.
        const sourceStamp = decoded.stamp ?? toStamp(message.logTime);
        yield { sourceId: id, captureNs, captureWallMs, stampNs: message.logTime, sourceStamp, payload: decoded.frame };
      }
      pass += 1;
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
    topic,
    description,
    messageCount,
    mode: file.mode,
    startNs: file.startNs,
    expectedItems: messageCount,
    get counters(): BagSourceCounters {
      return { read: counters.read, yielded: counters.yielded, rejected: counters.rejected };
    },
    frames: generate,
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      await file.close();
    },
  };
}

function scale(ns: bigint, rate: number): bigint {
  return rate === 1 ? ns : BigInt(Math.round(Number(ns) / rate));
}

/** A log time (ns) as the ROS time the wire's source_stamp is. */
function toStamp(ns: bigint): Stamp {
  return { sec: Number(ns / 1_000_000_000n), nanosec: Number(ns % 1_000_000_000n) };
}

// ---- choosing the channels ---------------------------------------------------------------------

/** The message types percept reads images from. */
const IMAGE_SCHEMAS: ReadonlySet<string> = new Set([
  'foxglove.CompressedImage',
  'foxglove.RawImage',
  'sensor_msgs/msg/CompressedImage',
  'sensor_msgs/msg/Image',
]);

interface Selection {
  readonly topic: string;
  readonly decoders: ReadonlyMap<number, Decoder>;
  /** Channels of the topic that cannot be decoded, and why. */
  readonly skipped: readonly { readonly channel: McapTypes.Channel; readonly reason: string }[];
}

function selectChannels(file: McapFile, options: BagSourceOptions, path: string): Selection {
  const channels = [...file.channels.values()];
  const resolved = new Map<number, Decoder | string>();
  for (const channel of channels) resolved.set(channel.id, decoderFor(file.schemas.get(channel.schemaId), channel.messageEncoding));
  const isImage = (c: McapTypes.Channel): boolean => IMAGE_SCHEMAS.has(file.schemas.get(c.schemaId)?.name ?? '');
  const topicsOf = (list: readonly McapTypes.Channel[]): string[] => [...new Set(list.map((c) => c.topic))];
  const listing = (): string => channels.map((c) => `${c.topic}: ${file.describeChannel(c.id)}`).join(', ') || 'none';

  if (channels.length === 0 || file.totalMessages === 0) {
    throw new Error(`bag source: ${path} holds no messages (an empty bag; channels: ${listing()})`);
  }
  let topic = options.topic;
  if (topic === undefined) {
    const candidates =
      options.type !== undefined
        ? channels.filter((c) => file.schemas.get(c.schemaId)?.name === options.type)
        : channels.filter((c) => isImage(c) && typeof resolved.get(c.id) === 'function');
    const topics = topicsOf(candidates);
    const what = options.type !== undefined ? `topic of type ${options.type}` : 'image topic percept can decode';
    if (topics.length === 0) {
      const images = channels.filter(isImage);
      const why = images.map((c) => `${c.topic}: ${resolved.get(c.id) as string}`).join('; ');
      throw new Error(`bag source: ${path} has no ${what} (channels: ${listing()})${why ? `; ${why}` : ''}`);
    }
    if (topics.length > 1) throw new Error(`bag source: ${path} has several (${topics.join(', ')}): pass topic`);
    topic = topics[0]!;
  }
  const onTopic = channels.filter((c) => c.topic === topic);
  if (onTopic.length === 0) throw new Error(`bag source: ${path} has no topic ${topic} (topics: ${topicsOf(channels).join(', ')})`);
  const decoders = new Map<number, Decoder>();
  const skipped: { channel: McapTypes.Channel; reason: string }[] = [];
  for (const channel of onTopic) {
    const decoder = resolved.get(channel.id)!;
    if (typeof decoder === 'function') decoders.set(channel.id, decoder);
    else skipped.push({ channel, reason: decoder });
  }
  if (decoders.size === 0) {
    throw new Error(`bag source: ${path} topic ${topic} has no channel percept can decode: ${skipped.map((s) => s.reason).join('; ')}`);
  }
  if ([...decoders.keys()].every((c) => file.countOf(c) === 0)) throw new Error(`bag source: ${path} topic ${topic} holds no messages`);
  return { topic, decoders, skipped };
}

// ---- decoders ----------------------------------------------------------------------------------

/** A message's frame, and the capture stamp its header states (null: none, or zero). */
interface Decoded {
  readonly frame: CameraFrame;
  readonly stamp: Stamp | null;
}
type Decoder = (data: Uint8Array) => Decoded;

/** A header stamp as the wire carries it; null where the message has none or it is zero (unset). */
function headerStamp(stamp: { sec?: unknown; nanosec?: unknown; nsec?: unknown } | undefined): Stamp | null {
  const sec = Number(stamp?.sec ?? 0);
  const nanosec = Number(stamp?.nanosec ?? stamp?.nsec ?? 0);
  if (!Number.isFinite(sec) || !Number.isFinite(nanosec) || (sec === 0 && nanosec === 0)) return null;
  return { sec, nanosec };
}

const RAW_ENCODINGS: Readonly<Record<string, { encoding: FrameEncoding; bytesPerPixel: number }>> = {
  rgb8: { encoding: 'rgb8', bytesPerPixel: 3 },
  bgr8: { encoding: 'bgr8', bytesPerPixel: 3 },
  rgba8: { encoding: 'rgba8', bytesPerPixel: 4 },
  bgra8: { encoding: 'bgra8', bytesPerPixel: 4 },
  mono8: { encoding: 'mono8', bytesPerPixel: 1 },
  mono16: { encoding: 'mono16', bytesPerPixel: 2 },
};

type SchemaRecord = Pick<McapTypes.Schema, 'name' | 'encoding' | 'data'>;

/** The decoder for a channel (its schema and message encoding), or why percept cannot decode it. */
export function decoderFor(schema: SchemaRecord | undefined, messageEncoding: string): Decoder | string {
  const name = schema?.name ?? '(no schema)';
  if (!IMAGE_SCHEMAS.has(name)) return `${name} is not an image type percept reads (${[...IMAGE_SCHEMAS].join(', ')})`;
  if (name.startsWith('foxglove.')) {
    if (messageEncoding !== 'json') return `${name} in message encoding ${messageEncoding} is not supported (json is)`;
    const stampOf = (msg: Record<string, unknown>): Stamp | null => headerStamp(msg.timestamp as Parameters<typeof headerStamp>[0]);
    return name === 'foxglove.CompressedImage'
      ? (data) => {
          const msg = parseJsonObject(data);
          return { frame: compressedFrame(expectString(msg, 'format'), base64Field(msg, 'data')), stamp: stampOf(msg) };
        }
      : (data) => {
          const msg = parseJsonObject(data);
          const [width, height, step] = [expectUint(msg, 'width'), expectUint(msg, 'height'), expectUint(msg, 'step')];
          const frame = rawFrame(width, height, expectString(msg, 'encoding'), step, base64Field(msg, 'data'), false);
          return { frame, stamp: stampOf(msg) };
        };
  }
  if (messageEncoding !== 'cdr') return `${name} in message encoding ${messageEncoding} is not supported (cdr is)`;
  if (schema!.encoding !== 'ros2msg') return `${name} with a ${schema!.encoding || 'missing'} schema is not supported (ros2msg is)`;
  let reader: MessageReader;
  try {
    const text = new TextDecoder().decode(schema!.data);
    if (text.trim() === '') return `${name}: the schema record holds no message definition`;
    reader = new MessageReader(parseRosMsg(text, { ros2: true }));
  } catch (err) {
    return `${name}: its ros2msg schema does not parse (${(err as Error).message})`;
  }
  const read = <T>(data: Uint8Array): T => {
    try {
      return reader.readMessage<T>(data);
    } catch (err) {
      throw new Error(`corrupt CDR payload: ${data.length} bytes do not decode as ${name} (${(err as Error).message})`, { cause: err });
    }
  };
  type Header = { header?: { stamp?: { sec: number; nanosec: number } } };
  return name === 'sensor_msgs/msg/CompressedImage'
    ? (data) => {
        const msg = read<Header & { format: string; data: Uint8Array }>(data);
        return { frame: compressedFrame(msg.format, msg.data), stamp: headerStamp(msg.header?.stamp) };
      }
    : (data) => {
        const msg = read<
          Header & { height: number; width: number; encoding: string; is_bigendian: number; step: number; data: Uint8Array }
        >(data);
        const frame = rawFrame(msg.width, msg.height, msg.encoding, msg.step, msg.data, msg.is_bigendian !== 0);
        return { frame, stamp: headerStamp(msg.header?.stamp) };
      };
}

// Error messages start with a short cause before the first ':' (the summaries count rejections by it).

function compressedFrame(format: string, data: Uint8Array): CameraFrame {
  const sniffed = sniffImage(data);
  if (!sniffed)
    throw new Error(`not a JPEG or PNG image: format ${JSON.stringify(format)}, ${data.length} bytes, starts ${hexStart(data)}`);
  // The format string is free text, e.g. "jpeg", "png" or "rgb8; jpeg compressed bgr8".
  // When it names a codec, it must agree with the bytes.
  const named = /jpe?g/i.test(format) ? 'jpeg' : /png/i.test(format) ? 'png' : undefined;
  if (named && named !== sniffed)
    throw new Error(`format does not match the data: format ${JSON.stringify(format)} but the data is ${sniffed}`);
  if (!named && format.trim() !== '') throw new Error(`unsupported format: ${JSON.stringify(format)}`);
  return { encoding: sniffed, data };
}

function rawFrame(width: number, height: number, encodingName: string, step: number, data: Uint8Array, bigEndian: boolean): CameraFrame {
  const known = RAW_ENCODINGS[encodingName];
  if (!known)
    throw new Error(`unsupported pixel encoding: ${JSON.stringify(encodingName)} (supported: ${Object.keys(RAW_ENCODINGS).join(', ')})`);
  if (width === 0 || height === 0) throw new Error(`empty image: ${width}x${height}`);
  if (step < width * known.bytesPerPixel)
    throw new Error(`step too small: step ${step} is less than width ${width} × ${known.bytesPerPixel} bytes`);
  if (data.length !== step * height)
    throw new Error(`data size is not step × height: ${data.length} bytes, expected ${step} × ${height} = ${step * height}`);
  let pixels = data;
  if (bigEndian && known.bytesPerPixel === 2) {
    // percept's frames are little endian: swap each 16-bit sample.
    pixels = Buffer.from(data);
    (pixels as Buffer).swap16();
  }
  return { encoding: known.encoding, data: pixels, width, height, stride: step };
}

function sniffImage(data: Uint8Array): 'jpeg' | 'png' | undefined {
  if (data.length >= 3 && data[0] === 0xff && data[1] === 0xd8 && data[2] === 0xff) return 'jpeg';
  const png = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  if (data.length >= 8 && png.every((b, i) => data[i] === b)) return 'png';
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
  if (typeof v !== 'string') throw new Error(`bad field: ${field} is not a string`);
  return v;
}

function expectUint(msg: Record<string, unknown>, field: string): number {
  const v = msg[field];
  if (!Number.isInteger(v) || (v as number) < 0) throw new Error(`bad field: ${field} is not a non-negative integer`);
  return v as number;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
function base64Field(msg: Record<string, unknown>, field: string): Uint8Array {
  const v = expectString(msg, field);
  // Buffer.from(…, 'base64') silently skips bad characters; check first so corruption is reported.
  if (v.length % 4 !== 0 || !BASE64.test(v)) throw new Error(`bad field: ${field} is not valid base64`);
  return Buffer.from(v, 'base64');
}

function describeEnd(end: McapEnd): string {
  return end.complete
    ? `the data section is complete (${end.validBytes} bytes)`
    : `valid up to byte ${end.validBytes} of ${end.fileBytes}: ${end.reason}`;
}
