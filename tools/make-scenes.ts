// Synthetic indoor robot scenes, to train and evaluate a vision-language model that outputs robot actions.
// Each integer seed gives one scene: room, lighting, camera pose, objects, noise and JPEG quality.
// Its expected action follows from the rules of actionOf. The same seed gives the same bytes.
// The drawing is tools/scene-geometry.ts's, the same flat shapes as the sample bag.
// Usage:
//   node --import tsx tools/make-scenes.ts dataset --split train --count N --out DIR [--start K] [--jobs J] [--width W --height H]
//     writes DIR/images/<seed>.jpg and DIR/scenes.jsonl (one line per frame: seed, split, image, size, action, scene)
//   node --import tsx tools/make-scenes.ts bag --split test --count N --out path.mcap [--start K] [--width W --height H]
//     writes a camera bag like bags/sample.mcap and its labels file (percept eval's format) beside it
import { mkdir, open, writeFile } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { Command, InvalidArgumentError } from 'commander';
import sharp from 'sharp';
import {
  createCanvas,
  drawBox,
  drawCup,
  drawDoor,
  drawObstacle,
  drawPerson,
  drawSign,
  drawTable,
  labelsPathOf,
  normBox,
  paintRoom,
  writeCameraBag,
  type Box,
  type Canvas,
  type RGB,
} from './scene-geometry.ts';

// ---------------------------------------------------------------------------------------------
// Seeds

/** Disjoint seed ranges [start, end) of the splits. The sample bag is a fixed scene, not a seed. */
export const SPLITS = {
  train: { start: 0, end: 1_000_000 },
  val: { start: 1_000_000, end: 1_100_000 },
  test: { start: 2_000_000, end: 2_100_000 },
} as const;
export type Split = keyof typeof SPLITS;
export const SPLIT_NAMES = Object.keys(SPLITS) as Split[];

/** The split a seed belongs to, or undefined. */
export const splitOf = (seed: number): Split | undefined => SPLIT_NAMES.find((s) => seed >= SPLITS[s].start && seed < SPLITS[s].end);

/** The k-th seed of a split; throws past its end. */
export function seedOf(split: Split, k: number): number {
  const { start, end } = SPLITS[split];
  if (!Number.isInteger(k) || k < 0 || start + k >= end)
    throw new RangeError(`seedOf: ${k} is outside split ${split} (${end - start} seeds)`);
  return start + k;
}

const mix32 = (v: number): number => {
  let x = v >>> 0;
  x = Math.imul(x ^ (x >>> 16), 0x7feb352d);
  x = Math.imul(x ^ (x >>> 15), 0x846ca68b);
  return (x ^ (x >>> 16)) >>> 0;
};

