// mcap-write: an MCAP file written in chunks that close on time as well as size, for the recorder.
// McapWriter writes a chunk only when it is full, so this lays out the records itself.
// Chunks: nodes/README.md#recorder
import type { FileHandle } from 'node:fs/promises';
import { crc32 } from 'node:zlib';
import { McapChunkBuilder, McapRecordBuilder, Opcode } from '@mcap/core';
import type { McapTypes } from '@mcap/core';

export interface ChunkPolicy {
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
export class ChunkedMcapFile {
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
  /** Bytes of a write that failed and did not reach the file. */
  #unwritten = 0;
  #dataCrc = 0;
  #chunkFirstLogTime = 0n;

  constructor(handle: FileHandle, policy: ChunkPolicy) {
    this.#handle = handle;
    this.#policy = policy;
  }

  get chunkOpen(): boolean {
    return this.#chunk.numMessages > 0;
  }

  /** Bytes handed to the file so far. */
  get bytesWritten(): number {
    return Number(this.#position);
  }

  /** Bytes of the write that failed (what it had not written yet) plus the chunk still open: recorded, not on disk. */
  get bytesUnwritten(): number {
    return this.#unwritten + this.#chunk.byteLength;
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
    try {
      while (done < bytes.length) {
        const { bytesWritten } = await this.#handle.write(bytes, done, bytes.length - done);
        // A file that takes nothing (e.g. under /proc) would make this loop spin for ever.
        if (bytesWritten <= 0) throw new Error(`the file took none of ${bytes.length - done} bytes (write returned ${bytesWritten})`);
        done += bytesWritten;
      }
    } catch (err) {
      this.#position += BigInt(done);
      this.#unwritten += bytes.length - done;
      this.#records.reset();
      throw err;
    }
    this.#position += BigInt(bytes.length);
    this.#records.reset();
  }
}
