// recorder profile 'ros2': the MCAP ros2 profile rosbag2 reads (ros2msg schemas, CDR messages, offered_qos_profiles),
// read back with @mcap/core and @foxglove/rosmsg2-serialization, and replayed by percept's bag source.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { McapIndexedReader } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageReader } from '@foxglove/rosmsg2-serialization';
import { ROS2_DEFINITIONS, ROS2_OFFERED_QOS, ROS2_TOPICS, createRecorder } from '../../nodes/recorder.ts';
import { createBagSource } from '../../nodes/source-bag.ts';
import { loadActionSchema } from '../../nodes/action-schema.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { isRejection } from '../../pipeline/types.ts';
import type { ActionMessage, CameraFrame } from '../../nodes/payloads.ts';
import { ROS_COMPRESSED_IMAGE, ROS_IMAGE } from '../support/bag-fixtures.ts';

const root = new URL('../..', import.meta.url).pathname;
const cache = join(root, '.cache/test-recorder-ros2');
const schema = loadActionSchema(join(root, 'configs/actions/robot-action.schema.json'));
mkdirSync(cache, { recursive: true });
const MS = 1_000_000n;
const T0 = 1_700_000_000_123_456_789n;
const CAMERA = 'cam/front';

const jpeg = (i: number): CameraFrame => ({ encoding: 'jpeg', data: Buffer.from([0xff, 0xd8, 0xff, 0xe0, i & 0xff, 0xff, 0xd9]) });
const png = (): CameraFrame => ({ encoding: 'png', data: Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 1, 2, 3]) });
const raw = (): CameraFrame => ({ encoding: 'rgb8', width: 2, height: 2, stride: 6, data: Buffer.from([...Array(12).keys()]) });
const action = (i: number): ActionMessage => ({
  schemaId: schema.wireSchemaId,
  frameId: i,
  sourceId: CAMERA,
  captureWallMs: 1_700_000_000_000 + i * 100,
  action: { action: i % 2 ? 'move' : 'stop', confidence: i / 10, hazards: [] },
});

async function readAll(path: string) {
  const handle = await open(path, 'r');
  try {
    const reader = await McapIndexedReader.Initialize({
      readable: new FileHandleReadable(handle),
      decompressHandlers: await loadDecompressHandlers(),
    });
    const messages = [];
    for await (const m of reader.readMessages({ validateCrcs: true })) messages.push(m);
    return { reader, messages };
  } finally {
    await handle.close();
  }
}

