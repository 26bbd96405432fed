// source-ros2: frames from a ROS 2 image topic over DDS (Cyclone DDS, native/dds): sensor_msgs/msg/CompressedImage
// (JPEG, PNG) or sensor_msgs/msg/Image (raw), best effort or reliable. No ROS install is needed.
// A message that does not decode or fit is a rejected frame with its reason, and the source goes on.
// Samples DDS lost or rejected, and those the keep-last history overwrote untaken, are 'skipped' incidents with their count.
// The capture time is the arrival time; the message's header.stamp is the frame's stamp and source stamp.
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageReader } from '@foxglove/rosmsg2-serialization';
import { DdsParticipant, type DdsReader } from '../native/dds/binding.ts';
import type { Clock } from '../pipeline/clock.ts';
import type { Ros2SourceConfig } from '../pipeline/config.ts';
import {
  rejectionOf,
  type FrameSource,
  type SourceIncident,
  type SourceItem,
  type SourceRejection,
  type Stamp,
} from '../pipeline/types.ts';
import type { CameraFrame, FrameEncoding } from './payloads.ts';

export type Ros2ImageType = Ros2SourceConfig['type'];

export interface Ros2SourceOptions extends Omit<Ros2SourceConfig, 'kind'> {
  /** ROS_DOMAIN_ID (default 0). */
  readonly domainId?: number;
  /** Cyclone DDS XML or file:// URI; '' (default): CYCLONEDDS_URI when set, else loopback only. */
  readonly cyclonedds?: string;
  /** The ros2msg definition (rosbag2's text) of `type`. */
  readonly definition: string;
  /** FrameSource id (default 'ros2:<topic>'); a message's header.frame_id, when set, is its frame's source id. */
  readonly id?: string;
}

export interface Ros2SourceCounters {
  readonly received: number;
  readonly yielded: number;
  /** Messages that did not decode or fit (yielded as rejected frames). */
  readonly rejected: number;
  /** Samples DDS lost (gaps in a best-effort stream) or rejected, and those a newer one overwrote in the keep-last history before they were taken. */
  readonly lost: number;
}

