// ROS 2 wiring of a run: the ROS 2 publisher (nodes/publisher-ros2.ts) joined to the ZeroMQ one as one Publisher,
// the frames' pixel sizes for its detections, and the ROS 2 message definitions the stages serialize with.
// Topics, config and what was not run against ROS 2: docs/ros2.md
import type { Observable } from 'rxjs';
import type { Clock } from '../../pipeline/clock.ts';
import type { PerceptConfig, Ros2SourceConfig } from '../../pipeline/config.ts';
import type { Envelope, FrameSource } from '../../pipeline/types.ts';
import type { Publisher, PublisherCounters } from '../../nodes/publisher.ts';
import type { Ros2Publisher, Ros2PublishedType } from '../../nodes/publisher-ros2.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { ROS2_DEFINITIONS } from '../../nodes/recorder.ts';
import { jpegSize } from './foxglove.ts';

/** std_msgs/Header and builtin_interfaces/Time as the recorder's definitions append them (rosbag2's layout). */
const HEADER_DEPENDENCIES = ROS2_DEFINITIONS['sensor_msgs/msg/CompressedImage'].slice(
  ROS2_DEFINITIONS['sensor_msgs/msg/CompressedImage'].indexOf('====='),
);
const SEPARATOR = '='.repeat(80);

/** The ros2msg texts of what the ROS 2 publisher writes: the recorder's std_msgs/msg/String, and vision_msgs 4.x
 * (ROS 2 Humble on; vision_msgs/msg/*.msg) and diagnostic_msgs (common_interfaces) with their dependencies. */
export const ROS2_PUBLISHED_DEFINITIONS: Readonly<Record<Ros2PublishedType, string>> = {
  'std_msgs/msg/String': ROS2_DEFINITIONS['std_msgs/msg/String'],
  'vision_msgs/msg/Detection2DArray': `std_msgs/Header header
vision_msgs/Detection2D[] detections
${SEPARATOR}
MSG: vision_msgs/Detection2D
std_msgs/Header header
vision_msgs/ObjectHypothesisWithPose[] results
vision_msgs/BoundingBox2D bbox
string id
${SEPARATOR}
MSG: vision_msgs/ObjectHypothesisWithPose
vision_msgs/ObjectHypothesis hypothesis
geometry_msgs/PoseWithCovariance pose
${SEPARATOR}
MSG: vision_msgs/ObjectHypothesis
string class_id
float64 score
${SEPARATOR}
MSG: geometry_msgs/PoseWithCovariance
geometry_msgs/Pose pose
float64[36] covariance
${SEPARATOR}
MSG: geometry_msgs/Pose
geometry_msgs/Point position
geometry_msgs/Quaternion orientation
${SEPARATOR}
MSG: geometry_msgs/Point
float64 x
float64 y
float64 z
${SEPARATOR}
MSG: geometry_msgs/Quaternion
float64 x
float64 y
float64 z
float64 w
${SEPARATOR}
MSG: vision_msgs/BoundingBox2D
vision_msgs/Pose2D center
float64 size_x
float64 size_y
${SEPARATOR}
MSG: vision_msgs/Pose2D
vision_msgs/Point2D position
float64 theta
${SEPARATOR}
MSG: vision_msgs/Point2D
float64 x
float64 y
${HEADER_DEPENDENCIES}`,
  'diagnostic_msgs/msg/DiagnosticArray': `std_msgs/Header header
diagnostic_msgs/DiagnosticStatus[] status
${SEPARATOR}
MSG: diagnostic_msgs/DiagnosticStatus
byte OK=0
byte WARN=1
byte ERROR=2
byte STALE=3
byte level
string name
string message
string hardware_id
diagnostic_msgs/KeyValue[] values
${SEPARATOR}
MSG: diagnostic_msgs/KeyValue
string key
string value
${HEADER_DEPENDENCIES}`,
};

/** The ROS 2 message definitions the ros2 source decodes with (the recorder's). */
export const ROS2_IMAGE_DEFINITIONS = {
  'sensor_msgs/msg/CompressedImage': ROS2_DEFINITIONS['sensor_msgs/msg/CompressedImage'],
  'sensor_msgs/msg/Image': ROS2_DEFINITIONS['sensor_msgs/msg/Image'],
} as const;

