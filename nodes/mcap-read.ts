// mcap-read: an MCAP file opened for reading whatever it holds, damaged or not.
// The bag source replays from it, and `percept eval` reads recordings with it.
// Reading and damage: nodes/README.md#bag-source
import { open } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { McapIndexedReader, McapRecordBuilder, McapStreamReader, Opcode } from '@mcap/core';
import type { McapTypes, TypedMcapRecord } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';

/** What reading an MCAP file yields, in file order. */
export type McapReadEvent =
  | { readonly kind: 'message'; readonly message: McapTypes.Message }
  | { readonly kind: 'metadata'; readonly metadata: McapTypes.Metadata }
  /** A chunk that failed its CRC or did not decompress. `lost`: channel id → log times of the
   * messages it held, from the message index after it (undefined when there is none). */
  | {
      readonly kind: 'badChunk';
      readonly offset: number;
      readonly length: number;
      readonly reason: string;
      readonly lost: ReadonlyMap<number, readonly bigint[]> | undefined;
    };

/** Where and how the readable part of a file ended. */
export interface McapEnd {
  /** Bytes from the start that parse as whole records. */
  readonly validBytes: number;
  readonly fileBytes: number;
  /** The data section ended properly (a DataEnd or footer record was reached). */
  readonly complete: boolean;
  /** Why reading stopped early (null when complete). */
  readonly reason: string | null;
}

const MAGIC = Buffer.from([0x89, 0x4d, 0x43, 0x41, 0x50, 0x30, 0x0d, 0x0a]);
const RECORD_HEADER = 9; // opcode u8 + content length u64
/** Bytes read from the file at a time (records larger than this are read whole). */
const READ_WINDOW = 4 * 1024 * 1024;

/**
 * An MCAP file opened for reading whatever it holds.
 * Channels, schemas and counts come from its summary, or without one from a first streaming pass.
 * That pass also finds where the valid part ends.
 * `read()` streams the data section again, one top-level record at a time, surviving bad chunks.
 */
export class McapFile {
  readonly path: string;
  readonly mode: 'indexed' | 'streamed';
  /** Why the summary could not be used (null when it could). */
  readonly summaryError: string | null;
  readonly channels: ReadonlyMap<number, McapTypes.Channel>;
  readonly schemas: ReadonlyMap<number, McapTypes.Schema>;
  /** How the streaming scan ended (streamed mode only). */
  readonly end: McapEnd | null;
  /** Log time of the first message (0 when there is none). */
  readonly startNs: bigint;
  readonly #handle: FileHandle;
  readonly #size: number;
  readonly #decompressHandlers: McapTypes.DecompressHandlers;
  readonly #counts: ReadonlyMap<number, number>;
  /** Chunk start offset → the channels it holds (indexed mode, when the file has message indexes). */
  readonly #chunkChannels: ReadonlyMap<number, ReadonlySet<number>>;
  // What read() met (the scan of a file without summary takes its channels and end from them).
  readonly #seenChannels = new Map<number, McapTypes.Channel>();
  readonly #seenSchemas = new Map<number, McapTypes.Schema>();
  #lastEnd: McapEnd | null = null;

  private constructor(init: {
    path: string;
    handle: FileHandle;
    size: number;
    decompressHandlers: McapTypes.DecompressHandlers;
    summaryError: string | null;
    channels: ReadonlyMap<number, McapTypes.Channel>;
    schemas: ReadonlyMap<number, McapTypes.Schema>;
    counts: ReadonlyMap<number, number>;
    chunkChannels: ReadonlyMap<number, ReadonlySet<number>>;
    end: McapEnd | null;
    startNs: bigint;
  }) {
    this.path = init.path;
    this.#handle = init.handle;
    this.#size = init.size;
    this.#decompressHandlers = init.decompressHandlers;
    this.summaryError = init.summaryError;
    this.mode = init.summaryError === null ? 'indexed' : 'streamed';
    this.channels = init.channels;
    this.schemas = init.schemas;
    this.#counts = init.counts;
    this.#chunkChannels = init.chunkChannels;
    this.end = init.end;
    this.startNs = init.startNs;
  }

