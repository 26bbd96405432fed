// recorder: a tap that writes actions and events to an MCAP file.
//   /actions  jsonschema = the action schema file; data = the action JSON exactly as validated, so any
//             MCAP tool can check it against the schema. One channel per source id (same topic),
//             with metadata {source_id, schema_id, schema_sha256}; message.sequence = frame id,
//             publishTime = capture wall time (ns since epoch), logTime = the caller's pipeline time.
//   /events   json without schema; bigint fields are written as decimal strings.
// Chunks are zstd-compressed (@foxglove/wasm-zstd). McapWriter needs each call to finish before the
// next one starts, so every call is appended to one internal promise chain; after a write fails the
// file is unusable and every later call rejects with that first error.
import { open } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { McapWriter } from '@mcap/core';
import { FileHandleWritable } from '@mcap/nodejs';
import * as zstd from '@foxglove/wasm-zstd';
import type { ActionSchema } from './action-schema.ts';
import type { ActionMessage } from './payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';

export const ACTIONS_TOPIC = '/actions';
export const EVENTS_TOPIC = '/events';

export interface RecorderOptions {
  /** Output .mcap file (created or truncated). */
  readonly path: string;
  /** The action schema, loaded once with loadActionSchema: its file becomes the /actions channel schema. */
  readonly actionSchema: ActionSchema;
  /** 'zstd' (default) or 'none'. */
  readonly compression?: 'zstd' | 'none';
  /** Uncompressed bytes per chunk before it is flushed (default 256 KiB). */
  readonly chunkSize?: number;
  /** MCAP header.library (default "percept recorder"). */
  readonly library?: string;
}

export interface RecorderCounts {
  readonly actions: number;
  readonly events: number;
}

export interface Recorder {
  readonly path: string;
  readonly counts: RecorderCounts;
  recordAction(msg: ActionMessage, logTimeNs: bigint): Promise<void>;
  recordEvent(event: object, logTimeNs: bigint): Promise<void>;
  /** Waits for pending writes, writes the summary and closes the file. Idempotent. */
  close(): Promise<void>;
}