/** A deterministic PRNG (mulberry32) for one stream of one seed. */
export function rngOf(seed: number, stream: number): () => number {
  let a = mix32(mix32(seed) ^ mix32(stream + 0x9e3779b9));
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// ---------------------------------------------------------------------------------------------
// Scenes

/** [x0, y0, x1, y1], normalised to the image (x by width, y by height). */
export type NBox = readonly [number, number, number, number];

/** Colours of the A-frame sign: red and orange ones are wet-floor signs, the others are not. */
export type SignColour = 'red' | 'orange' | 'blue' | 'green' | 'grey' | 'purple';
export const WARNING_COLOURS: readonly SignColour[] = ['red', 'orange'];
const DECOY_COLOURS: readonly SignColour[] = ['blue', 'green', 'grey', 'purple'];
const SIGN_RGB: Record<SignColour, RGB> = {
  red: [205, 35, 35],
  orange: [240, 125, 20],
  blue: [40, 90, 200],
  green: [40, 150, 70],
  grey: [130, 130, 135],
  purple: [130, 60, 160],
};

export type ObjectKind = 'door' | 'box' | 'obstacle' | 'person' | 'cup' | 'table' | 'sign';

export interface SceneObject {
  readonly kind: ObjectKind;
  readonly box: NBox;
  /** Signs only: the sign's colour. */
  readonly colour?: SignColour;
  /** People only: walking stride, its sign the direction (0 stands). */
  readonly stride?: number;
  /** Drawing colours (their meaning depends on the kind); defaults when absent. */
  readonly paint?: readonly RGB[];
}

/** How a scene is drawn beyond its objects (nothing here changes the expected action). */
export interface SceneLook {
  readonly wall: RGB;
  readonly wallFade: number;
  readonly floor: number;
  readonly floorTint: RGB;
  readonly floorFade: number;
  /** Tile width (fraction of the image width), height (fraction of the tile width), grey step, phase (0–1). */
  readonly tile: readonly [number, number, number, number];
  /** Brightness change from the left edge to the right edge (the light comes from one side). */
  readonly gradient: number;
  /** Per-channel colour of the light. */
  readonly tint: RGB;
  /** Standard deviation of the pixel noise, grey levels. */
  readonly noise: number;
  readonly quality: number;
}

export interface Scene {
  /** The seed it was made from; the sample bag's frames, which are no seed, have -1. */
  readonly seed: number;
  /** Image row of the horizon, fraction of the height (the camera's pitch). */
  readonly horizon: number;
  /** Brightness of the scene, 1 as drawn. */
  readonly light: number;
  /** Far to near: drawn in this order. */
  readonly objects: readonly SceneObject[];
  readonly look: SceneLook;
}

/** The scenes are generated for this image aspect (width / height); other sizes stretch them. */
export const ASPECT = 16 / 9;

type Scenario = 'stop' | 'wait_person' | 'turn_block' | 'turn_wet' | 'grasp' | 'move' | 'move_slow' | 'wait_none';
/** How often each kind of scene is drawn, so that every action appears often (weights sum to 1). */
const SCENARIOS: readonly (readonly [Scenario, number])[] = [
  ['stop', 0.14],
  ['wait_person', 0.12],
  ['turn_block', 0.14],
  ['turn_wet', 0.08],
  ['grasp', 0.16],
  ['move', 0.16],
  ['move_slow', 0.1],
  ['wait_none', 0.1],
];

const overlaps = (a: NBox, b: NBox, margin = 0.01): boolean =>
  a[0] < b[2] + margin && b[0] < a[2] + margin && a[1] < b[3] + margin && b[1] < a[3] + margin;

const jitter = (rgb: RGB, r: () => number, amount: number): RGB =>
  rgb.map((v) => Math.round(Math.min(255, Math.max(0, v + (r() * 2 - 1) * amount)))) as unknown as RGB;

// Palettes the generator picks from; each pick is then jittered.
const DOOR_FRAMES: readonly RGB[] = [
  [70, 50, 35],
  [60, 60, 70],
  [110, 110, 105],
];
const DOOR_PANELS: readonly RGB[] = [
  [140, 95, 55],
  [120, 70, 40],
  [90, 110, 140],
  [200, 200, 195],
  [100, 130, 100],
];
const TABLE_WOODS: readonly RGB[] = [
  [150, 110, 70],
  [200, 200, 200],
  [90, 70, 50],
];
const CUP_BODIES: readonly RGB[] = [
  [245, 245, 240],
  [200, 40, 40],
  [40, 80, 190],
  [40, 150, 70],
  [235, 200, 40],
  [35, 35, 35],
];
const PERSON_LEGS: readonly RGB[] = [
  [40, 40, 60],
  [60, 50, 40],
  [30, 30, 30],
  [70, 80, 110],
];
const PERSON_TORSOS: readonly RGB[] = [
  [40, 90, 160],
  [160, 50, 50],
  [60, 130, 80],
  [200, 200, 200],
  [200, 160, 60],
  [90, 60, 120],
];
const PERSON_SKINS: readonly RGB[] = [
  [225, 185, 150],
  [190, 140, 100],
  [140, 95, 65],
  [95, 65, 45],
];
const OBSTACLE_BODIES: readonly RGB[] = [
  [70, 75, 80],
  [40, 90, 60],
  [40, 50, 90],
  [45, 45, 45],
];
const WALLS: readonly RGB[] = [
  [225, 215, 190],
  [200, 210, 220],
  [215, 220, 200],
  [230, 225, 225],
  [190, 180, 170],
  [210, 190, 200],
];

/** Draws from one seed's stream. Every caller keeps the order of its draws, so a seed's scene never changes. */
interface Draws {
  readonly r: () => number;
  readonly uniform: (a: number, b: number) => number;
  readonly chance: (p: number) => boolean;
  readonly pick: <T>(xs: readonly T[]) => T;
}

const drawsOf = (r: () => number): Draws => ({
  r,
  uniform: (a, b) => a + (b - a) * r(),
  chance: (p) => r() < p,
  pick: <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!,
});

/** A palette pick, then its jitter (in that order). */
const paintFrom = (d: Draws, palette: readonly RGB[], amount: number): RGB => jitter(d.pick(palette), d.r, amount);

/** A scene while its objects are placed: the draws, the camera's horizon and what is in so far. */
interface Room extends Draws {
  readonly horizon: number;
  readonly placed: SceneObject[];
}

/** Image row of a floor depth (0 at the horizon, 1 at the bottom edge). */
const floorY = (room: Room, depth: number): number => room.horizon + depth * (1 - room.horizon);
/** Apparent size at a floor row: smaller towards the horizon. */
const scaleAt = (room: Room, y1: number): number => 0.45 + 0.55 * ((y1 - room.horizon) / (1 - room.horizon));
/** Whether a box lies inside the image and clear of everything placed. */
const isFree = (room: Room, b: NBox): boolean =>
  b[0] >= 0.005 && b[2] <= 0.995 && b[1] >= 0.005 && room.placed.every((o) => !overlaps(o.box, b));

/** Tries to place an object `tries` times, drawing it anew each time; returns whether it went in. */
function place(room: Room, make: () => SceneObject, tries = 30): boolean {
  for (let i = 0; i < tries; i++) {
    const o = make();
    if (isFree(room, o.box)) {
      room.placed.push(o);
      return true;
    }
  }
  return false;
}

/** A door in the wall, standing on the horizon. */
function makeDoor(room: Room): SceneObject {
  const w = room.uniform(0.08, 0.15);
  const x0 = room.uniform(0.02, 0.98 - w);
  const top = Math.max(0.02, room.horizon - room.uniform(0.3, 0.45));
  return {
    kind: 'door',
    box: [x0, top, x0 + w, room.horizon],
    paint: [paintFrom(room, DOOR_FRAMES, 15), paintFrom(room, DOOR_PANELS, 20), jitter([220, 200, 90], room.r, 20)],
  };
}

/** A cup on a table against the wall; both go in as one piece. Returns whether they went in. */
function placeCupOnTable(room: Room): boolean {
  for (let i = 0; i < 30; i++) {
    const feet = floorY(room, room.uniform(0.02, 0.08));
    const tw = room.uniform(0.12, 0.2);
    const tx = room.uniform(0.02, 0.98 - tw);
    const top = feet - room.uniform(0.08, 0.14);
    const cw = room.uniform(0.03, 0.05);
    const ch = cw * ASPECT * room.uniform(0.9, 1.3);
    const cx = tx + room.uniform(0.1, 0.9 - cw / tw) * tw;
    const table: SceneObject = {
      kind: 'table',
      box: [tx, top, tx + tw, feet],
      paint: [paintFrom(room, TABLE_WOODS, 15), jitter([80, 70, 60], room.r, 15)],
    };
    const cup: SceneObject = { kind: 'cup', box: [cx, top - ch, cx + cw, top], paint: [paintFrom(room, CUP_BODIES, 10), [70, 45, 30]] };
    if (isFree(room, [tx, top - ch, tx + tw, feet])) {
      room.placed.push(table, cup);
      return true;
    }
  }
  return false;
}

/**
 * A person, near (at least NEAR_PERSON of the image high) or farther away; most walk, some stand.
 * Heights cover each side of NEAR_PERSON whole; the feet stand deeper the taller the person looks.
 */
function makePerson(room: Room, near: boolean): SceneObject {
  const { uniform, chance } = room;
  // Half the people stand within 0.08 of NEAR_PERSON, where the action turns on the box's height.
  const band = chance(0.5);
  const tall = near
    ? uniform(NEAR_PERSON, band ? NEAR_PERSON + 0.08 : 0.85)
    : uniform(band ? NEAR_PERSON - 0.08 : 0.13, NEAR_PERSON - 0.005);
  // A person of typical size looks 0.15 + 0.55 * depth high; people vary around it.
  const depth = Math.min(1, Math.max(0.05, (tall - 0.15) / 0.55 + uniform(-0.25, 0.25)));
  const y1 = Math.min(0.995, floorY(room, depth));
  const h = Math.min(tall, y1 - 0.02);
  const ratio = uniform(0.26, 0.34); // body width / body height, pixels
  const bodyH = h / (1 + 0.87 * ratio);
  const w = (bodyH * ratio) / ASPECT;
  const x0 = uniform(0.01, 0.99 - w);
  return {
    kind: 'person',
    box: [x0, y1 - h, x0 + w, y1],
    stride: chance(0.85) ? (chance(0.5) ? 1 : -1) * uniform(0.4, 1) : 0,
    paint: [paintFrom(room, PERSON_LEGS, 10), paintFrom(room, PERSON_TORSOS, 20), paintFrom(room, PERSON_SKINS, 10)],
  };
}

/** Where a floor thing stands: in the robot's path, far away, or near at one side. */
type FloorSpot = 'block' | 'far' | 'side';

/** A cardboard box or a bin-like obstacle on the floor. */
function makeFloorThing(room: Room, kind: 'box' | 'obstacle', where: FloorSpot): SceneObject {
  const { uniform, chance } = room;
  const depth = where === 'block' ? uniform(0.62, 0.95) : where === 'far' ? uniform(0.08, 0.4) : uniform(0.5, 0.95);
  const y1 = floorY(room, depth);
  const w = uniform(0.09, 0.16) * scaleAt(room, y1);
  const h = w * ASPECT * (kind === 'box' ? uniform(0.6, 0.9) : uniform(1.1, 1.6));
  let x0: number;
  if (where === 'block') x0 = (chance(0.5) ? uniform(0.38, 0.46) : uniform(0.54, 0.62)) - w / 2;
  else if (where === 'side') x0 = chance(0.5) ? uniform(0.01, 0.3 - w) : uniform(0.7, 0.99 - w);
  else x0 = uniform(0.01, 0.99 - w);
  const paint: RGB[] =
    kind === 'box'
      ? [jitter([180, 130, 70], room.r, 20), jitter([150, 105, 55], room.r, 15)]
      : [paintFrom(room, OBSTACLE_BODIES, 15), [25, 25, 25], [110, 115, 120]];
  return { kind, box: [x0, y1 - h, x0 + w, y1], paint };
}

/** An A-frame sign near one side of the floor. */
function makeSign(room: Room, colour: SignColour): SceneObject {
  const y1 = floorY(room, room.uniform(0.2, 0.9));
  const w = room.uniform(0.06, 0.1) * scaleAt(room, y1);
  const h = w * ASPECT * room.uniform(1.4, 1.8);
  const x0 = room.chance(0.5) ? room.uniform(0.01, 0.33 - w) : room.uniform(0.67, 0.99 - w);
  return { kind: 'sign', box: [x0, y1 - h, x0 + w, y1], colour, paint: [jitter(SIGN_RGB[colour], room.r, 18), [30, 30, 30]] };
}

const placeDoor = (room: Room, tries?: number): boolean => place(room, () => makeDoor(room), tries);
const placeBlocker = (room: Room, tries?: number): boolean =>
  place(room, () => makeFloorThing(room, room.chance(0.5) ? 'box' : 'obstacle', 'block'), tries);
const placeWetSign = (room: Room, tries?: number): boolean => place(room, () => makeSign(room, room.pick(WARNING_COLOURS)), tries);
/** A sign of any colour, warning or not. */
const placeAnySign = (room: Room): boolean =>
  place(room, () => makeSign(room, room.pick(room.chance(0.5) ? WARNING_COLOURS : DECOY_COLOURS)));

/** Boxes and obstacles off the robot's path, each given a few tries. */
function placeDistractors(room: Room, n: number): void {
  for (let i = 0; i < n; i++)
    place(room, () => makeFloorThing(room, room.chance(0.5) ? 'box' : 'obstacle', room.chance(0.5) ? 'far' : 'side'), 10);
}

/** With chance p, a sign that is no wet-floor sign. */
function placeDecoy(room: Room, p: number): void {
  if (room.chance(p)) place(room, () => makeSign(room, room.pick(DECOY_COLOURS)), 10);
}

/** A person scene: near (stop) or farther away (wait), with some other things around. Returns whether the light is low. */
function personScene(room: Room, near: boolean): boolean {
  place(room, () => makePerson(room, near), 100);
  if (room.chance(0.5)) placeDoor(room);
  if (room.chance(0.3)) placeCupOnTable(room);
  if (!near && room.chance(0.2)) placeBlocker(room);
  if (room.chance(0.3)) placeAnySign(room);
  placeDistractors(room, Math.floor(room.uniform(0, 3)));
  return room.chance(0.2);
}

/** Places a scenario's objects; returns whether the scene is in low light. */
const SCENE_BUILDERS: Record<Scenario, (room: Room) => boolean> = {
  stop: (room) => personScene(room, true),
  wait_person: (room) => personScene(room, false),
  turn_block: (room) => {
    placeBlocker(room, 100);
    if (room.chance(0.5)) placeDoor(room);
    if (room.chance(0.3)) placeCupOnTable(room);
    if (room.chance(0.3)) placeAnySign(room);
    placeDistractors(room, Math.floor(room.uniform(0, 2)));
    return room.chance(0.2);
  },
  turn_wet: (room) => {
    placeWetSign(room, 100);
    if (room.chance(0.4)) placeCupOnTable(room);
    placeDecoy(room, 0.2);
    placeDistractors(room, Math.floor(room.uniform(0, 3)));
    return room.chance(0.2);
  },
  grasp: (room) => {
    placeCupOnTable(room);
    if (room.chance(0.5)) placeDoor(room);
    placeDecoy(room, 0.4);
    placeDistractors(room, Math.floor(room.uniform(0, 3)));
    return false;
  },
  move: (room) => {
    placeDoor(room, 100);
    placeDecoy(room, 0.4);
    placeDistractors(room, Math.floor(room.uniform(0, 3)));
    return false;
  },
  // A hazard slows the robot down: a wet-floor sign, low light, or both.
  move_slow: (room) => {
    placeDoor(room, 100);
    const wet = room.chance(0.6) && placeWetSign(room);
    const low = !wet || room.chance(0.3);
    if (room.chance(0.3)) placeCupOnTable(room);
    placeDecoy(room, 0.2);
    placeDistractors(room, Math.floor(room.uniform(0, 3)));
    return low;
  },
  wait_none: (room) => {
    placeDecoy(room, 0.4);
    placeDistractors(room, Math.floor(room.uniform(0, 3)));
    return room.chance(0.4);
  },
};

/** The scenario that a uniform draw u (0–1) falls on, by the SCENARIOS weights. */
function scenarioOf(u: number): Scenario {
  for (const [s, w] of SCENARIOS) {
    if (u < w) return s;
    u -= w;
  }
  return 'wait_none';
}

/** The light and the look: room colours, floor tiles, side light, tint, noise and JPEG quality. */
function lookOf(d: Draws, low: boolean): { light: number; look: SceneLook } {
  const { uniform } = d;
  const light = low ? uniform(0.24, 0.4) : uniform(0.7, 1.15);
  const tileW = uniform(0.04, 0.09);
  const look: SceneLook = {
    wall: paintFrom(d, WALLS, 15),
    wallFade: uniform(0.05, 0.25),
    floor: Math.round(uniform(90, 170)),
    floorTint: [Math.round(uniform(-8, 8)), Math.round(uniform(-8, 8)), Math.round(uniform(-8, 8))],
    floorFade: uniform(0.2, 0.45),
    tile: [tileW, uniform(0.4, 0.6), Math.round(uniform(3, 12)), d.r()],
    gradient: uniform(-0.25, 0.25),
    tint: [uniform(0.92, 1.08), uniform(0.95, 1.05), uniform(0.92, 1.08)],
    noise: low ? uniform(2, 8) : uniform(0, 6),
    quality: Math.floor(uniform(55, 93)),
  };
  return { light, look };
}

/** Drawing order: wall pieces (doors) first, then the rest far to near, so nearer things cover farther ones. */
function drawingOrder(placed: readonly SceneObject[]): SceneObject[] {
  const wallFirst = (o: SceneObject): number => (o.kind === 'door' ? 0 : 1);
  return placed
    .map((o, i) => ({ o, i }))
    .sort((a, b) => wallFirst(a.o) - wallFirst(b.o) || a.o.box[3] - b.o.box[3] || a.i - b.i)
    .map(({ o }) => o);
}

/** The scene of a seed: a scenario is drawn first, then the camera, objects that fit the scenario, distractors, and the look. */
export function makeScene(seed: number): Scene {
  const draws = drawsOf(rngOf(seed, 1));
  const scenario = scenarioOf(draws.r());
  const room: Room = { ...draws, horizon: draws.uniform(0.42, 0.62), placed: [] };
  const low = SCENE_BUILDERS[scenario](room);
  const { light, look } = lookOf(draws, low);
  return { seed, horizon: room.horizon, light, objects: drawingOrder(room.placed), look };
}

// ---------------------------------------------------------------------------------------------
// The rules

/** An action in configs/actions/robot-action.schema.json, keys in the schema's order. */
export interface RobotAction {
  target?: { label: 'person' | 'cup' | 'box' | 'door' | 'obstacle' | 'none'; bbox?: number[] };
  action: 'stop' | 'move' | 'turn' | 'grasp' | 'release' | 'wait';
  confidence: number;
  speed?: number;
  heading_deg?: number;
  hazards?: ('person_close' | 'edge' | 'wet_floor' | 'low_light')[];
}

/** A person is close when their box is at least this share of the image height. */
export const NEAR_PERSON = 0.45;
/** The robot's path: this band of image columns, on the nearer half of the floor. */
export const PATH_X: readonly [number, number] = [0.35, 0.65];
export const PATH_DEPTH = 0.5;
/** Below this light the scene is too dark to act on (low_light). */
export const LOW_LIGHT = 0.5;
export const CRUISE_SPEED = 1;
export const SLOW_SPEED = 0.3;
export const TURN_DEG = 45;

const blocks = (o: SceneObject, horizon: number): boolean =>
  (o.kind === 'box' || o.kind === 'obstacle') &&
  o.box[0] < PATH_X[1] &&
  o.box[2] > PATH_X[0] &&
  (o.box[3] - horizon) / (1 - horizon) >= PATH_DEPTH;
const isWetFloorSign = (o: SceneObject): boolean => o.kind === 'sign' && WARNING_COLOURS.includes(o.colour ?? 'grey');
const centreX = (o: SceneObject): number => (o.box[0] + o.box[2]) / 2;
const nearest = (os: SceneObject[]): SceneObject | undefined =>
  os.reduce<SceneObject | undefined>((a, o) => (a && a.box[3] >= o.box[3] ? a : o), undefined);
const bboxOf = (o: SceneObject): number[] => normBox({ x0: o.box[0], y0: o.box[1], x1: o.box[2], y1: o.box[3] }, 1, 1, 2);

/**
 * The expected action of a scene. The first rule that holds decides the action:
 *
 *   rule  when                                              action  speed  heading_deg            target
 *   1     a person is close (box ≥ NEAR_PERSON of height)   stop    -      -                      person
 *   2     a person is farther away (crossing)               wait    -      -                      person
 *   3     a box or obstacle blocks the path (PATH_X, on     turn    -      ±TURN_DEG, away        box | obstacle
 *         the nearer PATH_DEPTH of the floor)                                from it
 *   4     a wet-floor sign (red or orange) and no door      turn    -      ±TURN_DEG, away        none
 *   5     a cup and no hazard                               grasp   -      -                      cup
 *   6     a door                                            move    1.0,   towards it: −90·(x−½)  door
 *                                                                   0.3 with a hazard
 *   7     otherwise                                         wait    -      -                      none
 *
 * Hazards (any rule, in this order): person_close (rule 1), wet_floor (a red or orange sign; the
 * same sign in another colour is no hazard), low_light (light < LOW_LIGHT).
 * heading_deg is positive to the left (REP 103), rounded to 5°; x is the door's centre, a share of
 * the width. "Away" turns right from a thing left of the image centre, left from one right of it. bbox: the target's [x0, y0, x1, y1] normalised, 2 decimals; confidence 1.
 * The nearest (lowest in the image) person, blocker or sign counts when there are several.
 */
export function actionOf(scene: Scene): RobotAction {
  const of = (kind: ObjectKind): SceneObject[] => scene.objects.filter((o) => o.kind === kind);
  const person = nearest(of('person'));
  const close = person !== undefined && person.box[3] - person.box[1] >= NEAR_PERSON;
  const sign = nearest(scene.objects.filter(isWetFloorSign));
  const hazards: NonNullable<RobotAction['hazards']> = [];
  if (close) hazards.push('person_close');
  if (sign) hazards.push('wet_floor');
  if (scene.light < LOW_LIGHT) hazards.push('low_light');
  const withHazards = (a: RobotAction): RobotAction => (hazards.length > 0 ? { ...a, hazards } : a);
  const away = (o: SceneObject): number => (centreX(o) < 0.5 ? -TURN_DEG : TURN_DEG);
  const door = nearest(of('door'));

  if (person && close) return withHazards({ action: 'stop', confidence: 1, target: { label: 'person', bbox: bboxOf(person) } });
  if (person) return withHazards({ action: 'wait', confidence: 1, target: { label: 'person', bbox: bboxOf(person) } });
  const blocker = nearest(scene.objects.filter((o) => blocks(o, scene.horizon)));
  if (blocker)
    return withHazards({
      action: 'turn',
      confidence: 1,
      heading_deg: away(blocker),
      target: { label: blocker.kind as 'box' | 'obstacle', bbox: bboxOf(blocker) },
    });
  if (sign && !door) return withHazards({ action: 'turn', confidence: 1, heading_deg: away(sign), target: { label: 'none' } });
  const cup = nearest(of('cup'));
  if (cup && hazards.length === 0) return { action: 'grasp', confidence: 1, target: { label: 'cup', bbox: bboxOf(cup) } };
  if (door) {
    const heading = Math.round((-90 * (centreX(door) - 0.5)) / 5) * 5;
    return withHazards({
      action: 'move',
      confidence: 1,
      speed: hazards.length > 0 ? SLOW_SPEED : CRUISE_SPEED,
      heading_deg: heading === 0 ? 0 : heading,
      target: { label: 'door', bbox: bboxOf(door) },
    });
  }
  return withHazards({ action: 'wait', confidence: 1, target: { label: 'none' } });
}

/** A short JSON summary of a scene: camera, light, and each object's kind, box (3 decimals) and colour. */
export function summaryOf(scene: Scene): Record<string, unknown> {
  const r3 = (v: number): number => Math.round(v * 1000) / 1000;
  return {
    horizon: r3(scene.horizon),
    light: r3(scene.light),
    noise: r3(scene.look.noise),
    quality: scene.look.quality,
    objects: scene.objects.map((o) => ({
      kind: o.kind,
      bbox: o.box.map((v) => r3(Math.min(1, Math.max(0, v)))),
      ...(o.colour ? { colour: o.colour } : {}),
      ...(o.kind === 'person' ? { near: o.box[3] - o.box[1] >= NEAR_PERSON, walking: (o.stride ?? 0) !== 0 } : {}),
    })),
  };
}

// ---------------------------------------------------------------------------------------------
// Drawing

/** Each object kind's colours, in paint order, where a scene gives none. */
export const DEFAULT_PAINT: Record<ObjectKind, readonly RGB[]> = {
  door: [
    [70, 50, 35],
    [140, 95, 55],
    [220, 200, 90],
  ],
  box: [
    [180, 130, 70],
    [150, 105, 55],
  ],
  obstacle: [
    [70, 75, 80],
    [25, 25, 25],
    [110, 115, 120],
  ],
  person: [
    [40, 40, 60],
    [40, 90, 160],
    [225, 185, 150],
  ],
  cup: [
    [245, 245, 240],
    [70, 45, 30],
  ],
  table: [
    [150, 110, 70],
    [80, 70, 60],
  ],
  sign: [
    [205, 35, 35],
    [30, 30, 30],
  ],
};

export interface RenderOptions {
  /** Skip the light, colour tint and noise (flat colours as drawn). */
  readonly plain?: boolean;
}

/** Draws one object, its normalised box scaled to width×height. */
function drawObject(c: Canvas, o: SceneObject, width: number, height: number): void {
  const b: Box = { x0: o.box[0] * width, y0: o.box[1] * height, x1: o.box[2] * width, y1: o.box[3] * height };
  const w = b.x1 - b.x0;
  const h = b.y1 - b.y0;
  const p = o.paint ?? DEFAULT_PAINT[o.kind];
  const at = (i: number): RGB => p[i] ?? DEFAULT_PAINT[o.kind][i]!;
  switch (o.kind) {
    case 'door':
      drawDoor(
        c,
        b.x0,
        b.y0,
        w,
        b.y1,
        { frame: at(0), panel: at(1), knob: at(2), frameW: Math.max(2, Math.round(width * 0.009)) },
        { x: b.x0 + w * 0.85, y: b.y1 - h * 0.46, r: Math.max(2, height * 0.012) },
      );
      break;
    case 'box':
      drawBox(c, b.x0, b.y0, w, h, { body: at(0), tape: at(1) });
      break;
    case 'obstacle':
      drawObstacle(c, b.x0, b.y1, w, h, { body: at(0), band: at(1), lid: at(2) });
      break;
    case 'person': {
      // Invert personBox: the box's height is the body plus 0.87 body widths of head.
      const bodyH = h - 0.87 * w;
      drawPerson(c, b.x0, b.y1, w, bodyH, { legs: at(0), torso: at(1), skin: at(2), stride: o.stride ?? 0 });
      break;
    }
    case 'cup':
      drawCup(c, b.x0, b.y1, w, h, { body: at(0), inside: at(1) });
      break;
    case 'table':
      drawTable(c, b.x0, b.y0, w, b.y1, { wood: at(0), legs: at(1) });
      break;
    case 'sign':
      drawSign(c, b.x0, b.y1, w, h, { body: at(0), mark: at(1) });
      break;
  }
}

/** RGB pixels of a scene at width×height (pure). */
export function renderScene(scene: Scene, width: number, height: number, options: RenderOptions = {}): Buffer {
  const c = createCanvas(width, height);
  const { look } = scene;
  const horizon = Math.round(scene.horizon * height);
  const tileW = Math.max(4, look.tile[0] * width);
  paintRoom(c, {
    horizon,
    wall: look.wall,
    wallFade: look.wallFade,
    floor: look.floor,
    floorTint: look.floorTint,
    floorFade: look.floorFade,
    tileW,
    tileH: Math.max(2, tileW * look.tile[1]),
    tileDelta: look.tile[2],
    tileShift: look.tile[3] * tileW,
    skirting: [90, 80, 70],
  });
  for (const o of scene.objects) drawObject(c, o, width, height);
  if (!options.plain) finish(c.px, width, height, scene);
  return c.px;
}

/** Light (brightness, side gradient, colour tint) and pixel noise, in place; the noise is the seed's own stream. */
function finish(px: Buffer, width: number, height: number, scene: Scene): void {
  const { gradient, tint, noise } = scene.look;
  const gain = new Float32Array(width * 3);
  for (let x = 0; x < width; x++) {
    const k = scene.light * (1 + gradient * ((x + 0.5) / width - 0.5));
    for (let ch = 0; ch < 3; ch++) gain[x * 3 + ch] = k * tint[ch]!;
  }
  // Gaussian noise from a table drawn once per scene, indexed by a fast xorshift (10 bits per channel).
  const r = rngOf(scene.seed, 2);
  const table = new Float32Array(1024);
  for (let i = 0; i < table.length; i += 2) {
    const u1 = Math.max(1e-12, r());
    const u2 = r();
    const m = noise * Math.sqrt(-2 * Math.log(u1));
    table[i] = m * Math.cos(2 * Math.PI * u2);
    table[i + 1] = m * Math.sin(2 * Math.PI * u2);
  }
  let s = (Math.floor(r() * 0xffffffff) | 1) >>> 0;
  // A clamped view rounds and clamps on assignment (round half to even).
  const out = new Uint8ClampedArray(px.buffer, px.byteOffset, px.length);
  const rowLen = width * 3;
  for (let y = 0; y < height; y++) {
    const row = y * rowLen;
    for (let i = 0; i < rowLen; i += 3) {
      s ^= s << 13;
      s ^= s >>> 17;
      s ^= s << 5;
      const o = row + i;
      out[o] = px[o]! * gain[i]! + table[s & 1023]!;
      out[o + 1] = px[o + 1]! * gain[i + 1]! + table[(s >>> 10) & 1023]!;
      out[o + 2] = px[o + 2]! * gain[i + 2]! + table[(s >>> 20) & 1023]!;
    }
  }
}

/** The JPEG of a scene at the scene's quality. */
export async function encodeScene(scene: Scene, width: number, height: number): Promise<Buffer> {
  return sharp(renderScene(scene, width, height), { raw: { width, height, channels: 3 } })
    .jpeg({ quality: scene.look.quality })
    .toBuffer();
}

// ---------------------------------------------------------------------------------------------
// Dataset and bag

export interface DatasetOptions {
  readonly split: Split;
  readonly count: number;
  readonly out: string;
  /** First seed's position in the split. */
  readonly start?: number;
  readonly width?: number;
  readonly height?: number;
  /** Worker threads; 1 draws in this thread. */
  readonly jobs?: number;
}

/** One line of scenes.jsonl. */
export function datasetLine(scene: Scene, width: number, height: number): string {
  const { seed } = scene;
  return JSON.stringify({
    seed,
    split: splitOf(seed),
    image: `images/${seed}.jpg`,
    width,
    height,
    action: actionOf(scene),
    scene: summaryOf(scene),
  });
}

/** Draws and writes some seeds' images, at most `window` encodes in flight; calls back each line as it is done. */
async function writeImages(
  seeds: readonly number[],
  dir: string,
  width: number,
  height: number,
  onLine: (seed: number, line: string) => void,
): Promise<void> {
  const window = 4;
  const inFlight = new Set<Promise<void>>();
  for (const seed of seeds) {
    const scene = makeScene(seed);
    const raw = renderScene(scene, width, height);
    const job = sharp(raw, { raw: { width, height, channels: 3 } })
      .jpeg({ quality: scene.look.quality })
      .toBuffer()
      .then((jpeg) => writeFile(join(dir, 'images', `${seed}.jpg`), jpeg))
      .then(() => onLine(seed, datasetLine(scene, width, height)));
    const tracked: Promise<void> = job.finally(() => inFlight.delete(tracked));
    inFlight.add(tracked);
    if (inFlight.size >= window) await Promise.race(inFlight);
  }
  await Promise.all(inFlight);
}

interface WorkerJob {
  readonly kind: 'percept-scenes';
  readonly seeds: number[];
  readonly dir: string;
  readonly width: number;
  readonly height: number;
}

/** Writes DIR/images/<seed>.jpg and DIR/scenes.jsonl (lines in seed order); returns frames and seconds. */
export async function writeDataset(options: DatasetOptions): Promise<{ frames: number; seconds: number }> {
  const { split, count, out, start = 0, width = 640, height = 360 } = options;
  const jobs = Math.max(1, Math.min(options.jobs ?? 1, count));
  checkSize(width, height);
  if (!Number.isInteger(count) || count < 1) throw new RangeError(`dataset: expected a count >= 1, got ${count}`);
  const seeds = Array.from({ length: count }, (_, k) => seedOf(split, start + k));
  await mkdir(join(out, 'images'), { recursive: true });
  const t0 = performance.now();
  const lines = await open(join(out, 'scenes.jsonl'), 'w');
  try {
    // Lines arrive out of order from the workers; they are written in seed order.
    const pending = new Map<number, string>();
    let next = 0;
    let writing = Promise.resolve();
    const onLine = (seed: number, line: string): void => {
      pending.set(seed, line);
      let chunk = '';
      while (next < seeds.length && pending.has(seeds[next]!)) {
        chunk += pending.get(seeds[next]!)! + '\n';
        pending.delete(seeds[next]!);
        next++;
      }
      if (chunk) writing = writing.then(() => lines.write(chunk).then(() => undefined));
    };
    if (jobs === 1) await writeImages(seeds, out, width, height, onLine);
    else {
      const tsx = import.meta.resolve('tsx/esm/api');
      // Node 20 does not carry `--import tsx` into a worker, so the worker registers tsx itself.
      const entry = `import(${JSON.stringify(tsx)}).then(({ register }) => { register(); return import(${JSON.stringify(import.meta.url)}); })`;
      const workers: Worker[] = [];
      try {
        await Promise.all(
          Array.from({ length: jobs }, (_, j) => {
            const job: WorkerJob = { kind: 'percept-scenes', seeds: seeds.filter((_, k) => k % jobs === j), dir: out, width, height };
            return new Promise<void>((resolve, reject) => {
              const w = new Worker(entry, { eval: true, workerData: job });
              workers.push(w);
              w.on('message', (m: { seed: number; line: string }) => onLine(m.seed, m.line));
              w.on('error', reject);
              w.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`dataset: worker ${j} exited with code ${code}`))));
            });
          }),
        );
      } catch (err) {
        // One worker failed: the others stop too, so the command ends with the error.
        await Promise.all(workers.map((w) => w.terminate()));
        throw err;
      }
    }
    await writing;
    if (next !== seeds.length) throw new Error(`dataset: ${seeds.length - next} frames were not written`);
  } finally {
    await lines.close();
  }
  return { frames: count, seconds: (performance.now() - t0) / 1000 };
}

