// The ros2 source on real DDS over loopback: a Cyclone DDS publisher in C (built here with idlc from Debian's
// cyclonedds-dev) publishes sensor_msgs/msg/CompressedImage frames, as a ROS 2 camera driver would, and one that is
// not a JPEG. The pipeline runs on them: every frame arrives, in order, with its stamp and frame id, and the bad one is
// a rejected frame with its reason. Nothing is timed: the publisher writes once percept's reader matched.
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageWriter } from '@foxglove/rosmsg2-serialization';
import { DdsParticipant } from '../../native/dds/binding.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { chain } from '../../pipeline/graph/chain.ts';
import { eventToJson } from '../../pipeline/telemetry/events.ts';
import { isRejection, type SourceItem, type SourceRejection } from '../../pipeline/types.ts';
import type { CameraFrame } from '../../nodes/payloads.ts';
import { encodePatternFrame, readPatternCounter } from '../../nodes/source-pattern.ts';
import { createRos2Source } from '../../nodes/source-ros2.ts';
import { ROS2_IMAGE_DEFINITIONS } from '../../app/run/ros2.ts';
import { assertConservation, dropsOf, fakeStage, runGraph, testConfig } from '../support/pipeline-fakes.ts';
import { decodeRgb } from '../support/sources.ts';
import { buildCyclonePeer, startPeer, testDomainId, until, type Peer } from '../support/dds-peers.ts';

const FRAMES = 6;
const BAD_AT = 3;
const FRAME_ID = 'camera_optical';

let publisher: string;
const peers: Peer[] = [];
before(
  async () => {
    publisher = await buildCyclonePeer('cyclone-image-pub', 'sensor_msgs_compressed_image');
  },
  { timeout: 600_000 },
);
after(() => {
  for (const p of peers) p.child.kill();
});

// The timeout only guards against a hang (a peer that never matches); nothing waits for a time.
test(
  'frames a C publisher sends on a ROS 2 image topic run through the pipeline; a message that is not its format is rejected with its reason',
  { timeout: 600_000 },
  async () => {
    const domainId = testDomainId(3);
    const dir = mkdtempSync(join(tmpdir(), 'percept-ros2-frames-'));
    const files = await Promise.all(
      Array.from({ length: FRAMES }, async (_, i) => {
        const path = join(dir, `frame-${i}.jpg`);
        writeFileSync(path, await encodePatternFrame(i, 320, 240));
        return path;
      }),
    );
    const args = [...files.slice(0, BAD_AT), 'BAD', ...files.slice(BAD_AT)];
    const source = await createRos2Source({
      domainId,
      topic: '/camera/image/compressed',
      type: 'sensor_msgs/msg/CompressedImage',
      reliability: 'reliable',
      depth: 100,
      definition: ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/CompressedImage'],
    });
    const pub = startPeer(publisher, [String(domainId), 'rt/camera/image/compressed', FRAME_ID, ...args]);
    peers.push(pub);
    const count = fakeStage<CameraFrame, number>('count', {
      work: async (frame) => {
        const rgb = await decodeRgb(frame);
        return readPatternCounter(rgb.data, rgb.width, rgb.height);
      },
    });
    let ended = 0;
    const result = await runGraph({
      source,
      stages: chain(count),
      config: testConfig({
        clock: 'real',
        budgets: { endToEndMs: 600_000, stages: {}, dropPredictedMiss: false },
        edges: { default: { policy: 'queue', capacity: 64 } },
      }),
      clock: new RealClock(),
      onEvent: (event, graph) => {
        if ((event.type === 'output' || event.type === 'drop') && ++ended === FRAMES + 1) void graph.stop('all frames seen');
      },
    });
    assert.equal(await pub.exited, 0, pub.stderr());
    assertConservation(result);
    assert.equal(result.summary.frames.in, FRAMES + 1);
    assert.deepEqual(
      result.outputs.map((o) => o.payload),
      Array.from({ length: FRAMES }, (_, i) => i),
    );
    for (const out of result.outputs) {
      assert.equal(out.sourceId, FRAME_ID, 'the message header frame_id is the frame source id');
      const k = (out.payload as number) + ((out.payload as number) >= BAD_AT ? 1 : 0);
      assert.deepEqual(out.sourceStamp, { sec: 1_700_000_000 + k, nanosec: k });
      assert.equal(out.stampNs, BigInt(1_700_000_000 + k) * 1_000_000_000n + BigInt(k));
    }
    const rejected = dropsOf(result.events, 'rejected');
    assert.equal(rejected.length, 1);
    const drop = result.events.find((e) => e.type === 'drop' && e.reason === 'rejected');
    assert.ok(drop);
    assert.match(
      eventToJson(drop),
      /"detail":"the image is not its format: \/camera\/image\/compressed message 4: not jpeg \(starts 74686973\)"/,
    );
    assert.equal(source.counters.rejected, 1);
    assert.equal(source.counters.yielded, FRAMES);
  },
);

test('a topic name ROS 2 would refuse is an error naming it', async () => {
  await assert.rejects(
    createRos2Source({
      domainId: testDomainId(4),
      topic: 'camera',
      type: 'sensor_msgs/msg/Image',
      reliability: 'best_effort',
      depth: 5,
      definition: ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/Image'],
    }),
    /expected an absolute ROS 2 topic name such as \/percept\/actions but received "camera"/,
  );
});

