// The run wiring's pure parts: --source specs become config sections the schema completes, and a run
// that published nothing is a failure with a reason.
import assert from 'node:assert/strict';
import { resolve } from 'node:path';
import { describe, test } from 'node:test';
import { parseSourceSpec } from '../../../app/run/run.ts';
import { runFailure } from '../../../app/run/stages.ts';
import { loadConfig } from '../../../pipeline/config.ts';
import { TelemetryAggregator } from '../../../pipeline/telemetry/aggregator.ts';
import type { RunSummary } from '../../../pipeline/telemetry/events.ts';

describe('parseSourceSpec', () => {
  const bag = loadConfig({ source: { kind: 'bag', path: '/bags/a.mcap', topic: '/cam', rate: 2 } }).source;
  const pattern = loadConfig({}).source;

  test('keeps what the spec leaves out from the current source of the same kind, else the schema fills it', () => {
    assert.deepEqual(parseSourceSpec('bag:b.mcap', bag), {
      kind: 'bag',
      path: resolve('b.mcap'),
      topic: '/cam',
      pace: 'recorded',
      rate: 2,
      loop: false,
    });
    assert.deepEqual(parseSourceSpec('pattern:5', pattern), { ...pattern, fps: 5 });
    assert.deepEqual(parseSourceSpec('pattern::7', bag), { kind: 'pattern', frames: 7 });
    assert.deepEqual(loadConfig({ source: parseSourceSpec('pattern::7', bag) }).source, { ...pattern, frames: 7 });
    assert.deepEqual(parseSourceSpec('folder:imgs:3', pattern), { kind: 'folder', path: resolve('imgs'), fps: 3 });
  });

  test('ffmpeg:URL and zmq:ENDPOINT keep everything after the kind; a relative file is relative to here', () => {
    assert.deepEqual(parseSourceSpec('ffmpeg:rtsp://127.0.0.1:8554/cam', pattern), { kind: 'ffmpeg', url: 'rtsp://127.0.0.1:8554/cam' });
    assert.deepEqual(parseSourceSpec('ffmpeg:/dev/video0', pattern), { kind: 'ffmpeg', url: '/dev/video0' });
    assert.deepEqual(parseSourceSpec('ffmpeg:clips/a.mp4', pattern), { kind: 'ffmpeg', url: resolve('clips/a.mp4') });
    assert.deepEqual(parseSourceSpec('zmq:tcp://127.0.0.1:5560', pattern), { kind: 'zmq', endpoint: 'tcp://127.0.0.1:5560' });
    assert.deepEqual(loadConfig({ source: parseSourceSpec('zmq:ipc:///tmp/frames', pattern) }).source, {
      kind: 'zmq',
      endpoint: 'ipc:///tmp/frames',
      socket: 'pull',
      bind: false,
      topic: '',
      receiveHighWaterMark: 10,
      maxMessageBytes: null,
      curve: null,
      insecure: false,
    });
    assert.deepEqual(loadConfig({ source: parseSourceSpec('ros2:/camera/image_raw/compressed', pattern) }).source, {
      kind: 'ros2',
      topic: '/camera/image_raw/compressed',
      type: 'sensor_msgs/msg/CompressedImage',
      reliability: 'best_effort',
      depth: 5,
    });
    assert.deepEqual(parseSourceSpec('ros2:/camera/image_raw:raw', pattern), {
      kind: 'ros2',
      topic: '/camera/image_raw',
      type: 'sensor_msgs/msg/Image',
    });
  });

  test('bad specs name what is wrong', () => {
    assert.throws(
      () => parseSourceSpec('camera:0', pattern),
      /unknown kind 'camera' \(expected pattern, bag, folder, ffmpeg, zmq or ros2\)/,
    );
    assert.throws(() => parseSourceSpec('bag:', pattern), /expected bag:PATH/);
    assert.throws(() => parseSourceSpec('zmq:', pattern), /expected zmq:ENDPOINT/);
    assert.throws(() => parseSourceSpec('ros2:/camera:jpeg', pattern), /expected ros2:TOPIC .* or ros2:TOPIC:raw/);
    assert.throws(() => parseSourceSpec('pattern:fast', pattern), /FPS must be a number >= 0, got 'fast'/);
  });
});

describe('runFailure', () => {
  const summary = (
    events: Parameters<TelemetryAggregator['add']>[0][],
    end: NonNullable<RunSummary['endReason']> = 'source_end',
  ): RunSummary => {
    const aggregator = new TelemetryAggregator('virtual');
    for (const event of events) aggregator.add(event);
    aggregator.end(10n, end, null);
    return aggregator.snapshot();
  };
  const frame = (frameId: number) => ({ type: 'frame' as const, atNs: 1n, frameId, sourceId: 's', captureNs: 0n, degradeLevel: 0 });

  test('a run that published something succeeded', () => {
    assert.equal(
      runFailure(summary([frame(0), frame(1), { type: 'output', atNs: 2n, frameId: 0, latencyNs: 2n, late: false }])),
      undefined,
    );
  });

  test('a run that published nothing says why', () => {
    assert.equal(runFailure(summary([])), 'the source produced no frames');
    const dropped = summary([
      frame(0),
      frame(1),
      { type: 'drop', atNs: 2n, frameId: 0, stage: 'decode', reason: 'stale', detail: '' },
      { type: 'drop', atNs: 3n, frameId: 1, stage: 'actions', reason: 'invalid', detail: '' },
    ]);
    assert.equal(runFailure(dropped), 'nothing was published: all 2 frames were dropped (stale 1, invalid 1)');
    assert.match(runFailure(summary([frame(0)], 'source_error'))!, /the source failed/);
  });
});