/** Log time of a scenes bag's first message (the sample bag's), ns; frames follow at 10 Hz. */
export const SCENES_START_NS = 1_700_000_000_000_000_000n;

export interface ScenesBagOptions {
  readonly split: Split;
  readonly count: number;
  readonly start?: number;
  readonly width?: number;
  readonly height?: number;
  readonly hz?: number;
}

/** Writes a camera bag of consecutive seeds of a split (as make-sample-bag does) and its labels file. */
export async function writeScenesBag(
  path: string,
  options: ScenesBagOptions,
): Promise<{ path: string; labels: string; frames: number; bytes: number }> {
  const { split, count, start = 0, width = 640, height = 360, hz = 10 } = options;
  checkSize(width, height);
  if (!Number.isInteger(count) || count < 1) throw new RangeError(`bag: expected a count >= 1, got ${count}`);
  const seeds = Array.from({ length: count }, (_, k) => seedOf(split, start + k));
  const periodNs = BigInt(Math.round(1e9 / hz));
  const stampOf = (i: number): bigint => SCENES_START_NS + BigInt(i) * periodNs;
  const { bytes } = await writeCameraBag(path, {
    library: 'percept tools/make-scenes',
    metadata: {
      name: 'percept.scenes',
      entries: [
        ['generator', 'tools/make-scenes.ts'],
        ['split', split],
        ['seeds', `${seeds[0]}..${seeds[seeds.length - 1]}`],
        ['size', `${width}x${height}`],
        ['rate_hz', String(hz)],
      ],
    },
    frames: (async function* () {
      // A few frames are encoded ahead while the writer compresses.
      const ahead: Promise<Buffer>[] = [];
      for (let i = 0; i < seeds.length; i++) {
        while (ahead.length < 4 && i + ahead.length < seeds.length)
          ahead.push(encodeScene(makeScene(seeds[i + ahead.length]!), width, height));
        yield { jpeg: await ahead.shift()!, stampNs: stampOf(i) };
      }
    })(),
  });
  const labels = labelsPathOf(path);
  const lines = seeds.map((seed, i) =>
    JSON.stringify({ log_time_ns: String(stampOf(i)), action: actionOf(makeScene(seed)), note: `seed ${seed}` }),
  );
  await writeFile(labels, `${lines.join('\n')}\n`);
  return { path, labels, frames: count, bytes };
}