  /** Opens `path`: throws (naming it) when it cannot be opened or does not start as MCAP. */
  static async open(path: string): Promise<McapFile> {
    let handle: FileHandle;
    try {
      handle = await open(path, 'r');
    } catch (err) {
      throw new Error(`bag source: cannot open ${path}: ${(err as Error).message}`, { cause: err });
    }
    try {
      const size = (await handle.stat()).size;
      const head = Buffer.alloc(MAGIC.length);
      await handle.read(head, 0, head.length, 0);
      if (size < MAGIC.length || !head.equals(MAGIC)) {
        throw new Error(`bag source: ${path} is not an MCAP file (it does not start with the MCAP magic; ${size} bytes)`);
      }
      const decompressHandlers = await loadDecompressHandlers();
      let reader: McapIndexedReader | undefined;
      let summaryError: string | null = null;
      try {
        reader = await McapIndexedReader.Initialize({ readable: new FileHandleReadable(handle), decompressHandlers });
        if (reader.chunkIndexes.length === 0 && reader.channelsById.size === 0) summaryError = 'its summary lists no channels';
        else if (!reader.statistics) summaryError = 'its summary has no statistics';
      } catch (err) {
        summaryError = `no readable summary (${(err as Error).message})`;
      }
      if (reader && summaryError === null) {
        const chunkChannels = new Map<number, ReadonlySet<number>>();
        for (const chunk of reader.chunkIndexes) {
          if (chunk.messageIndexOffsets.size > 0)
            chunkChannels.set(Number(chunk.chunkStartOffset), new Set(chunk.messageIndexOffsets.keys()));
        }
        const counts = new Map([...reader.statistics!.channelMessageCounts].map(([id, n]) => [id, Number(n)]));
        return new McapFile({
          path,
          handle,
          size,
          decompressHandlers,
          summaryError,
          channels: reader.channelsById,
          schemas: reader.schemasById,
          counts,
          chunkChannels,
          end: null,
          startNs: reader.statistics!.messageStartTime,
        });
      }
      // No usable summary: one streaming pass finds the channels, the counts and where it ends.
      const scan = new McapFile({
        path,
        handle,
        size,
        decompressHandlers,
        summaryError,
        channels: new Map(),
        schemas: new Map(),
        counts: new Map(),
        chunkChannels: new Map(),
        end: null,
        startNs: 0n,
      });
      const counts = new Map<number, number>();
      let startNs: bigint | undefined;
      for await (const event of scan.read()) {
        if (event.kind !== 'message') continue;
        counts.set(event.message.channelId, (counts.get(event.message.channelId) ?? 0) + 1);
        if (startNs === undefined || event.message.logTime < startNs) startNs = event.message.logTime;
      }
      return new McapFile({
        path,
        handle,
        size,
        decompressHandlers,
        summaryError,
        channels: scan.#seenChannels,
        schemas: scan.#seenSchemas,
        counts,
        chunkChannels: new Map(),
        end: scan.#lastEnd,
        startNs: startNs ?? 0n,
      });
    } catch (err) {
      await handle.close();
      throw err;
    }
  }

  /** Messages on a channel (0 when unknown). */
  countOf = (channelId: number): number => this.#counts.get(channelId) ?? 0;

