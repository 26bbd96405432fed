// The ROS 2 publisher on real DDS over loopback, with two other implementations as subscribers:
// - a Cyclone DDS subscriber in C (built here with idlc from Debian's cyclonedds-dev), decoding std_msgs/msg/String
//   with Cyclone's own CDR code, gets every action;
// - a Fast DDS participant in C++ (Debian's libfastrtps-dev) gets the actions, detections and diagnostics as raw
//   serialized samples, decoded here with the ROS 2 readers: the RTPS wire interoperates across implementations.
// Nothing is timed: the run starts once every reader has matched, and waits are for lines and exits.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { Ajv } from 'ajv';
import { parse as parseRosMsg } from '@foxglove/rosmsg';
import { MessageReader } from '@foxglove/rosmsg2-serialization';
import { VirtualClock } from '../../pipeline/clock.ts';
import { chain } from '../../pipeline/graph/chain.ts';
import type { ActionMessage } from '../../nodes/payloads.ts';
import { createRos2Publisher, type Ros2Publisher } from '../../nodes/publisher-ros2.ts';
import { ROS2_PUBLISHED_DEFINITIONS } from '../../app/run/ros2.ts';
import { fakeSource, fakeStage, runGraph, testConfig } from '../support/pipeline-fakes.ts';
import { DdsParticipant, ROS2_DEFAULT_QOS } from '../../native/dds/binding.ts';
import { buildCyclonePeer, buildFastDdsPeer, startPeer, testDomainId, until, type Peer } from '../support/dds-peers.ts';

const FRAMES = 24;
const RUN_ID = 'ros2-test-run';
const START_WALL_MS = 1_700_000_000_000;
const SIZE = { width: 640, height: 480 };
const reader = (type: keyof typeof ROS2_PUBLISHED_DEFINITIONS) =>
  new MessageReader(parseRosMsg(ROS2_PUBLISHED_DEFINITIONS[type], { ros2: true }));

/** Frame i's action: a target with a box on three frames of four, none on the fourth. */
function actionOf(i: number): object {
  if (i % 4 === 3) return { action: 'wait', confidence: 0.5 };
  return { action: 'move', confidence: 0.9, speed: 0.5, target: { label: 'cup', bbox: [0.25, 0.5, 0.75, 1] } };
}

let cycloneSub: string;
let fastSub: string;
const peers: Peer[] = [];

before(
  async () => {
    [cycloneSub, fastSub] = await Promise.all([buildCyclonePeer('cyclone-string-sub', 'std_msgs_string'), buildFastDdsPeer()]);
  },
  { timeout: 600_000 },
);
after(() => {
  for (const p of peers) p.child.kill();
});