function checkSize(width: number, height: number): void {
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 64 || height < 64)
    throw new RangeError(`make-scenes: bad size ${width}x${height} (expected integers >= 64)`);
}

// ---------------------------------------------------------------------------------------------
// CLI

const integer = (min: number) => (value: string) => {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected an integer >= ${min}`);
  return n;
};
const splitName = (value: string): Split => {
  if (!(SPLIT_NAMES as string[]).includes(value)) throw new InvalidArgumentError(`expected one of ${SPLIT_NAMES.join(', ')}`);
  return value as Split;
};

export async function main(argv: string[]): Promise<void> {
  const program = new Command('make-scenes').description('Synthetic indoor robot scenes with their expected actions.');
  program
    .command('dataset')
    .description('write DIR/images/<seed>.jpg and DIR/scenes.jsonl')
    .requiredOption('--split <name>', 'train, val or test', splitName)
    .requiredOption('--count <n>', 'frames', integer(1))
    .requiredOption('--out <dir>', 'output folder')
    .option('--start <k>', "first seed's position in the split", integer(0), 0)
    .option('--width <px>', 'image width', integer(64), 640)
    .option('--height <px>', 'image height', integer(64), 360)
    .option('--jobs <n>', 'worker threads', integer(1), availableParallelism())
    .action(async (o: { split: Split; count: number; out: string; start: number; width: number; height: number; jobs: number }) => {
      const { frames, seconds } = await writeDataset(o);
      console.log(
        `wrote ${frames} frames to ${o.out} in ${seconds.toFixed(1)} s (${(frames / seconds).toFixed(0)} frames/s, ${o.jobs} jobs)`,
      );
    });
  program
    .command('bag')
    .description('write an MCAP camera bag and its labels file beside it')
    .requiredOption('--split <name>', 'train, val or test', splitName)
    .requiredOption('--count <n>', 'frames', integer(1))
    .requiredOption('--out <path>', 'the .mcap file')
    .option('--start <k>', "first seed's position in the split", integer(0), 0)
    .option('--width <px>', 'image width', integer(64), 640)
    .option('--height <px>', 'image height', integer(64), 360)
    .action(async (o: { split: Split; count: number; out: string; start: number; width: number; height: number }) => {
      const made = await writeScenesBag(o.out, o);
      console.log(`wrote ${made.path}: ${made.frames} frames, ${made.bytes} bytes; labels ${made.labels}`);
    });
  await program.parseAsync(argv);
}

if (!isMainThread && (workerData as WorkerJob | undefined)?.kind === 'percept-scenes') {
  const job = workerData as WorkerJob;
  // A failure rejects unhandled, which ends the worker with an 'error' event in the parent.
  void writeImages(job.seeds, job.dir, job.width, job.height, (seed, line) => parentPort!.postMessage({ seed, line }));
} else if (isMainThread && process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv).catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