test('raw sensor_msgs/msg/Image frames from a writer in this process arrive with their size and stride; one of the wrong size is rejected with its reason', async () => {
  const domainId = testDomainId(5);
  const source = await createRos2Source({
    domainId,
    topic: '/camera/image_raw',
    type: 'sensor_msgs/msg/Image',
    reliability: 'reliable',
    depth: 100,
    definition: ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/Image'],
  });
  const participant = await DdsParticipant.open({ domainId });
  const writer = participant.createWriter('/camera/image_raw', 'sensor_msgs/msg/Image', { reliable: true, depth: 100 });
  await until(() => writer.matched() === 1 && source.matched() === 1);
  const image = new MessageWriter(parseRosMsg(ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/Image'], { ros2: true }));
  const frame = (k: number, width: number, height: number, step: number, bytes: number) =>
    image.writeMessage({
      header: { stamp: { sec: 1_700_000_100, nanosec: k }, frame_id: 'raw_cam' },
      height,
      width,
      encoding: 'rgb8',
      is_bigendian: 0,
      step,
      data: new Uint8Array(bytes).fill(k),
    });
  writer.write(frame(0, 4, 2, 12, 24));
  writer.write(frame(1, 4, 2, 16, 32));
  writer.write(frame(2, 4, 2, 12, 23));
  const controller = new AbortController();
  const items = [];
  for await (const item of source.frames(new RealClock(), controller.signal)) {
    items.push(item);
    if (items.length === 3) break;
  }
  await participant.drain(60_000);
  participant.close();
  await source.close();
  const [a, b, bad] = items as [SourceItem<CameraFrame>, SourceItem<CameraFrame>, SourceRejection];
  assert.deepEqual({ ...a.payload, data: a.payload.data.length }, { encoding: 'rgb8', data: 24, width: 4, height: 2, stride: 12 });
  assert.deepEqual({ ...b.payload, data: b.payload.data.length }, { encoding: 'rgb8', data: 32, width: 4, height: 2, stride: 16 });
  assert.equal(a.sourceId, 'raw_cam');
  assert.deepEqual(b.sourceStamp, { sec: 1_700_000_100, nanosec: 1 });
  assert.equal(bad.rejected, 'the image has the wrong size');
  assert.equal(bad.detail, '/camera/image_raw message 3: 23 bytes of rgb8, need step × height = 24 for 4×2 step 12');
  assert.equal(bad.sourceId, 'raw_cam', "a frame that decodes but does not fit keeps its camera's id");
});

test('a best-effort reader (ROS 2 sensor data profile, the default) matches a reliable publisher in C', { timeout: 600_000 }, async () => {
  const domainId = testDomainId(6);
  const source = await createRos2Source({
    domainId,
    topic: '/camera/image/compressed',
    type: 'sensor_msgs/msg/CompressedImage',
    reliability: 'best_effort',
    depth: 5,
    definition: ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/CompressedImage'],
  });
  // The peer sends its frame until killed, so the reader gets one whenever it discovers the writer.
  const pub = startPeer(publisher, [String(domainId), 'rt/camera/image/compressed', FRAME_ID, 'REPEAT', 'BAD']);
  peers.push(pub);
  await pub.waitForLine((l) => l === 'matched');
  const controller = new AbortController();
  let first: SourceItem<CameraFrame> | SourceRejection | undefined;
  for await (const item of source.frames(new RealClock(), controller.signal)) {
    first = item;
    break;
  }
  assert.equal(source.matched(), 1);
  pub.child.kill();
  await source.close();
  assert.ok(first && isRejection(first), 'the frame crossed from the reliable writer to the best-effort reader');
  assert.equal(first.sourceId, FRAME_ID);
});

test('samples the keep-last history overwrites before the pipeline takes them are counted as skipped', async () => {
  const domainId = testDomainId(7);
  const source = await createRos2Source({
    domainId,
    topic: '/camera/slow',
    type: 'sensor_msgs/msg/Image',
    reliability: 'reliable',
    depth: 2,
    definition: ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/Image'],
  });
  const participant = await DdsParticipant.open({ domainId });
  const writer = participant.createWriter('/camera/slow', 'sensor_msgs/msg/Image', { reliable: true, depth: 10 });
  await until(() => writer.matched() === 1 && source.matched() === 1);
  const image = new MessageWriter(parseRosMsg(ROS2_IMAGE_DEFINITIONS['sensor_msgs/msg/Image'], { ros2: true }));
  // Six frames before the source is read: a camera faster than the pipeline.
  for (let k = 0; k < 6; k++) {
    const header = { stamp: { sec: 1_700_000_200, nanosec: k }, frame_id: 'slow_cam' };
    writer.write(
      image.writeMessage({ header, height: 1, width: 1, encoding: 'mono8', is_bigendian: 0, step: 1, data: new Uint8Array([k]) }),
    );
  }
  assert.equal(await participant.drain(60_000), true, 'every frame acknowledged');
  const incidents: string[] = [];
  const controller = new AbortController();
  const items = [];
  for await (const item of source.frames(new RealClock(), controller.signal, (i) => incidents.push(i.detail ?? ''))) {
    items.push(item as SourceItem<CameraFrame>);
    if (items.length === 2) break;
  }
  participant.close();
  await source.close();
  assert.deepEqual(
    items.map((i) => i.sourceStamp?.nanosec),
    [4, 5],
    'the two newest frames are kept',
  );
  assert.equal(source.counters.lost, 4);
  assert.match(incidents.join('\n'), /\/camera\/slow: 4 samples lost, rejected or overwritten by newer ones .*overwritten 4\)/);
});