export interface Ros2Source extends FrameSource<CameraFrame> {
  readonly topic: string;
  readonly counters: Ros2SourceCounters;
  /** Publishers matched now. */
  matched(): number;
  frames(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection>;
  close(): Promise<void>;
}

const BYTES_PER_PIXEL: Readonly<Record<string, number>> = { rgb8: 3, bgr8: 3, rgba8: 4, bgra8: 4, mono8: 1, mono16: 2 };

/** Joins the domain (building the DDS addon on first use) and subscribes at once, so publishers match before the run. */
export async function createRos2Source(options: Ros2SourceOptions): Promise<Ros2Source> {
  if (options === null || typeof options !== 'object') throw new TypeError('createRos2Source: expected an options object { topic, type }');
  const {
    topic,
    type = 'sensor_msgs/msg/CompressedImage',
    reliability = 'best_effort',
    depth = 5,
    domainId = 0,
    cyclonedds = '',
  } = options;
  if (type !== 'sensor_msgs/msg/CompressedImage' && type !== 'sensor_msgs/msg/Image')
    throw new TypeError(
      `createRos2Source: expected type sensor_msgs/msg/CompressedImage or sensor_msgs/msg/Image but received ${JSON.stringify(type)}`,
    );
  if (reliability !== 'best_effort' && reliability !== 'reliable')
    throw new TypeError(`createRos2Source: expected reliability 'best_effort' or 'reliable' but received ${JSON.stringify(reliability)}`);
  if (typeof options.definition !== 'string') throw new TypeError(`createRos2Source: expected the ros2msg definition of ${type}`);
  const reader = new MessageReader(parseRosMsg(options.definition, { ros2: true }));
  const id = options.id ?? `ros2:${topic}`;
  const participant = await DdsParticipant.open({ domainId, config: cyclonedds });
  let wake: (() => void) | undefined;
  let pending = false;
  let dds: DdsReader;
  try {
    dds = participant.createReader(topic, type, { reliable: reliability === 'reliable', depth }, () => {
      pending = true;
      wake?.();
    });
  } catch (err) {
    participant.close();
    throw err;
  }
  const counters = { received: 0, yielded: 0, rejected: 0, lost: 0 };
  let closed = false;

  async function* generate(
    clock: Clock,
    signal: AbortSignal,
    report?: (incident: SourceIncident) => void,
  ): AsyncGenerator<SourceItem<CameraFrame> | SourceRejection> {
    const onAbort = (): void => wake?.();
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      while (!signal.aborted && !closed) {
        pending = false;
        const samples = dds.take();
        const status = dds.lost();
        const lost = status.lost + status.rejected + status.overwritten;
        if (lost > counters.lost) {
          const detail = `${topic}: ${lost - counters.lost} samples lost, rejected or overwritten by newer ones (${lost} in all: DDS lost ${status.lost}, rejected ${status.rejected}, overwritten ${status.overwritten})`;
          report?.({ kind: 'skipped', detail });
          counters.lost = lost;
        }
        if (samples.length === 0) {
          await new Promise<void>((resolve) => {
            wake = resolve;
            if (pending || signal.aborted || closed) resolve();
          });
          wake = undefined;
          continue;
        }
        // The batch arrived before take() returned it: one capture time for all its samples.
        const captureNs = clock.nowNs();
        const captureWallMs = clock.wallMs();
        for (const sample of samples) {
          counters.received += 1;
          let item: SourceItem<CameraFrame>;
          let message: unknown;
          try {
            message = reader.readMessage(sample);
            item = toItem(message, type, id, captureNs, captureWallMs);
          } catch (err) {
            counters.rejected += 1;
            // A message that decoded but does not fit keeps its camera's id, as its good frames do.
            const sourceId = (message as RosImage | undefined)?.header?.frame_id || id;
            yield rejectionOf(err, { sourceId, captureNs, captureWallMs }, `${topic} message ${counters.received}`);
            continue;
          }
          counters.yielded += 1;
          yield item;
        }
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  return {
    id,
    topic,
    get counters(): Ros2SourceCounters {
      return { ...counters };
    },
    matched: () => (closed ? 0 : dds.matched()),
    frames: generate,
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      wake?.();
      participant.close();
    },
  };
}

interface RosHeader {
  readonly stamp?: { readonly sec: number; readonly nanosec: number };
  readonly frame_id?: string;
}
interface RosCompressedImage {
  readonly header?: RosHeader;
  readonly format?: string;
  readonly data?: Uint8Array;
}
interface RosImage extends RosCompressedImage {
  readonly height?: number;
  readonly width?: number;
  readonly encoding?: string;
  readonly is_bigendian?: number;
  readonly step?: number;
}

/** A decoded message → one source item, or an Error `cause: particulars` (summaries count rejected frames by the cause). */
function toItem(
  message: unknown,
  type: Ros2ImageType,
  sourceId: string,
  captureNs: bigint,
  captureWallMs: number,
): SourceItem<CameraFrame> {
  const msg = message as RosImage;
  const data = msg.data;
  if (!(data instanceof Uint8Array) || data.length === 0) throw new Error('the image is empty: 0 bytes of data');
  const payload = type === 'sensor_msgs/msg/CompressedImage' ? compressedFrame(msg.format ?? '', data) : rawFrame(msg, data);
  const stamp = msg.header?.stamp;
  const set = stamp !== undefined && (stamp.sec !== 0 || stamp.nanosec !== 0);
  const sourceStamp: Stamp | null = set ? { sec: stamp.sec, nanosec: stamp.nanosec } : null;
  return {
    sourceId: msg.header?.frame_id || sourceId,
    captureNs,
    captureWallMs,
    ...(set ? { stampNs: BigInt(stamp.sec) * 1_000_000_000n + BigInt(stamp.nanosec) } : {}),
    sourceStamp,
    payload,
  };
}

/** CompressedImage.format names the codec ("jpeg", "png", or image_transport's "bgr8; jpeg compressed bgr8"). */
function compressedFrame(format: string, data: Uint8Array): CameraFrame {
  const f = format.toLowerCase();
  const encoding: FrameEncoding | undefined = /jpe?g/.test(f) ? 'jpeg' : f.includes('png') ? 'png' : undefined;
  if (!encoding) throw new Error(`unsupported compressed format: format ${JSON.stringify(format)} (percept takes jpeg and png)`);
  const jpeg = data[0] === 0xff && data[1] === 0xd8;
  const png = data.length >= 8 && data[0] === 0x89 && data[1] === 0x50 && data[2] === 0x4e && data[3] === 0x47;
  if ((encoding === 'jpeg' && !jpeg) || (encoding === 'png' && !png))
    throw new Error(`the image is not its format: not ${encoding} (starts ${Buffer.from(data.subarray(0, 4)).toString('hex')})`);
  return { encoding, data };
}

function rawFrame(msg: RosImage, data: Uint8Array): CameraFrame {
  const { width = 0, height = 0, encoding = '', step = 0, is_bigendian: bigEndian = 0 } = msg;
  const bpp = BYTES_PER_PIXEL[encoding];
  if (bpp === undefined)
    throw new Error(`unsupported pixel encoding: ${JSON.stringify(encoding)} (percept takes ${Object.keys(BYTES_PER_PIXEL).join(', ')})`);
  if (width <= 0 || height <= 0) throw new Error(`the image has no pixels: ${width}×${height}`);
  if (encoding === 'mono16' && bigEndian !== 0)
    throw new Error('unsupported byte order: mono16 with is_bigendian set (percept takes little endian)');
  const rowBytes = width * bpp;
  if (step < rowBytes) throw new Error(`step too small: step ${step} is smaller than width × ${bpp} = ${rowBytes}`);
  // Exactly step × height, as sensor_msgs/Image states.
  if (data.length !== step * height)
    throw new Error(
      `the image has the wrong size: ${data.length} bytes of ${encoding}, need step × height = ${step * height} for ${width}×${height} step ${step}`,
    );
  return { encoding: encoding as FrameEncoding, data, width, height, stride: step };
}
