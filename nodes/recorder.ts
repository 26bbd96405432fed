// recorder: a run's MCAP recording, readable by Foxglove and by `percept eval`, even after a crash.
// Topics /frames, /actions, /events and /stats. Chunks close on time as well as size.
// Calls are serialised on one promise chain. After a write fails, every later call rejects with that first error (`failure`).
// Layout, times, chunks and backpressure: nodes/README.md#recorder
import { open } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { crc32 } from 'node:zlib';
import { McapChunkBuilder, McapRecordBuilder, Opcode } from '@mcap/core';
import type { McapTypes } from '@mcap/core';
import * as zstd from '@foxglove/wasm-zstd';
import { CompressedImage, RawImage } from '@foxglove/schemas/jsonschema.js';
import type { ActionSchema } from './action-schema.ts';
import type { ActionMessage, CameraFrame } from './payloads.ts';

export const FRAMES_TOPIC = '/frames';
export const ACTIONS_TOPIC = '/actions';
export const EVENTS_TOPIC = '/events';
export const STATS_TOPIC = '/stats';

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

/** Creates (or truncates) the file and writes its header; throws naming the path when it cannot. */
export async function createRecorder(options: RecorderOptions): Promise<Recorder> {
  if (options === null || typeof options !== 'object') throw new TypeError('createRecorder: expected an options object { path }');
  const {
    path,
    compression = 'zstd',
    zstdLevel = 1,
    chunkMs = 1000,
    chunkBytes = 32 * 1024 * 1024,
    maxPendingBytes = 256 * 1024 * 1024,
    library = 'percept recorder',
  } = options;
  const flushAfterMs = options.flushAfterMs === undefined ? chunkMs : options.flushAfterMs;
  if (typeof path !== 'string' || path.length === 0)
    throw new TypeError(`createRecorder: expected a non-empty path but received ${JSON.stringify(path)}`);
  if (compression !== 'zstd' && compression !== 'none') {
    throw new TypeError(`createRecorder: expected compression 'zstd' or 'none' but received ${JSON.stringify(compression)}`);
  }
  for (const [name, value, least] of [
    ['chunkMs', chunkMs, 1],
    ['chunkBytes', chunkBytes, 1024],
    ['maxPendingBytes', maxPendingBytes, 0],
    ['zstdLevel', zstdLevel, 1],
  ] as const) {
    if (!Number.isInteger(value) || value < least)
      throw new RangeError(`createRecorder: expected integer >= ${least} for ${name} but received ${value}`);
  }
  if (flushAfterMs !== null && !(Number.isFinite(flushAfterMs) && flushAfterMs > 0))
    throw new RangeError(`createRecorder: expected flushAfterMs > 0 or null but received ${flushAfterMs}`);
  const schema = options.actionSchema;
  if (typeof schema?.mcapSchema !== 'object')
    throw new TypeError('createRecorder: expected actionSchema to be the result of loadActionSchema()');

  if (compression === 'zstd') await zstd.isLoaded;
  let handle: FileHandle;
  try {
    handle = await open(path, 'w');
  } catch (err) {
    throw new Error(`recorder: cannot create ${path}: ${(err as Error).message}`, { cause: err });
  }
  const file = new ChunkedMcapFile(handle, {
    chunkMs: BigInt(chunkMs) * 1_000_000n,
    chunkBytes,
    compress: compression === 'zstd' ? (data) => zstd.compress(data, zstdLevel) : undefined,
  });

  let tail: Promise<unknown> = Promise.resolve();
  let failure: Error | undefined;
  let closing: Promise<void> | undefined;
  // The wall-time flush: armed while a chunk is open, disarmed when that chunk is written.
  let flushTimer: NodeJS.Timeout | undefined;
  let chunksSeen = 0;
  const rearm = (): void => {
    if (file.chunksWritten !== chunksSeen) {
      chunksSeen = file.chunksWritten;
      clearTimeout(flushTimer);
      flushTimer = undefined;
    }
    if (flushAfterMs === null || flushTimer || !file.chunkOpen || closing) return;
    flushTimer = setTimeout(() => {
      flushTimer = undefined;
      void enqueue('flush', () => file.flushChunk()).catch(() => undefined);
    }, flushAfterMs);
    flushTimer.unref();
  };
  // Appends `op` to the chain. The first failure poisons the recorder: the layout is undefined
  // after a failed write, so carrying on would write a corrupt file.
  const enqueue = <T>(what: string, op: () => Promise<T>): Promise<T> => {
    const run = tail.then(async () => {
      if (failure) throw failure;
      try {
        return await op();
      } catch (err) {
        failure ??= new Error(`recorder ${path}: ${what} failed: ${(err as Error).message}`, { cause: err });
        throw failure;
      } finally {
        rearm();
      }
    });
    tail = run.catch(() => undefined);
    return run;
  };
  const add = (what: string, message: Omit<McapTypes.Message, 'channelId'>, channel: () => number): Promise<void> =>
    enqueue(what, () => file.addMessage({ ...message, channelId: channel() }));

  const jsonSchema = (name: string, body: object): Omit<McapTypes.Schema, 'id'> => ({
    name,
    encoding: 'jsonschema',
    data: new TextEncoder().encode(JSON.stringify(body)),
  });
  const actionSchemaId = file.registerSchema(schema.mcapSchema);
  const compressedSchemaId = file.registerSchema(jsonSchema(CompressedImage.title, CompressedImage));
  const rawSchemaId = file.registerSchema(jsonSchema(RawImage.title, RawImage));
  const eventsChannel = file.registerChannel({
    topic: EVENTS_TOPIC,
    schemaId: file.registerSchema(jsonSchema('percept.TelemetryEvent', { title: 'percept.TelemetryEvent', type: 'object' })),
    messageEncoding: 'json',
    metadata: new Map(),
  });
  const statsChannel = file.registerChannel({
    topic: STATS_TOPIC,
    schemaId: file.registerSchema(jsonSchema('percept.RunSummary', { title: 'percept.RunSummary', type: 'object' })),
    messageEncoding: 'json',
    metadata: new Map(),
  });
  const perSource = (topic: string, schemaId: number, metadata: (sourceId: string) => [string, string][]) => {
    const ids = new Map<string, number>();
    return (sourceId: string): number => {
      let id = ids.get(sourceId);
      if (id === undefined) {
        id = file.registerChannel({ topic, schemaId, messageEncoding: 'json', metadata: new Map(metadata(sourceId)) });
        ids.set(sourceId, id);
      }
      return id;
    };
  };
  const actionChannel = perSource(ACTIONS_TOPIC, actionSchemaId, (sourceId) => [
    ['source_id', sourceId],
    ['schema_id', schema.wireSchemaId],
    ['schema_sha256', schema.sha256],
  ]);
  const compressedChannel = perSource(FRAMES_TOPIC, compressedSchemaId, (sourceId) => [['source_id', sourceId]]);
  const rawChannel = perSource(FRAMES_TOPIC, rawSchemaId, (sourceId) => [['source_id', sourceId]]);

  try {
    await enqueue('start', () => file.start({ profile: '', library }));
  } catch (err) {
    await handle.close().catch(() => undefined);
    throw err;
  }

  const counts = { frames: 0, actions: 0, events: 0, stats: 0, framesNotRecorded: 0 };
  let pendingFrameBytes = 0;
  const checkTime = (fn: string, ns: bigint, name = 'logTimeNs'): void => {
    if (typeof ns !== 'bigint' || ns < 0n) {
      throw new TypeError(`recorder.${fn}: expected a bigint ${name} >= 0 but received ${String(ns)} of type ${typeof ns}`);
    }
  };
  const checkOpen = (fn: string): void => {
    if (closing) throw new Error(`recorder ${path}: ${fn} after close`);
  };
  const encode = (value: unknown): Uint8Array =>
    new TextEncoder().encode(JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)));

  return {
    path,
    get counts(): RecorderCounts {
      return { ...counts, chunks: file.chunksWritten };
    },
    get failure(): Error | undefined {
      return failure;
    },
    async writeMetadata(name: string, entries: Readonly<Record<string, string>>): Promise<void> {
      checkOpen('writeMetadata');
      await enqueue(`writeMetadata(${name})`, () => file.addMetadata({ name, metadata: new Map(Object.entries(entries)) }));
    },
    async recordFrame(frame: CameraFrame, meta: RecordedFrameMeta, logTimeNs: bigint): Promise<boolean> {
      checkTime('recordFrame', logTimeNs);
      checkTime('recordFrame', meta?.stampNs, 'meta.stampNs');
      if (frame === null || typeof frame !== 'object' || !(frame.data instanceof Uint8Array))
        throw new TypeError('recorder.recordFrame: expected a CameraFrame { encoding, data }');
      checkOpen('recordFrame');
      if (pendingFrameBytes + frame.data.length > maxPendingBytes && pendingFrameBytes > 0) {
        counts.framesNotRecorded += 1;
        return false;
      }
      pendingFrameBytes += frame.data.length;
      const timestamp = { sec: Number(meta.stampNs / 1_000_000_000n), nsec: Number(meta.stampNs % 1_000_000_000n) };
      const compressed = frame.encoding === 'jpeg' || frame.encoding === 'png';
      try {
        await add(
          `recordFrame(frame ${meta.frameId})`,
          {
            sequence: meta.frameId >>> 0,
            logTime: logTimeNs,
            publishTime: meta.stampNs,
            // Encoded when its turn comes, so a waiting frame holds its bytes once, not twice.
            get data() {
              return encode(compressed ? compressedImage(frame, timestamp, meta.sourceId) : rawImage(frame, timestamp, meta.sourceId));
            },
          },
          () => (compressed ? compressedChannel : rawChannel)(meta.sourceId),
        );
        counts.frames += 1;
        return true;
      } finally {
        pendingFrameBytes -= frame.data.length;
      }
    },
    async recordAction(msg: ActionMessage, stampNs: bigint, logTimeNs: bigint): Promise<void> {
      checkTime('recordAction', logTimeNs);
      checkTime('recordAction', stampNs, 'stampNs');
      if (msg === null || typeof msg !== 'object' || typeof msg.sourceId !== 'string' || !Number.isInteger(msg.frameId)) {
        throw new TypeError('recorder.recordAction: expected an ActionMessage { frameId, sourceId, captureWallMs, action }');
      }
      checkOpen('recordAction');
      const data = encode(msg.action);
      await add(
        `recordAction(frame ${msg.frameId})`,
        // MCAP sequence is uint32; frame ids are non-negative and far below 2^32 in practice.
        { sequence: msg.frameId >>> 0, logTime: logTimeNs, publishTime: stampNs, data },
        () => actionChannel(msg.sourceId),
      );
      counts.actions += 1;
    },
    async recordEvent(event: object, logTimeNs: bigint, stampNs: bigint = logTimeNs): Promise<void> {
      checkTime('recordEvent', logTimeNs);
      checkTime('recordEvent', stampNs, 'stampNs');
      if (event === null || typeof event !== 'object')
        throw new TypeError(`recorder.recordEvent: expected an event object but received ${String(event)}`);
      checkOpen('recordEvent');
      const data = encode(event);
      const sequence = counts.events++;
      await add('recordEvent', { sequence, logTime: logTimeNs, publishTime: stampNs, data }, () => eventsChannel);
    },
    async recordStats(summary: object, logTimeNs: bigint): Promise<void> {
      checkTime('recordStats', logTimeNs);
      checkOpen('recordStats');
      const data = encode(summary);
      const sequence = counts.stats++;
      await add('recordStats', { sequence, logTime: logTimeNs, publishTime: logTimeNs, data }, () => statsChannel);
    },
    close(): Promise<void> {
      closing ??= (async () => {
        clearTimeout(flushTimer);
        try {
          await enqueue('end', () => file.end());
        } finally {
          await handle.close();
        }
      })();
      return closing;
    },
  };
}