// The timeout only guards against a hang (a peer that never matches); nothing waits for a time.
test(
  'actions, detections and diagnostics reach a Cyclone DDS subscriber in C and a Fast DDS one, every action decoded',
  { timeout: 600_000 },
  async () => {
    const domainId = testDomainId(1);
    const cyclone = startPeer(cycloneSub, [String(domainId), 'rt/percept/actions', String(FRAMES)]);
    // Count 0: it reads until killed, once the end summary has come.
    const fast = startPeer(fastSub, [
      String(domainId),
      'rt/percept/actions:std_msgs::msg::dds_::String_:0',
      'rt/percept/detections:vision_msgs::msg::dds_::Detection2DArray_:0',
      'rt/diagnostics:diagnostic_msgs::msg::dds_::DiagnosticArray_:0',
    ]);
    peers.push(cyclone, fast);
    const clock = new VirtualClock(0n, START_WALL_MS);
    const keepAll = { reliable: true, depth: 1000 };
    const ros2: Ros2Publisher = await createRos2Publisher({
      domainId,
      definitions: ROS2_PUBLISHED_DEFINITIONS,
      runId: RUN_ID,
      clock,
      models: { decoder: 'fake-decoder' },
      qos: { actions: keepAll, detections: keepAll, diagnostics: keepAll },
      lingerMs: 60_000,
    });
    try {
      // Volatile topics: a reader that has not matched yet would miss the first samples.
      await cyclone.waitForLine((l) => l === 'matched');
      for (const topic of ['rt/percept/actions', 'rt/percept/detections', 'rt/diagnostics'])
        await fast.waitForLine((l) => l === `matched ${topic}`);
      await until(() => {
        const m = ros2.matched();
        return m.actions === 2 && m.detections === 1 && m.diagnostics === 1;
      });

      const actions = fakeStage<number, ActionMessage>('actions', {
        work: (i, ctx) => ({
          schemaId: 'percept/robot-action/v1',
          frameId: ctx.frame.frameId,
          sourceId: 'cam0',
          captureWallMs: ctx.frame.captureWallMs,
          action: actionOf(i),
        }),
      });
      const { summary } = await runGraph({
        source: fakeSource({ frames: FRAMES, periodMs: 100 }),
        stages: chain(actions, ros2.stage),
        config: testConfig({ lockstep: true }),
        clock,
        onStart: (graph) => {
          graph.inputs.subscribe((env) => ros2.noteFrame(env.frameId, SIZE));
          graph.events.subscribe(ros2.sink.accept);
        },
      });
      assert.equal(summary.frames.out, FRAMES);
      const counters = await ros2.close(summary);
      assert.deepEqual(counters['ros2:/percept/actions'], { accepted: FRAMES, sent: FRAMES, dropped: 0, queued: 0, highWaterMark: 1024 });
      assert.equal(counters['ros2:/percept/detections']!.sent, FRAMES);

      // Cyclone DDS in C: every action, in order, decoded by Cyclone itself.
      assert.equal(await cyclone.exited, 0, cyclone.stderr());
      const texts = cyclone.lines.filter((l) => l !== 'matched');
      assert.equal(texts.length, FRAMES);
      const headerSchema = new Ajv({ strict: false }).compile(
        JSON.parse(readFileSync(new URL('../../configs/wire/header.schema.json', import.meta.url), 'utf8')) as object,
      );
      texts.forEach((text, i) => {
        const { header, body } = JSON.parse(text) as { header: Record<string, unknown>; body: unknown };
        assert.ok(headerSchema(header), `action ${i}: the header fits the wire's header schema: ${JSON.stringify(headerSchema.errors)}`);
        assert.equal(header.header_version, 1);
        assert.equal(header.run_id, RUN_ID);
        assert.equal(header.seq, i);
        assert.equal(header.frame_id, i);
        assert.equal(header.source_id, 'cam0');
        assert.deepEqual(header.models, { decoder: 'fake-decoder' });
        assert.deepEqual(body, actionOf(i));
      });

      // Fast DDS: the same bytes, and the detections and diagnostics, decoded with the ROS 2 readers.
      const endSeen = (l: string) =>
        l.startsWith('rt/diagnostics ') && decodeHex(reader('diagnostic_msgs/msg/DiagnosticArray'), l).status[0].name === 'percept: end';
      await fast.waitForLine(endSeen);
      const samples = (topic: string) =>
        fast.lines.filter((l) => l.startsWith(`${topic} `)).map((l) => Buffer.from(l.split(' ')[1]!, 'hex'));
      const strings = samples('rt/percept/actions');
      assert.equal(strings.length, FRAMES);
      strings.forEach((bytes, i) => {
        // XCDR1 little endian (CDR_LE), padded to 4 bytes with the pad in the options' low bits.
        assert.deepEqual([...bytes.subarray(0, 3)], [0, 1, 0]);
        assert.equal(bytes.length % 4, 0);
        assert.equal((reader('std_msgs/msg/String').readMessage(bytes) as { data: string }).data, texts[i]);
      });
      const detections = samples('rt/percept/detections').map(
        (b) => reader('vision_msgs/msg/Detection2DArray').readMessage(b) as Detection2DArray,
      );
      assert.equal(detections.length, FRAMES);
      detections.forEach((d, i) => {
        const stampNs = BigInt(START_WALL_MS + i * 100) * 1_000_000n;
        assert.deepEqual(d.header, {
          stamp: { sec: Number(stampNs / 1_000_000_000n), nanosec: Number(stampNs % 1_000_000_000n) },
          frame_id: 'cam0',
        });
        if (i % 4 === 3) return assert.equal(d.detections.length, 0, `frame ${i} has no target`);
        assert.equal(d.detections.length, 1);
        const [det] = d.detections;
        assert.equal(det!.id, String(i));
        assert.deepEqual(det!.results[0]!.hypothesis, { class_id: 'cup', score: 0.9 });
        assert.deepEqual(det!.bbox, { center: { position: { x: 320, y: 360 }, theta: 0 }, size_x: 320, size_y: 240 });
      });
      const diagnostics = samples('rt/diagnostics').map(
        (b) => reader('diagnostic_msgs/msg/DiagnosticArray').readMessage(b) as DiagnosticArray,
      );
      const end = diagnostics.at(-1)!.status[0]!;
      assert.equal(end.name, 'percept: end');
      assert.equal(end.level, 0);
      assert.equal(end.hardware_id, RUN_ID);
      assert.deepEqual(JSON.parse(end.values.find((v) => v.key === 'frames')!.value), summary.frames);
      assert.ok(diagnostics.slice(0, -1).every((d) => d.status[0]!.name.startsWith('percept: ')));
    } finally {
      await ros2.close();
    }
  },
);

