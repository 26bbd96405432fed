// Test bags: MCAP files written with @mcap/core's McapWriter, ROS 2 messages serialised with
// @foxglove/rosmsg2-serialization from the message definitions as ROS 2 ships them (the text a
// rosbag2 MCAP bag stores in its ros2msg schema records; the bench writes the same), and ways to
// damage a file.
import { readFileSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { McapIndexedReader, McapWriter } from '@mcap/core';
import { FileHandleReadable, FileHandleWritable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageWriter } from '@foxglove/rosmsg2-serialization';
import * as zstd from '@foxglove/wasm-zstd';
import { ROS2_DEFINITIONS } from '../../nodes/recorder.ts';

/** sensor_msgs/msg/CompressedImage and Image as rosbag2 stores them: the recorder's ros2 definitions. */
export const ROS_COMPRESSED_IMAGE = ROS2_DEFINITIONS['sensor_msgs/msg/CompressedImage'];
export const ROS_IMAGE = ROS2_DEFINITIONS['sensor_msgs/msg/Image'];

const rosHeader = (stampNs: bigint, frameId = 'camera') => ({
  stamp: { sec: Number(stampNs / 1_000_000_000n), nanosec: Number(stampNs % 1_000_000_000n) },
  frame_id: frameId,
});

export function rosCompressedImage(stampNs: bigint, format: string, data: Uint8Array): Uint8Array {
  return new MessageWriter(parseRosMsg(ROS_COMPRESSED_IMAGE, { ros2: true })).writeMessage({ header: rosHeader(stampNs), format, data });
}

export interface RosImageFields {
  readonly width: number;
  readonly height: number;
  readonly encoding: string;
  readonly step: number;
  readonly data: Uint8Array;
  readonly bigEndian?: boolean;
}

export function rosImage(stampNs: bigint, image: RosImageFields): Uint8Array {
  return new MessageWriter(parseRosMsg(ROS_IMAGE, { ros2: true })).writeMessage({
    header: rosHeader(stampNs),
    height: image.height,
    width: image.width,
    encoding: image.encoding,
    is_bigendian: image.bigEndian ? 1 : 0,
    step: image.step,
    data: image.data,
  });
}

export const json = (v: unknown): Uint8Array => new TextEncoder().encode(JSON.stringify(v));

export interface WriteBagOptions {
  /** McapWriter chunkSize (default 64 KiB). */
  readonly chunkSize?: number;
  readonly zstd?: boolean;
}

export async function writeBag(path: string, build: (w: McapWriter) => Promise<void>, options: WriteBagOptions = {}): Promise<void> {
  if (options.zstd) await zstd.isLoaded;
  const handle = await open(path, 'w');
  try {
    const w = new McapWriter({
      writable: new FileHandleWritable(handle),
      chunkSize: options.chunkSize ?? 64 * 1024,
      ...(options.zstd ? { compressChunk: (data: Uint8Array) => ({ compression: 'zstd', compressedData: zstd.compress(data, 1) }) } : {}),
    });
    await w.start({ profile: 'ros2', library: 'percept test' });
    await build(w);
    await w.end();
  } finally {
    await handle.close();
  }
}

/** The summary of a well-formed file (@mcap/core's indexed reader). */
export async function readSummary(path: string): Promise<McapIndexedReader> {
  const handle = await open(path, 'r');
  try {
    return await McapIndexedReader.Initialize({
      readable: new FileHandleReadable(handle),
      decompressHandlers: await loadDecompressHandlers(),
    });
  } finally {
    await handle.close();
  }
}

/** Copies `from` to `to` with the middle of chunk `index` overwritten (its CRC no longer matches);
 * returns where the chunk is and the log times of the messages it held (log times increase through
 * the files written here, so they are those in the chunk's time range). */
export async function corruptChunk(from: string, to: string, index: number): Promise<{ offset: number; logTimes: bigint[] }> {
  const reader = await readSummary(from);
  const chunk = reader.chunkIndexes[index];
  if (!chunk) throw new Error(`${from} has ${reader.chunkIndexes.length} chunks, no chunk ${index}`);
  const logTimes: bigint[] = [];
  const handle = await open(from, 'r');
  try {
    const again = await McapIndexedReader.Initialize({
      readable: new FileHandleReadable(handle),
      decompressHandlers: await loadDecompressHandlers(),
    });
    for await (const m of again.readMessages({ startTime: chunk.messageStartTime, endTime: chunk.messageEndTime }))
      logTimes.push(m.logTime);
  } finally {
    await handle.close();
  }
  const bytes = readFileSync(from);
  const mid = Number(chunk.chunkStartOffset + chunk.chunkLength / 2n);
  for (let k = 0; k < 64; k++) bytes[mid + k] ^= 0x5a;
  writeFileSync(to, bytes);
  return { offset: Number(chunk.chunkStartOffset), logTimes };
}