  get totalMessages(): number {
    let n = 0;
    for (const count of this.#counts.values()) n += count;
    return n;
  }

  describeChannel(channelId: number): string {
    const channel = this.channels.get(channelId);
    const schema = channel ? this.schemas.get(channel.schemaId) : undefined;
    return `${schema ? schema.name : '(no schema)'}, ${channel?.messageEncoding ?? '?'}`;
  }

  /**
   * The data section in file order: messages (of `channels` only, when given), metadata, and the
   * chunks that could not be read. Stops at the end of the data section, or where the file stops
   * being valid (see `lastEnd`).
   */
  async *read(channels?: ReadonlySet<number>): AsyncGenerator<McapReadEvent> {
    const window = new FileWindow(this.#handle, this.#size);
    const newReader = (): McapStreamReader => {
      // A fresh reader (after a bad record) learns the schemas and channels met so far first.
      const reader = new McapStreamReader({ noMagicPrefix: true, decompressHandlers: this.#decompressHandlers, validateCrcs: true });
      const builder = new McapRecordBuilder();
      for (const schema of [...this.schemas.values(), ...this.#seenSchemas.values()]) builder.writeSchema(schema);
      for (const channel of [...this.channels.values(), ...this.#seenChannels.values()]) builder.writeChannel(channel);
      if (builder.length > 0) {
        reader.append(builder.buffer);
        while (reader.nextRecord());
      }
      return reader;
    };
    let reader = newReader();
    let offset = MAGIC.length;
    let end: McapEnd | undefined;
    let bad: { offset: number; length: number; reason: string; lost: Map<number, bigint[]> | undefined } | undefined;
    const flushBad = function* (): Generator<McapReadEvent> {
      if (bad) yield { kind: 'badChunk', ...bad };
      bad = undefined;
    };
    while (!end) {
      if (offset + RECORD_HEADER > this.#size) {
        end = this.#ended(
          offset,
          offset === this.#size
            ? 'the file ends without a footer (not closed: a crashed recording?)'
            : 'the file ends inside a record header',
        );
        break;
      }
      const header = await window.bytes(offset, RECORD_HEADER);
      const opcode = header[0]!;
      const length = Number(Buffer.from(header.buffer, header.byteOffset + 1, 8).readBigUInt64LE());
      const recordEnd = offset + RECORD_HEADER + length;
      if (recordEnd > this.#size) {
        end = this.#ended(
          offset,
          `the file ends inside a record (opcode ${opcode}, ${length} bytes, ${recordEnd - this.#size} of them missing)`,
        );
        break;
      }
      if (opcode === Opcode.FOOTER || opcode === Opcode.DATA_END) {
        end = { validBytes: offset, fileBytes: this.#size, complete: true, reason: null };
        break;
      }
      if (opcode !== Opcode.MESSAGE_INDEX) yield* flushBad();
      const wanted =
        opcode === Opcode.CHUNK
          ? !channels || !this.#chunkChannels.has(offset) || [...this.#chunkChannels.get(offset)!].some((c) => channels.has(c))
          : opcode === Opcode.MESSAGE_INDEX
            ? bad !== undefined
            : FED_OPCODES.has(opcode);
      if (wanted) {
        const records: TypedMcapRecord[] = [];
        try {
          reader.append(await window.bytes(offset, RECORD_HEADER + length));
          for (let record; (record = reader.nextRecord());) records.push(record);
        } catch (err) {
          const reason = (err as Error).message.replace(/ \[(library=.*|no header)\]$/, '');
          if (opcode !== Opcode.CHUNK) {
            end = this.#ended(offset, `the record at byte ${offset} (opcode ${opcode}) does not parse: ${reason}`);
            break;
          }
          reader = newReader();
          bad = { offset, length: RECORD_HEADER + length, reason, lost: undefined };
          records.length = 0; // a chunk's records are all or nothing
        }
        for (const record of records) {
          if (record.type === 'Schema') this.#seenSchemas.set(record.id, record);
          else if (record.type === 'Channel') this.#seenChannels.set(record.id, record);
          else if (record.type === 'Message') {
            if (!channels || channels.has(record.channelId)) yield { kind: 'message', message: record };
          } else if (record.type === 'Metadata') yield { kind: 'metadata', metadata: record };
          else if (record.type === 'MessageIndex' && bad) {
            bad.lost ??= new Map();
            bad.lost.set(
              record.channelId,
              record.records.map(([logTime]) => logTime),
            );
          }
        }
      }
      offset = recordEnd;
    }
    yield* flushBad();
    this.#lastEnd = end;
  }

  #ended(offset: number, reason: string): McapEnd {
    return { validBytes: offset, fileBytes: this.#size, complete: false, reason };
  }

  async close(): Promise<void> {
    await this.#handle.close();
  }
}

/** The top-level records the stream reader is given (others are passed over unread). */
const FED_OPCODES: ReadonlySet<number> = new Set([Opcode.HEADER, Opcode.SCHEMA, Opcode.CHANNEL, Opcode.MESSAGE, Opcode.METADATA]);

/** Reads a file through one buffer of READ_WINDOW bytes, in order. */
class FileWindow {
  readonly #handle: FileHandle;
  readonly #size: number;
  #storage = Buffer.alloc(0);
  #buffer = Buffer.alloc(0);
  #start = 0;

  constructor(handle: FileHandle, size: number) {
    this.#handle = handle;
    this.#size = size;
  }

  /** `length` bytes at `offset` (a view, valid until the next call). */
  async bytes(offset: number, length: number): Promise<Uint8Array> {
    if (offset < this.#start || offset + length > this.#start + this.#buffer.length) {
      const size = Math.min(Math.max(length, READ_WINDOW), this.#size - offset);
      if (this.#storage.length < size) this.#storage = Buffer.allocUnsafe(size);
      const { bytesRead } = await this.#handle.read(this.#storage, 0, size, offset);
      if (bytesRead < length) throw new Error(`read ${bytesRead} of ${length} bytes at ${offset}`);
      this.#start = offset;
      this.#buffer = this.#storage.subarray(0, bytesRead);
    }
    return this.#buffer.subarray(offset - this.#start, offset - this.#start + length);
  }
}
