// source-zmq: frames a robot stack pushes over ZeroMQ, on a PULL or a SUB socket.
// PULL takes every frame, and the pusher waits when percept is behind. SUB takes the newest; a PUB drops for a slow subscriber.
// A message is [header, image] or [topic, header, image], with a JSON header (configs/wire/frame-header.schema.json).
// A message that does not fit is a rejected frame, and the source goes on.
// The capture time is the arrival time on the pipeline clock. The pusher's stamp travels unconverted as the source stamp.
// createZmqSource makes the socket and binds or connects it, so a bad endpoint fails at start.
import { readFileSync } from 'node:fs';
import { Ajv, type ValidateFunction } from 'ajv';
import { Pull, Subscriber, curveKeyPair } from 'zeromq';
import type { Clock } from '../pipeline/clock.ts';
import type { ZmqSourceConfig } from '../pipeline/config.ts';
import { insecureEndpointProblem, parseEndpoint, readCurveKey } from '../pipeline/endpoint.ts';
import {
  rejectionOf,
  type FrameSource,
  type SourceIncident,
  type SourceItem,
  type SourceRejection,
  type Stamp,
} from '../pipeline/types.ts';
import { formatAjvErrors } from './action-schema.ts';
import type { CameraFrame, FrameEncoding } from './payloads.ts';

export type ZmqSourceOptions = Omit<ZmqSourceConfig, 'kind' | 'curve' | 'insecure' | 'maxMessageBytes'> & {
  /** Bytes one message part may have (ZMQ_MAXMSGSIZE); null or absent: no limit. */
  readonly maxMessageBytes?: number | null;
  readonly curve?: ZmqSourceConfig['curve'];
  readonly insecure?: boolean;
  /** FrameSource id (default 'zmq:<endpoint>'). */
  readonly id?: string;
};

export interface ZmqSourceCounters {
  readonly received: number;
  readonly yielded: number;
  /** Messages that did not fit (yielded as rejected frames). */
  readonly rejected: number;
  /** Connections that ended: a message over maxMessageBytes ends its connection (reported as incidents). */
  readonly disconnects: number;
}

