// The v1 header of every message percept publishes (configs/wire/header.schema.json), written as JSON text
// by hand so a frame's fields cost no object. The ZeroMQ and the ROS 2 publishers both build it here.
import type { ActionMessage } from './payloads.ts';
import type { Clock } from '../pipeline/clock.ts';
import type { FrameMeta, Stamp } from '../pipeline/types.ts';

const HEADER_VERSION = 1;

const num = (value: number): string => (Number.isFinite(value) ? String(value) : 'null');
const stampJson = (stamp: Stamp | null | undefined): string => (stamp ? `{"sec":${stamp.sec},"nanosec":${stamp.nanosec}}` : 'null');
/** ms since the Unix epoch of the instant `ns` on `clock`, exact to the ns (no float of the whole). */
export const unixMs = (clock: Clock, ns: bigint): number => {
  const unixNs = clock.unixNs(ns);
  return Number(unixNs / 1_000_000n) + Number(unixNs % 1_000_000n) / 1e6;
};

/** The run's fields of every header (configs/wire/header.schema.json): its id and clock. */
export const headerCommon = (runId: string, virtual: boolean): string =>
  `"run_id":${JSON.stringify(runId)},"clock":"${virtual ? 'virtual' : 'real'}"`;

/** A header's opening: version, schema id and the run's fields, without a trailing comma. */
export const headerHead = (schemaId: string, common: string): string =>
  `{"header_version":${HEADER_VERSION},"schema_id":${JSON.stringify(schemaId)},${common}`;

/** An action header's frame fields, after its head: the frame, its capture time and deadline, the ladder level, the models. */
export function actionFrameFields(
  msg: ActionMessage,
  frame: FrameMeta,
  virtual: boolean,
  modelsJson: string,
  sourceIdJson: string = JSON.stringify(msg.sourceId),
): string {
  const untilMs = msg.captureWallMs + Number(frame.deadlineNs - frame.captureNs) / 1e6;
  return (
    `,"frame_id":${msg.frameId},"source_id":${sourceIdJson},"source_stamp":${stampJson(frame.sourceStamp)}` +
    `,"capture_wall_ms":${virtual ? 'null' : num(msg.captureWallMs)},"valid_until_wall_ms":${virtual ? 'null' : num(untilMs)}` +
    `,"virtual_capture_ms":${virtual ? num(msg.captureWallMs) : 'null'},"virtual_valid_until_ms":${virtual ? num(untilMs) : 'null'}` +
    `,"degrade_level":${frame.degradeLevel},"models":${modelsJson}`
  );
}

/** A header's last fields, written at send time: the per-topic seq and the publish time.
 * The publish time is wall time, or the replay clock's on a virtual clock.
 * They close the header that `head` opens: everything before the seq, without a trailing comma. */
export function closeHeader(head: string, seq: number, virtualMs?: number): string {
  const times =
    virtualMs === undefined
      ? `"publish_wall_ms":${Date.now()},"virtual_publish_ms":null`
      : `"publish_wall_ms":null,"virtual_publish_ms":${num(virtualMs)}`;
  return `${head},"seq":${seq},${times}}`;
}