type Stamp = { readonly sec: number; readonly nsec: number };

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

// ---- the file layout ----------------------------------------------------------------------------

interface ChunkPolicy {
  /** Log-time span (ns) at which a chunk is written. */
  readonly chunkMs: bigint;
  readonly chunkBytes: number;
  readonly compress: ((data: Uint8Array) => Uint8Array) | undefined;
}

/**
 * An MCAP file written in chunks that close on time as well as size.
 * It ends with the summary McapWriter writes and both CRCs.
 * The summary holds schemas, channels, statistics, metadata, chunk indexes and summary offsets.
 * Methods must be called one at a time; the recorder's chain does that.
 */
class ChunkedMcapFile {
  readonly #handle: FileHandle;
  readonly #policy: ChunkPolicy;
  readonly #records = new McapRecordBuilder();
  readonly #chunk = new McapChunkBuilder({ useMessageIndex: true });
  readonly #schemas = new Map<number, McapTypes.Schema>();
  readonly #channels = new Map<number, McapTypes.Channel>();
  readonly #written = new Set<string>();
  readonly #chunkIndexes: McapTypes.ChunkIndex[] = [];
  readonly #metadataIndexes: McapTypes.MetadataIndex[] = [];
  readonly #statistics: McapTypes.Statistics = {
    messageCount: 0n,
    schemaCount: 0,
    channelCount: 0,
    attachmentCount: 0,
    metadataCount: 0,
    chunkCount: 0,
    messageStartTime: 0n,
    messageEndTime: 0n,
    channelMessageCounts: new Map(),
  };
  #position = 0n;
  #dataCrc = 0;
  #chunkFirstLogTime = 0n;

  constructor(handle: FileHandle, policy: ChunkPolicy) {
    this.#handle = handle;
    this.#policy = policy;
  }

  get chunkOpen(): boolean {
    return this.#chunk.numMessages > 0;
  }

  get chunksWritten(): number {
    return this.#statistics.chunkCount;
  }

  registerSchema(schema: Omit<McapTypes.Schema, 'id'>): number {
    const id = this.#schemas.size + 1;
    this.#schemas.set(id, { ...schema, id });
    this.#statistics.schemaCount += 1;
    return id;
  }

  registerChannel(channel: Omit<McapTypes.Channel, 'id'>): number {
    const id = this.#channels.size;
    this.#channels.set(id, { ...channel, id });
    this.#statistics.channelCount += 1;
    return id;
  }

  async start(header: McapTypes.Header): Promise<void> {
    this.#records.writeMagic();
    this.#records.writeHeader(header);
    await this.#writeData();
  }

  async addMessage(message: McapTypes.Message): Promise<void> {
    const stats = this.#statistics;
    if (stats.messageCount === 0n || message.logTime < stats.messageStartTime) stats.messageStartTime = message.logTime;
    if (stats.messageCount === 0n || message.logTime > stats.messageEndTime) stats.messageEndTime = message.logTime;
    stats.messageCount += 1n;
    stats.channelMessageCounts.set(message.channelId, (stats.channelMessageCounts.get(message.channelId) ?? 0n) + 1n);
    const channel = this.#channels.get(message.channelId);
    if (!channel) throw new Error(`addMessage: no channel ${message.channelId}`);
    // A schema and a channel go into the chunk of their first message, once (as McapWriter does).
    if (channel.schemaId !== 0 && !this.#written.has(`s${channel.schemaId}`)) {
      this.#chunk.addSchema(this.#schemas.get(channel.schemaId)!);
      this.#written.add(`s${channel.schemaId}`);
    }
    if (!this.#written.has(`c${channel.id}`)) {
      this.#chunk.addChannel(channel);
      this.#written.add(`c${channel.id}`);
    }
    if (this.#chunk.numMessages === 0) this.#chunkFirstLogTime = message.logTime;
    this.#chunk.addMessage(message);
    const span = this.#chunk.messageEndTime - this.#chunkFirstLogTime;
    if (this.#chunk.byteLength >= this.#policy.chunkBytes || span >= this.#policy.chunkMs) await this.flushChunk();
  }

  async addMetadata(metadata: McapTypes.Metadata): Promise<void> {
    await this.flushChunk(); // keeps the records in the order they were given
    const offset = this.#position;
    const length = this.#records.writeMetadata(metadata);
    this.#metadataIndexes.push({ name: metadata.name, offset, length });
    this.#statistics.metadataCount += 1;
    await this.#writeData();
  }

  /** Writes the open chunk (if any) and its message indexes. */
  async flushChunk(): Promise<void> {
    const chunk = this.#chunk;
    if (chunk.numMessages === 0) return;
    const data = chunk.buffer;
    const records = this.#policy.compress ? this.#policy.compress(data) : data;
    const chunkStartOffset = this.#position;
    const chunkLength = this.#records.writeChunk({
      messageStartTime: chunk.messageStartTime,
      messageEndTime: chunk.messageEndTime,
      uncompressedSize: BigInt(data.length),
      uncompressedCrc: crc32(data),
      compression: this.#policy.compress ? 'zstd' : '',
      records,
    });
    const messageIndexOffsets = new Map<number, bigint>();
    let messageIndexLength = 0n;
    for (const index of chunk.indices) {
      if (index.records.length === 0) continue;
      messageIndexOffsets.set(index.channelId, chunkStartOffset + chunkLength + messageIndexLength);
      messageIndexLength += this.#records.writeMessageIndex(index);
    }
    this.#chunkIndexes.push({
      messageStartTime: chunk.messageStartTime,
      messageEndTime: chunk.messageEndTime,
      chunkStartOffset,
      chunkLength,
      messageIndexOffsets,
      messageIndexLength,
      compression: this.#policy.compress ? 'zstd' : '',
      compressedSize: BigInt(records.byteLength),
      uncompressedSize: BigInt(data.length),
    });
    chunk.reset();
    await this.#writeData();
    // Counted once the bytes are handed to the file: `chunksWritten` means on disk, not staged.
    this.#statistics.chunkCount += 1;
  }

  async end(): Promise<void> {
    await this.flushChunk();
    this.#records.writeDataEnd({ dataSectionCrc: this.#dataCrc });
    await this.#write();
    // The summary, in McapWriter's order, each group noted for the summary offsets.
    const summaryStart = this.#position;
    const groups: McapTypes.SummaryOffset[] = [];
    const group = (opcode: Opcode, write: () => bigint): void => {
      const groupStart = this.#position + BigInt(this.#records.length);
      const groupLength = write();
      if (groupLength > 0n) groups.push({ groupOpcode: opcode, groupStart, groupLength });
    };
    const sum = (items: Iterable<unknown>, write: (item: never) => bigint) => () => {
      let n = 0n;
      for (const item of items) n += write(item as never);
      return n;
    };
    group(
      Opcode.SCHEMA,
      sum(this.#schemas.values(), (s: McapTypes.Schema) => this.#records.writeSchema(s)),
    );
    group(
      Opcode.CHANNEL,
      sum(this.#channels.values(), (c: McapTypes.Channel) => this.#records.writeChannel(c)),
    );
    group(Opcode.STATISTICS, () => this.#records.writeStatistics(this.#statistics));
    group(
      Opcode.METADATA_INDEX,
      sum(this.#metadataIndexes, (m: McapTypes.MetadataIndex) => this.#records.writeMetadataIndex(m)),
    );
    group(
      Opcode.CHUNK_INDEX,
      sum(this.#chunkIndexes, (c: McapTypes.ChunkIndex) => this.#records.writeChunkIndex(c)),
    );
    const summaryOffsetStart = this.#position + BigInt(this.#records.length);
    for (const g of groups) this.#records.writeSummaryOffset(g);
    // The footer's CRC covers the summary up to and including the footer's own first two fields.
    const footerHead = Buffer.alloc(1 + 8 + 8 + 8);
    footerHead.writeUInt8(Opcode.FOOTER, 0);
    footerHead.writeBigUInt64LE(8n + 8n + 4n, 1);
    footerHead.writeBigUInt64LE(summaryStart, 9);
    footerHead.writeBigUInt64LE(summaryOffsetStart, 17);
    const summaryCrc = crc32(footerHead, crc32(this.#records.buffer));
    this.#records.writeFooter({ summaryStart, summaryOffsetStart, summaryCrc });
    this.#records.writeMagic();
    await this.#write();
  }

  /** Writes what the record builder holds as part of the data section (its CRC follows it). */
  async #writeData(): Promise<void> {
    this.#dataCrc = crc32(this.#records.buffer, this.#dataCrc);
    await this.#write();
  }

  async #write(): Promise<void> {
    const bytes = this.#records.buffer;
    let done = 0;
    while (done < bytes.length) {
      const { bytesWritten } = await this.#handle.write(bytes, done, bytes.length - done);
      done += bytesWritten;
    }
    this.#position += BigInt(bytes.length);
    this.#records.reset();
  }
}