export interface ZmqSource extends FrameSource<CameraFrame> {
  /** The endpoint bound or connected (a bind's wildcard port resolved). */
  readonly endpoint: string;
  readonly counters: ZmqSourceCounters;
  frames(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection>;
  close(): Promise<void>;
}

interface FrameHeader {
  readonly stamp?: Stamp | number;
  readonly frame_id?: string;
  readonly encoding: FrameEncoding;
  readonly width?: number;
  readonly height?: number;
  readonly step?: number;
}

const HEADER_SCHEMA = new URL('../configs/wire/frame-header.schema.json', import.meta.url);
const BYTES_PER_PIXEL: Readonly<Record<FrameEncoding, number>> = {
  jpeg: 0,
  png: 0,
  rgb8: 3,
  bgr8: 3,
  rgba8: 4,
  bgra8: 4,
  mono8: 1,
  mono16: 2,
};

export async function createZmqSource(options: ZmqSourceOptions): Promise<ZmqSource> {
  if (options === null || typeof options !== 'object') throw new TypeError('createZmqSource: expected an options object { endpoint }');
  const {
    endpoint,
    socket: kind = 'pull',
    bind = false,
    topic = '',
    receiveHighWaterMark = 10,
    maxMessageBytes = null,
    curve = null,
    insecure = false,
  } = options;
  let parsed;
  try {
    parsed = parseEndpoint(endpoint, { bind });
  } catch (err) {
    throw new TypeError(`createZmqSource: ${(err as Error).message}`, { cause: err });
  }
  const refused = insecureEndpointProblem(parsed, endpoint, { bind, curve: curve !== null, insecure });
  if (refused) throw new Error(`zmq source: ${refused}`);
  if (kind !== 'pull' && kind !== 'sub')
    throw new TypeError(`createZmqSource: expected socket 'pull' or 'sub' but received ${JSON.stringify(kind)}`);
  if (!Number.isInteger(receiveHighWaterMark) || receiveHighWaterMark < 1) {
    throw new RangeError(`createZmqSource: expected integer >= 1 for receiveHighWaterMark but received ${receiveHighWaterMark}`);
  }
  if (maxMessageBytes !== null && (!Number.isInteger(maxMessageBytes) || maxMessageBytes < 1)) {
    throw new RangeError(`createZmqSource: expected integer >= 1 or null for maxMessageBytes but received ${maxMessageBytes}`);
  }
  const validate = compileHeaderSchema();
  const limit = maxMessageBytes !== null ? { maxMessageSize: maxMessageBytes } : {};
  const security = curve ? curveOptions(curve, bind) : {};
  const socket =
    kind === 'pull'
      ? new Pull({ receiveHighWaterMark, linger: 0, ...limit, ...security })
      : new Subscriber({ receiveHighWaterMark, linger: 0, ...limit, ...security });
  try {
    if (bind) await socket.bind(endpoint);
    else socket.connect(endpoint);
  } catch (err) {
    socket.close();
    throw new Error(`zmq source: cannot ${bind ? 'bind' : 'connect to'} ${endpoint}: ${(err as Error).message}`, { cause: err });
  }
  if (socket instanceof Subscriber) socket.subscribe(topic);
  const where = (bind && socket.lastEndpoint) || endpoint;
  const id = options.id ?? `zmq:${where}`;
  const counters = { received: 0, yielded: 0, rejected: 0, disconnects: 0 };

  async function* generate(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection> {
    // Closing the socket ends a pending receive (EAGAIN): that is how an abort ends the loop.
    const onAbort = (): void => socket.close();
    signal.addEventListener('abort', onAbort, { once: true });
    // ZeroMQ drops a message over maxMessageBytes by ending its connection: each end is reported.
    void watchDisconnects(socket, maxMessageBytes, (detail) => {
      counters.disconnects += 1;
      report?.({ kind: 'skipped', detail });
    });
    try {
      while (!signal.aborted && !socket.closed) {
        let frames: Buffer[];
        try {
          frames = await socket.receive();
        } catch (err) {
          if (socket.closed || signal.aborted) return;
          throw err;
        }
        const captureNs = clock.nowNs();
        counters.received += 1;
        let item: SourceItem<CameraFrame>;
        try {
          item = toItem(frames, validate, id, captureNs, clock.wallMs());
        } catch (err) {
          counters.rejected += 1;
          yield rejectionOf(err, { sourceId: id, captureNs, captureWallMs: clock.wallMs() }, `message ${counters.received}`);
          continue;
        }
        counters.yielded += 1;
        yield item;
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  return {
    id,
    endpoint: where,
    get counters(): ZmqSourceCounters {
      return { ...counters };
    },
    frames: generate,
    async close(): Promise<void> {
      if (!socket.closed) socket.close();
    },
  };
}

/** A bound socket is the CURVE server, with its secret key.
 * A connecting one authenticates the server by its public key, with a key pair made for this connection. */
function curveOptions(curve: NonNullable<ZmqSourceConfig['curve']>, bind: boolean) {
  const file = bind ? curve.secretKeyFile : curve.serverKeyFile;
  if (!file)
    throw new Error(`zmq source: curve.${bind ? 'secretKeyFile' : 'serverKeyFile'} is required to ${bind ? 'bind' : 'connect'} with CURVE`);
  if (bind) return { curveServer: true, curveSecretKey: readCurveKey(file, 'zmq source secret key') };
  const own = curveKeyPair();
  return { curveServerKey: readCurveKey(file, 'zmq source server key'), curvePublicKey: own.publicKey, curveSecretKey: own.secretKey };
}

function compileHeaderSchema(): ValidateFunction {
  // strictRequired off: the schema's if/then requires width and height that `properties` defines
  // one level up, which strict mode would reject.
  const ajv = new Ajv({ strict: true, strictRequired: false, allErrors: true });
  return ajv.compile(JSON.parse(readFileSync(HEADER_SCHEMA, 'utf8')) as object);
}

/** One message → one source item, or an Error saying what is wrong with it: `cause: particulars`
 * (the summaries count rejected frames by the cause). */
function toItem(
  frames: Buffer[],
  validate: ValidateFunction,
  sourceId: string,
  captureNs: bigint,
  captureWallMs: number,
): SourceItem<CameraFrame> {
  if (frames.length !== 2 && frames.length !== 3)
    throw new Error(`wrong number of message frames: expected [header, image] or [topic, header, image] but got ${frames.length}`);
  const [headerBytes, data] = frames.slice(-2) as [Buffer, Buffer];
  let header: unknown;
  try {
    header = JSON.parse(headerBytes.toString('utf8'));
  } catch {
    throw new Error(
      `the header is not JSON: ${headerBytes.length} bytes, starts ${JSON.stringify(headerBytes.subarray(0, 16).toString('latin1'))}`,
    );
  }
  if (!validate(header)) throw new Error(`the header does not fit the frame header schema: ${formatAjvErrors(validate.errors)}`);
  const { stamp, frame_id, encoding, width, height, step } = header as FrameHeader;
  if (data.length === 0) throw new Error('the image is empty: 0 bytes');
  const bpp = BYTES_PER_PIXEL[encoding];
  if (bpp === 0) {
    const jpeg = data[0] === 0xff && data[1] === 0xd8;
    const png = data.length >= 8 && data.readUInt32BE(0) === 0x89504e47;
    if ((encoding === 'jpeg' && !jpeg) || (encoding === 'png' && !png))
      throw new Error(`the image is not its encoding: not ${encoding} (starts ${data.subarray(0, 4).toString('hex')})`);
  } else {
    const rowBytes = width! * bpp;
    const stride = step ?? rowBytes;
    if (stride < rowBytes) throw new Error(`step too small: step ${stride} is smaller than width × ${bpp} = ${rowBytes}`);
    // Exactly step × height, as sensor_msgs/Image: more bytes are another layout (an RGBA buffer called rgb8).
    const need = stride * height!;
    if (data.length !== need)
      throw new Error(
        `the image has the wrong size: ${data.length} bytes of ${encoding}, need step × height = ${need} for ${width}×${height} step ${stride}`,
      );
  }
  return {
    sourceId: frame_id ?? sourceId,
    captureNs,
    captureWallMs,
    sourceStamp: toStamp(stamp),
    payload: {
      encoding,
      data,
      ...(width !== undefined && { width }),
      ...(height !== undefined && { height }),
      ...(step !== undefined && { stride: step }),
    },
  };
}

function toStamp(stamp: FrameHeader['stamp']): Stamp | null {
  if (stamp === undefined) return null;
  if (typeof stamp !== 'number') return { sec: stamp.sec, nanosec: stamp.nanosec };
  const sec = Math.floor(stamp);
  return { sec, nanosec: Math.min(999_999_999, Math.round((stamp - sec) * 1e9)) };
}

/** Reports each connection a peer loses until the socket closes: over maxMessageBytes, or the peer left. */
async function watchDisconnects(
  socket: Pull | Subscriber,
  maxMessageBytes: number | null,
  onDisconnect: (detail: string) => void,
): Promise<void> {
  const why =
    maxMessageBytes !== null ? `a message over maxMessageBytes ${maxMessageBytes} was dropped, or the sender left` : 'the sender left';
  try {
    for await (const event of socket.events) {
      if (event.type === 'disconnect') onDisconnect(`connection from ${event.address} ended: ${why}`);
    }
  } catch {
    // The socket closed while an event was awaited: nothing left to watch.
  }
}