/** A run's publisher with the ROS 2 one beside it: what the ZeroMQ one publishes also goes out over DDS. */
export interface PublisherWithRos2 extends Publisher {
  readonly ros2: Ros2Publisher;
}

/** `publisher` and, with ros2.publish, the ROS 2 publisher on the same run id and clock, as one Publisher; else `publisher` itself. */
export async function withRos2Publisher(
  publisher: Publisher,
  config: PerceptConfig,
  models: Record<string, string>,
  clock?: Clock,
): Promise<Publisher> {
  const { ros2 } = config;
  if (!ros2.publish) return publisher;
  const { createRos2Publisher } = await import('../../nodes/publisher-ros2.ts');
  const qos = (q: PerceptConfig['ros2']['qos']['actions']) => ({ reliable: q.reliability === 'reliable', depth: q.depth });
  const dds = await createRos2Publisher({
    domainId: ros2.domainId,
    cyclonedds: ros2.cyclonedds,
    topics: ros2.topics,
    qos: { actions: qos(ros2.qos.actions), detections: qos(ros2.qos.detections), diagnostics: qos(ros2.qos.diagnostics) },
    definitions: ROS2_PUBLISHED_DEFINITIONS,
    runId: publisher.runId,
    models,
    ...(clock ? { clock } : {}),
  }).catch(async (err: unknown) => {
    await publisher.close();
    throw err;
  });
  const stage: Publisher['stage'] = {
    name: publisher.stage.name,
    process: async (msg, ctx) => dds.stage.process(await publisher.stage.process(msg, ctx), ctx),
  };
  const both: PublisherWithRos2 = {
    endpoint: publisher.endpoint,
    runId: publisher.runId,
    stage,
    sink: {
      accept: (event) => {
        publisher.sink.accept(event);
        dds.sink.accept(event);
      },
      get undelivered() {
        return publisher.sink.undelivered + dds.sink.undelivered;
      },
    },
    get stalls() {
      return publisher.stalls;
    },
    stats: () => ({ ...publisher.stats(), ...dds.stats() }),
    async close(summary) {
      const [zmq, ros] = await Promise.all([publisher.close(summary), dds.close(summary)]);
      return { ...zmq, ...ros } as PublisherCounters;
    },
    ros2: dds,
  };
  return both;
}

/** Feeds the ROS 2 publisher each input frame's pixel size, for its detections' boxes. No-op without one. */
export function tapFrameSizes(publisher: Publisher | undefined, inputs: Observable<Envelope<unknown>>): void {
  if (!publisher || !('ros2' in publisher)) return;
  const { ros2 } = publisher as PublisherWithRos2;
  inputs.subscribe((env) => ros2.noteFrame(env.frameId, frameSize(env.payload as CameraFrame)));
}

function frameSize(frame: CameraFrame): { width: number; height: number } | undefined {
  if (frame.width && frame.height) return { width: frame.width, height: frame.height };
  if (frame.encoding === 'jpeg') return jpegSize(frame.data);
  // PNG: the IHDR chunk's width and height.
  if (frame.encoding === 'png' && frame.data.length >= 24) {
    const view = new DataView(frame.data.buffer, frame.data.byteOffset, frame.data.byteLength);
    return { width: view.getUint32(16), height: view.getUint32(20) };
  }
  return undefined;
}

/** The ros2 source of a config, on the domain of `ros2` (default domain 0, loopback). */
export async function openRos2Source(
  source: Ros2SourceConfig,
  ros2: Pick<PerceptConfig['ros2'], 'domainId' | 'cyclonedds'> = { domainId: 0, cyclonedds: '' },
): Promise<FrameSource<CameraFrame>> {
  const { createRos2Source } = await import('../../nodes/source-ros2.ts');
  const { kind: _kind, ...options } = source;
  const opened = await createRos2Source({ ...options, ...ros2, definition: ROS2_IMAGE_DEFINITIONS[source.type] });
  process.stderr.write(
    `percept: frames from ROS 2 topic ${source.topic} (${source.type}, ${source.reliability}) on DDS domain ${ros2.domainId}\n`,
  );
  return opened;
}