test('a topic name ROS 2 would refuse is an error naming it', async () => {
  await assert.rejects(
    createRos2Publisher({
      domainId: testDomainId(2),
      definitions: ROS2_PUBLISHED_DEFINITIONS,
      runId: RUN_ID,
      topics: { actions: 'percept actions' },
    }),
    /expected an absolute ROS 2 topic name such as \/percept\/actions but received "percept actions"/,
  );
});

interface Detection2DArray {
  header: unknown;
  detections: { id: string; results: { hypothesis: unknown }[]; bbox: unknown }[];
}
interface DiagnosticArray {
  status: { level: number; name: string; hardware_id: string; values: { key: string; value: string }[] }[];
}

function decodeHex(r: MessageReader, line: string): DiagnosticArray {
  return r.readMessage(Buffer.from(line.split(' ')[1]!, 'hex')) as DiagnosticArray;
}

// Closing the participant that created the domain must leave the others on it working (it used to delete them all).
test('participants on one domain outlive the first one closed', { timeout: 600_000 }, async () => {
  const domainId = testDomainId(7);
  const first = await DdsParticipant.open({ domainId });
  const out = await DdsParticipant.open({ domainId });
  const inp = await DdsParticipant.open({ domainId });
  let wake = (): void => {};
  const got: Buffer[] = [];
  const reader = inp.createReader('/shared', 'std_msgs/msg/String', ROS2_DEFAULT_QOS, () => {
    got.push(...reader.take());
    wake();
  });
  const writer = out.createWriter('/shared', 'std_msgs/msg/String', ROS2_DEFAULT_QOS);
  first.close();
  await until(() => writer.matched() === 1 && reader.matched() === 1);
  const sample = Uint8Array.from([0, 1, 0, 0, 3, 0, 0, 0, 104, 105, 0, 0]);
  const arrived = new Promise<void>((resolve) => (wake = resolve));
  writer.write(sample);
  await arrived;
  assert.deepEqual([...got[0]!], [...sample]);
  out.close();
  inp.close();
});

test('a configuration Cyclone DDS refuses is an error naming where it came from', async () => {
  const domainId = testDomainId(8);
  await assert.rejects(
    DdsParticipant.open({ domainId, config: 'file:///nonexistent/cyclonedds.xml' }),
    /ros2: Cyclone DDS refused the domain \d+ configuration from ros2\.cyclonedds "file:\/\/\/nonexistent\/cyclonedds\.xml" \(dds_create_domain/,
  );
  const saved = process.env.CYCLONEDDS_URI;
  process.env.CYCLONEDDS_URI = 'file:///nonexistent/from-env.xml';
  try {
    await assert.rejects(DdsParticipant.open({ domainId }), /configuration from CYCLONEDDS_URI=file:\/\/\/nonexistent\/from-env\.xml/);
  } finally {
    if (saved === undefined) delete process.env.CYCLONEDDS_URI;
    else process.env.CYCLONEDDS_URI = saved;
  }
});