export async function createRecorder(options: RecorderOptions): Promise<Recorder> {
  if (options === null || typeof options !== 'object') throw new TypeError('createRecorder: expected an options object { path }');
  const { path, compression = 'zstd', chunkSize = 256 * 1024, library = 'percept recorder' } = options;
  if (typeof path !== 'string' || path.length === 0)
    throw new TypeError(`createRecorder: expected a non-empty path but received ${JSON.stringify(path)}`);
  if (compression !== 'zstd' && compression !== 'none') {
    throw new TypeError(`createRecorder: expected compression 'zstd' or 'none' but received ${JSON.stringify(compression)}`);
  }
  if (!Number.isInteger(chunkSize) || chunkSize < 1024)
    throw new RangeError(`createRecorder: expected integer >= 1024 for chunkSize but received ${chunkSize}`);
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
  const writer = new McapWriter({
    writable: new FileHandleWritable(handle),
    chunkSize,
    compressChunk: compression === 'zstd' ? (data) => ({ compression: 'zstd', compressedData: zstd.compress(data, 3) }) : undefined,
  });

  let tail: Promise<unknown> = Promise.resolve();
  let failure: Error | undefined;
  let closing: Promise<void> | undefined;
  // Appends `op` to the chain. The first failure poisons the recorder: McapWriter's state is
  // undefined after a failed call, so carrying on would write a corrupt file.
  const enqueue = <T>(what: string, op: () => Promise<T>): Promise<T> => {
    const run = tail.then(async () => {
      if (failure) throw failure;
      try {
        return await op();
      } catch (err) {
        failure ??= new Error(`recorder ${path}: ${what} failed: ${(err as Error).message}`, { cause: err });
        throw failure;
      }
    });
    tail = run.catch(() => undefined);
    return run;
  };

  let eventsChannel = 0;
  let actionSchemaId = 0;
  const actionChannels = new Map<string, number>();
  const counts = { actions: 0, events: 0 };

  try {
    await enqueue('start', async () => {
      await writer.start({ profile: '', library });
      // Registered up front so a recording without actions still declares the schema.
      actionSchemaId = await writer.registerSchema(schema.mcapSchema);
      eventsChannel = await writer.registerChannel({ topic: EVENTS_TOPIC, schemaId: 0, messageEncoding: 'json', metadata: new Map() });
    });
  } catch (err) {
    await handle.close().catch(() => undefined);
    throw err;
  }

  const channelFor = async (sourceId: string): Promise<number> => {
    let id = actionChannels.get(sourceId);
    if (id === undefined) {
      id = await writer.registerChannel({
        topic: ACTIONS_TOPIC,
        schemaId: actionSchemaId,
        messageEncoding: 'json',
        metadata: new Map([
          ['source_id', sourceId],
          ['schema_id', schema.wireSchemaId],
          ['schema_sha256', schema.sha256],
        ]),
      });
      actionChannels.set(sourceId, id);
    }
    return id;
  };

  const checkTime = (fn: string, logTimeNs: bigint): void => {
    if (typeof logTimeNs !== 'bigint' || logTimeNs < 0n) {
      throw new TypeError(`recorder.${fn}: expected a bigint logTimeNs >= 0 but received ${String(logTimeNs)} of type ${typeof logTimeNs}`);
    }
  };

  return {
    path,
    get counts(): RecorderCounts {
      return { ...counts };
    },
    async recordAction(msg: ActionMessage, logTimeNs: bigint): Promise<void> {
      checkTime('recordAction', logTimeNs);
      if (msg === null || typeof msg !== 'object' || typeof msg.sourceId !== 'string' || !Number.isInteger(msg.frameId)) {
        throw new TypeError('recorder.recordAction: expected an ActionMessage { frameId, sourceId, captureWallMs, action }');
      }
      if (closing) throw new Error(`recorder ${path}: recordAction after close`);
      const data = new TextEncoder().encode(JSON.stringify(msg.action));
      await enqueue(`recordAction(frame ${msg.frameId})`, async () => {
        const channelId = await channelFor(msg.sourceId);
        await writer.addMessage({
          channelId,
          // MCAP sequence is uint32; frame ids are non-negative and far below 2^32 in practice.
          sequence: msg.frameId >>> 0,
          logTime: logTimeNs,
          publishTime: BigInt(Math.round(msg.captureWallMs)) * 1_000_000n,
          data,
        });
        counts.actions += 1;
      });
    },
    async recordEvent(event: object, logTimeNs: bigint): Promise<void> {
      checkTime('recordEvent', logTimeNs);
      if (event === null || typeof event !== 'object')
        throw new TypeError(`recorder.recordEvent: expected an event object but received ${String(event)}`);
      if (closing) throw new Error(`recorder ${path}: recordEvent after close`);
      const data = new TextEncoder().encode(JSON.stringify(event, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)));
      await enqueue('recordEvent', async () => {
        await writer.addMessage({ channelId: eventsChannel, sequence: counts.events, logTime: logTimeNs, publishTime: logTimeNs, data });
        counts.events += 1;
      });
    },
    close(): Promise<void> {
      closing ??= (async () => {
        try {
          await enqueue('end', () => writer.end());
        } finally {
          await handle.close();
        }
      })();
      return closing;
    },
  };
}

/** A pass-through stage that records every action it sees, stamped with the pipeline clock. */
export function createRecorderTap(recorder: Recorder): Stage<ActionMessage, ActionMessage> {
  return {
    name: 'record',
    async process(msg: ActionMessage, ctx: StageContext): Promise<ActionMessage> {
      await recorder.recordAction(msg, ctx.clock.nowNs());
      return msg;
    },
  };
}