describe('recorder profile ros2', () => {
  const path = join(cache, 'ros2.mcap');
  const stamps = [0, 1, 2, 3].map((i) => T0 + BigInt(i) * 100n * MS);
  const frames: CameraFrame[] = [jpeg(0), jpeg(1), png(), jpeg(3)];

  test('writes the ros2 profile: ros2msg schemas, cdr channels, offered_qos_profiles, decodable messages', async () => {
    const rec = await createRecorder({ path, actionSchema: schema, profile: 'ros2', flushAfterMs: null });
    await rec.writeMetadata('percept.run', { run_id: 'r1' });
    for (let i = 0; i < frames.length; i++) {
      assert.equal(await rec.recordFrame(frames[i]!, { frameId: i, sourceId: CAMERA, stampNs: stamps[i]! }, stamps[i]! + 5n * MS), true);
      await rec.recordAction(action(i), stamps[i]!, stamps[i]! + 40n * MS);
    }
    await rec.recordFrame(raw(), { frameId: 4, sourceId: CAMERA, stampNs: T0 + 400n * MS }, T0 + 405n * MS);
    await rec.recordEvent({ type: 'frame', frameId: 0, captureNs: 12n }, T0 + 6n * MS, stamps[0]);
    await rec.recordStats({ frames: { in: 5 } }, T0 + 500n * MS);
    await rec.close();
    assert.equal(rec.failure, undefined);

    const { reader, messages } = await readAll(path);
    assert.equal(reader.header.profile, 'ros2');
    assert.ok(reader.schemasById.size >= 3);
    for (const s of reader.schemasById.values()) {
      assert.equal(s.encoding, 'ros2msg', s.name);
      assert.match(s.name, /^\w+\/msg\/\w+$/);
      const definitions = parseRosMsg(new TextDecoder().decode(s.data), { ros2: true });
      assert.ok(definitions.length >= 1, s.name);
    }
    // The definitions are the texts rosbag2 stores (as the bag fixtures have them).
    const byName = new Map([...reader.schemasById.values()].map((s) => [s.name, new TextDecoder().decode(s.data)]));
    assert.equal(byName.get('sensor_msgs/msg/CompressedImage'), ROS_COMPRESSED_IMAGE);
    assert.equal(byName.get('sensor_msgs/msg/Image'), ROS_IMAGE);
    assert.equal(byName.get('std_msgs/msg/String'), 'string data\n');
    for (const c of reader.channelsById.values()) {
      assert.equal(c.messageEncoding, 'cdr', c.topic);
      assert.equal(c.metadata.get('offered_qos_profiles'), ROS2_OFFERED_QOS, c.topic);
      assert.match(c.topic, /^\/percept\//);
    }
    assert.match(ROS2_OFFERED_QOS, /reliability: 1\n/);
    assert.match(ROS2_OFFERED_QOS, /durability: 2\n/);

    const readers = new Map(
      [...reader.schemasById.values()].map((s) => [s.id, new MessageReader(parseRosMsg(new TextDecoder().decode(s.data), { ros2: true }))]),
    );
    type Header = { stamp: { sec: number; nanosec: number }; frame_id: string };
    const decoded = messages.map((m) => {
      const channel = reader.channelsById.get(m.channelId)!;
      return { topic: channel.topic, m, msg: readers.get(channel.schemaId)!.readMessage<Record<string, unknown>>(m.data) };
    });
    const onTopic = (topic: string) => decoded.filter((d) => d.topic === topic);
    const stampOf = (ns: bigint) => ({ sec: Number(ns / 1_000_000_000n), nanosec: Number(ns % 1_000_000_000n) });

    const compressed = onTopic(ROS2_TOPICS.compressed);
    assert.equal(compressed.length, 4);
    compressed.forEach(({ m, msg }, i) => {
      const header = msg.header as Header;
      assert.deepEqual(header.stamp, stampOf(stamps[i]!));
      assert.equal(header.frame_id, CAMERA);
      assert.equal(msg.format, frames[i]!.encoding);
      assert.deepEqual(Buffer.from(msg.data as Uint8Array), Buffer.from(frames[i]!.data));
      assert.equal(m.publishTime, stamps[i]);
      assert.equal(m.logTime, stamps[i]! + 5n * MS);
      assert.equal(m.sequence, i);
    });
    const [image] = onTopic(ROS2_TOPICS.raw);
    assert.ok(image);
    assert.deepEqual((image.msg.header as Header).stamp, stampOf(T0 + 400n * MS));
    assert.equal((image.msg.header as Header).frame_id, CAMERA);
    assert.deepEqual(
      { width: image.msg.width, height: image.msg.height, encoding: image.msg.encoding, step: image.msg.step, be: image.msg.is_bigendian },
      { width: 2, height: 2, encoding: 'rgb8', step: 6, be: 0 },
    );
    assert.deepEqual(Buffer.from(image.msg.data as Uint8Array), Buffer.from(raw().data));

    const actions = onTopic(ROS2_TOPICS.actions);
    assert.equal(actions.length, 4);
    actions.forEach(({ m, msg }, i) => {
      assert.deepEqual(JSON.parse(msg.data as string), action(i).action);
      assert.equal(m.publishTime, stamps[i]);
      assert.equal(m.sequence, i);
    });
    const actionChannel = reader.channelsById.get(actions[0]!.m.channelId)!;
    assert.equal(actionChannel.metadata.get('source_id'), CAMERA);
    assert.equal(actionChannel.metadata.get('schema_sha256'), schema.sha256);

    const [event] = onTopic(ROS2_TOPICS.events);
    assert.deepEqual(JSON.parse(event!.msg.data as string), { type: 'frame', frameId: 0, captureNs: '12' });
    assert.equal(event!.m.publishTime, stamps[0]);
    const [stats] = onTopic(ROS2_TOPICS.stats);
    assert.deepEqual(JSON.parse(stats!.msg.data as string), { frames: { in: 5 } });
    assert.equal(decoded.length, 4 + 1 + 4 + 1 + 1);
  });

  test("percept's bag source replays the frames of a ros2 recording", async () => {
    const source = await createBagSource({ path, topic: ROS2_TOPICS.compressed, pace: 'fast' });
    const items = [];
    for await (const item of source.frames(new VirtualClock(), new AbortController().signal)) items.push(item);
    await source.close();
    assert.match(source.description, /sensor_msgs\/msg\/CompressedImage, cdr/);
    const replayed = items.filter((it) => !isRejection(it));
    assert.equal(replayed.length, 4);
    replayed.forEach((it, i) => {
      if (isRejection(it)) return;
      assert.equal(it.payload.encoding, frames[i]!.encoding);
      assert.deepEqual(Buffer.from(it.payload.data), Buffer.from(frames[i]!.data));
      assert.deepEqual(it.sourceStamp, { sec: Number(stamps[i]! / 1_000_000_000n), nanosec: Number(stamps[i]! % 1_000_000_000n) });
    });
    const rawSource = await createBagSource({ path, topic: ROS2_TOPICS.raw, pace: 'fast' });
    const rawItems = [];
    for await (const item of rawSource.frames(new VirtualClock(), new AbortController().signal)) rawItems.push(item);
    await rawSource.close();
    assert.equal(rawItems.length, 1);
    const [only] = rawItems;
    assert.ok(only && !isRejection(only));
    assert.deepEqual({ ...only.payload, data: Buffer.from(only.payload.data) }, { ...raw(), data: Buffer.from(raw().data) });
  });

  test('the default profile is unchanged, and a bad profile is refused', async () => {
    const plain = join(cache, 'plain.mcap');
    const rec = await createRecorder({ path: plain, actionSchema: schema, flushAfterMs: null });
    await rec.recordFrame(jpeg(0), { frameId: 0, sourceId: CAMERA, stampNs: T0 }, T0);
    await rec.close();
    const { reader } = await readAll(plain);
    assert.equal(reader.header.profile, '');
    assert.deepEqual(
      [...reader.channelsById.values()].map((c) => c.messageEncoding),
      ['json', 'json', 'json'],
    );
    await assert.rejects(
      createRecorder({ path: join(cache, 'bad.mcap'), actionSchema: schema, profile: 'ros1' as 'ros2' }),
      /expected profile '' or 'ros2' but received "ros1"/,
    );
    assert.equal(ROS2_DEFINITIONS['std_msgs/msg/String'], 'string data\n');
  });
});
