// Live view of a running graph over the Foxglove WebSocket protocol (`percept run --foxglove [URL]`).
// Foxglove (or Lichtblick) connects with Open connection → Foxglove WebSocket → ws://127.0.0.1:8765.
//
//   const server = await startFoxgloveServer({ port: 8765, graphs: [graph], events: graph.events, clock }); // before graph.run()
//   …
//   await server.close();
//
// Channels (JSON encoding, JSON Schema):
//   /percept/camera/compressed  foxglove.CompressedImage: each input frame; JPEG and PNG as they are, raw frames
//                               encoded to JPEG with sharp (off the event loop, one at a time, else skipped and counted)
//   /percept/annotations        foxglove.ImageAnnotations: the action's target bbox in pixels (a LINE_LOOP) and a text
//                               with its label and action, stamped with the frame's stamp so Foxglove pairs it with the image
//   /percept/actions            each action as published, with its frame id
//   /percept/stats              per-stage and end-to-end latency, frames and drops, from each stats event
//   /percept/events             every other telemetry event (frame, span, drop, cancel, degrade, error, note, output, source, control)
//
// It never slows the graph: nothing is built for a channel nobody subscribed to, sending is fire-and-forget,
// and each client's send buffer is bounded. Data for a client whose buffer is over the bound is dropped and
// counted, never queued. Loopback by default. Docs: docs/live-view.md
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import wsProtocol from '@foxglove/ws-protocol';
import type { FoxgloveServer as FoxgloveServerType, IWebSocket } from '@foxglove/ws-protocol';
import { CompressedImage, ImageAnnotations } from '@foxglove/schemas/jsonschema.js';
import type { Observable, Subscription } from 'rxjs';
import type { Clock } from '../../pipeline/clock.ts';
import { eventToJson, type TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import type { Envelope } from '../../pipeline/types.ts';
import type { ActionMessage, CameraFrame } from '../../nodes/payloads.ts';

export const DEFAULT_FOXGLOVE_URL = 'ws://127.0.0.1:8765';
/** Default bound on the bytes waiting to go out to one client. */
export const DEFAULT_MAX_BUFFERED_BYTES = 8 * 1024 * 1024;

/** Frames remembered for their actions' annotations at most. */
const MAX_FRAMES_TRACKED = 1024;

export const FOXGLOVE_TOPICS = {
  image: '/percept/camera/compressed',
  annotations: '/percept/annotations',
  actions: '/percept/actions',
  stats: '/percept/stats',
  events: '/percept/events',
} as const;

/** What the server taps of one graph (Graph's inputs and outputs). */
export interface FoxgloveGraphTaps {
  /** Each frame as it entered the graph: payloads are CameraFrames. */
  readonly inputs?: Observable<Envelope<unknown>>;
  /** Each frame's output: payloads are ActionMessages. */
  readonly outputs?: Observable<Envelope<unknown>>;
}

export interface FoxgloveServerOptions {
  /** ws://HOST:PORT. Alternative to host and port. */
  readonly url?: string;
  /** Default 127.0.0.1: loopback only. */
  readonly host?: string;
  /** 0 picks a free port (see FoxgloveLiveServer.port). Default 8765. */
  readonly port?: number;
  /** The graphs whose frames and actions are shown. Subscribed at once, so start before the run. */
  readonly graphs: readonly FoxgloveGraphTaps[];
  /** The run's telemetry (graph.events or a GraphGroup's events). */
  readonly events: Observable<TelemetryEvent>;
  /** The run's clock: frame stamps default to the capture time on its Unix time line. */
  readonly clock: Clock;
  /** Per client: above this many bytes waiting to be sent, its messages are dropped (default 8 MiB). */
  readonly maxBufferedBytes?: number;
  /** JPEG quality for raw frames (default 80). */
  readonly jpegQuality?: number;
}

export interface FoxgloveStats {
  readonly clients: number;
  /** Channels with at least one subscriber. */
  readonly subscribedChannels: number;
  /** Messages handed to a client's socket. */
  readonly sent: number;
  /** Messages not sent to a client because its send buffer was full (a slow client). */
  readonly dropped: number;
  /** Frames not shown, by reason (encoder_busy, unsupported_encoding, encode_failed). */
  readonly skipped: Readonly<Record<string, number>>;
}

export interface FoxgloveLiveServer {
  /** ws://HOST:PORT as bound. */
  readonly url: string;
  readonly port: number;
  stats(): FoxgloveStats;
  /** Stops taps and closes every connection. Idempotent. */
  close(): Promise<void>;
}

/** The part of ws's WebSocket this file uses (ws ships no types). */
interface WsSocket extends IWebSocket {
  readonly bufferedAmount: number;
  readonly readyState: number;
  terminate(): void;
}
interface WsServer {
  on(event: 'connection', listener: (socket: WsSocket, req: { socket: { remoteAddress?: string; remotePort?: number } }) => void): void;
  on(event: 'listening', listener: () => void): void;
  on(event: 'error', listener: (err: Error) => void): void;
  off(event: 'error', listener: (err: Error) => void): void;
  address(): AddressInfo | string | null;
  readonly clients: Set<WsSocket>;
  close(callback?: (err?: Error) => void): void;
}
interface WsModule {
  WebSocketServer: new (options: {
    host: string;
    port: number;
    handleProtocols: (protocols: Set<string>) => string | false;
    perMessageDeflate: false;
    maxPayload: number;
  }) => WsServer;
}

/** `ws://HOST:PORT`, `HOST:PORT` or `PORT` → host and port (host default 127.0.0.1). */
export function parseFoxgloveUrl(spec: string): { host: string; port: number } {
  const bare = spec.replace(/^ws:\/\//, '').replace(/\/$/, '');
  const match = /^(?:(\[[^\]]+\]|[^:/]+):)?(\d+)$/.exec(bare);
  const port = match ? Number(match[2]) : NaN;
  if (!match || /^wss:/.test(spec) || !(port >= 0 && port <= 65535))
    throw new Error(`--foxglove ${spec}: expected ws://HOST:PORT, HOST:PORT or PORT, e.g. ${DEFAULT_FOXGLOVE_URL}`);
  return { host: (match[1] ?? '127.0.0.1').replace(/^\[|\]$/g, ''), port };
}

const time = (ns: bigint): { sec: number; nsec: number } => ({ sec: Number(ns / 1_000_000_000n), nsec: Number(ns % 1_000_000_000n) });
const json = (value: unknown): Uint8Array =>
  Buffer.from(JSON.stringify(value, (_key, v: unknown) => (typeof v === 'bigint' ? v.toString() : v)));

const ACTIONS_SCHEMA = {
  title: 'percept.Action',
  description: 'A validated action and the frame it is for',
  type: 'object',
  properties: {
    timestamp: { type: 'object', properties: { sec: { type: 'integer' }, nsec: { type: 'integer' } } },
    frame_id: { type: 'integer' },
    source_id: { type: 'string' },
    schema_id: { type: 'string' },
    capture_wall_ms: { type: 'number' },
    action: { type: 'object' },
  },
};
const STATS_SCHEMA = {
  title: 'percept.Stats',
  description: 'Per-stage and end-to-end latency (ms), frames and drops of the run so far',
  type: 'object',
  properties: {
    timestamp: { type: 'object', properties: { sec: { type: 'integer' }, nsec: { type: 'integer' } } },
    stages: { type: 'object' },
    end_to_end: { type: 'object' },
    frames: { type: 'object' },
    drops: { type: 'object' },
    degrade_level: { type: 'integer' },
  },
};
const EVENTS_SCHEMA = {
  title: 'percept.Event',
  description: 'One telemetry event of the graph (bigints as decimal strings)',
  type: 'object',
  properties: { type: { type: 'string' }, atNs: { type: 'string' }, frameId: { type: 'integer' } },
};

/** The pixel size of a JPEG from its SOF marker, or undefined. */
export function jpegSize(data: Uint8Array): { width: number; height: number } | undefined {
  if (data[0] !== 0xff || data[1] !== 0xd8) return undefined;
  let i = 2;
  while (i + 9 < data.length) {
    if (data[i] !== 0xff) return undefined;
    const marker = data[i + 1]!;
    if (marker === 0xff) {
      i += 1;
      continue;
    }
    const length = (data[i + 2]! << 8) | data[i + 3]!;
    // SOF0..SOF15 but DHT (C4), JPG (C8) and DAC (CC).
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc)
      return { height: (data[i + 5]! << 8) | data[i + 6]!, width: (data[i + 7]! << 8) | data[i + 8]! };
    i += 2 + length;
  }
  return undefined;
}

/** The pixel size of a PNG from its IHDR, or undefined. */
function pngSize(data: Uint8Array): { width: number; height: number } | undefined {
  if (data.length < 24 || data[0] !== 0x89 || data[1] !== 0x50) return undefined;
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  return { width: view.getUint32(16), height: view.getUint32(20) };
}

function frameSize(frame: CameraFrame): { width: number; height: number } | undefined {
  if (frame.width && frame.height) return { width: frame.width, height: frame.height };
  if (frame.encoding === 'jpeg') return jpegSize(frame.data);
  if (frame.encoding === 'png') return pngSize(frame.data);
  return undefined;
}

const RAW_CHANNELS: Partial<Record<CameraFrame['encoding'], 1 | 3 | 4>> = { rgb8: 3, bgr8: 3, rgba8: 4, bgra8: 4, mono8: 1 };

/** Starts the live view; resolves once it listens. Subscribes to the taps and events at once. */
export async function startFoxgloveServer(options: FoxgloveServerOptions): Promise<FoxgloveLiveServer> {
  const parsed = options.url !== undefined ? parseFoxgloveUrl(options.url) : undefined;
  const host = parsed?.host ?? options.host ?? '127.0.0.1';
  const port = parsed?.port ?? options.port ?? 8765;
  const view = new LiveView(options);
  await view.listen(host, port);
  view.tap(options);
  return view;
}

type FrameSize = { width: number; height: number } | undefined;

/** The server, its channels and the graph's taps; each tap only builds messages someone subscribed to. */
class LiveView implements FoxgloveLiveServer {
  readonly #server: FoxgloveServerType;
  readonly #channels: Record<'image' | 'annotations' | 'actions' | 'stats' | 'events', number>;
  readonly #clock: Clock;
  readonly #maxBuffered: number;
  readonly #quality: number;
  /** Channels someone listens to: nothing is built for the others. */
  readonly #subscribed = new Set<number>();
  /** Frames in the graph: their stamp and pixel size, for the annotations of their actions. */
  readonly #frames = new Map<number, { stampNs: bigint; size: FrameSize }>();
  readonly #skipped: Record<string, number> = {};
  readonly #subscriptions: Subscription[] = [];
  #wss: WsServer | undefined;
  #sent = 0;
  #dropped = 0;
  #encoding = false;
  #closing: Promise<void> | undefined;

  constructor(options: FoxgloveServerOptions) {
    this.#clock = options.clock;
    this.#maxBuffered = options.maxBufferedBytes ?? DEFAULT_MAX_BUFFERED_BYTES;
    this.#quality = options.jpegQuality ?? 80;
    const server: FoxgloveServerType = new wsProtocol.FoxgloveServer({
      name: 'percept',
      capabilities: [],
      metadata: { topics: Object.values(FOXGLOVE_TOPICS).join(',') },
    });
    const channel = (topic: string, schemaName: string, schema: object): number =>
      server.addChannel({ topic, encoding: 'json', schemaName, schemaEncoding: 'jsonschema', schema: JSON.stringify(schema) });
    this.#channels = {
      image: channel(FOXGLOVE_TOPICS.image, 'foxglove.CompressedImage', CompressedImage),
      annotations: channel(FOXGLOVE_TOPICS.annotations, 'foxglove.ImageAnnotations', ImageAnnotations),
      actions: channel(FOXGLOVE_TOPICS.actions, 'percept.Action', ACTIONS_SCHEMA),
      stats: channel(FOXGLOVE_TOPICS.stats, 'percept.Stats', STATS_SCHEMA),
      events: channel(FOXGLOVE_TOPICS.events, 'percept.Event', EVENTS_SCHEMA),
    };
    server.on('subscribe', (id) => this.#subscribed.add(id));
    server.on('unsubscribe', (id) => this.#subscribed.delete(id));
    server.on('error', () => undefined); // a bad client message: the protocol library has answered it
    this.#server = server;
  }

  get url(): string {
    const address = this.#wss!.address() as AddressInfo;
    return `ws://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`;
  }

  get port(): number {
    return (this.#wss!.address() as AddressInfo).port;
  }

  stats(): FoxgloveStats {
    const clients = this.#wss?.clients.size ?? 0;
    return { clients, subscribedChannels: this.#subscribed.size, sent: this.#sent, dropped: this.#dropped, skipped: { ...this.#skipped } };
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      for (const s of this.#subscriptions) s.unsubscribe();
      this.#frames.clear();
      const wss = this.#wss;
      if (!wss) return;
      for (const client of wss.clients) client.terminate();
      await new Promise<void>((resolve) => wss.close(() => resolve()));
    })();
    return this.#closing;
  }

  /** Binds the WebSocket server; a busy or bad address fails with it named. */
  async listen(host: string, port: number): Promise<void> {
    const require = createRequire(import.meta.url);
    const { WebSocketServer } = require('ws') as WsModule;
    const wss = new WebSocketServer({
      host,
      port,
      handleProtocols: (protocols) => this.#server.handleProtocols(protocols),
      perMessageDeflate: false,
      maxPayload: 1024 * 1024,
    });
    await new Promise<void>((resolve, reject) => {
      const onError = (err: Error): void => reject(new Error(`foxglove: cannot listen on ${host}:${port}: ${err.message}`, { cause: err }));
      wss.on('error', onError);
      wss.on('listening', () => {
        wss.off('error', onError);
        resolve();
      });
    }).catch(async (err: Error) => {
      await new Promise<void>((resolve) => wss.close(() => resolve()));
      throw err;
    });
    wss.on('error', () => undefined);
    wss.on('connection', (socket, req) => this.#connect(socket, `${req.socket.remoteAddress ?? '?'}:${req.socket.remotePort ?? '?'}`));
    this.#wss = wss;
  }

  /** A client: message data (binary) for one that is behind is dropped and counted; control messages (text) always go. */
  #connect(socket: WsSocket, name: string): void {
    const send = socket.send.bind(socket);
    socket.send = (data, opts) => {
      if (typeof data !== 'string') {
        if (socket.bufferedAmount > this.#maxBuffered || socket.readyState !== 1) {
          this.#dropped += 1;
          return;
        }
        this.#sent += 1;
      }
      send(data, opts);
    };
    this.#server.handleConnection(socket, name);
  }

  /** Subscribes to the graphs' inputs and outputs and to the run's events. */
  tap(options: FoxgloveServerOptions): void {
    for (const graph of options.graphs) {
      if (graph.inputs) this.#subscriptions.push(graph.inputs.subscribe((env) => this.#onInput(env)));
      if (graph.outputs) this.#subscriptions.push(graph.outputs.subscribe((env) => this.#onOutput(env)));
    }
    this.#subscriptions.push(options.events.subscribe((event) => this.#onEvent(event)));
  }

  #publish(channel: number, stampNs: bigint, payload: Uint8Array): void {
    if (this.#subscribed.has(channel)) this.#server.sendMessage(channel, stampNs, payload);
  }

  #skip(reason: string): void {
    this.#skipped[reason] = (this.#skipped[reason] ?? 0) + 1;
  }

  #onInput(env: Envelope<unknown>): void {
    const stampNs = env.stampNs ?? this.#clock.unixNs(env.captureNs);
    if (this.#subscribed.has(this.#channels.annotations)) {
      this.#frames.set(env.frameId, { stampNs, size: frameSize(env.payload as CameraFrame) });
      // Frames the graph never ends (none should) cannot pile up.
      if (this.#frames.size > MAX_FRAMES_TRACKED) this.#frames.delete(this.#frames.keys().next().value!);
    }
    if (this.#subscribed.has(this.#channels.image)) this.#showFrame(env, stampNs);
  }

  #showFrame(env: Envelope<unknown>, stampNs: bigint): void {
    const frame = env.payload as CameraFrame;
    const message = (data: Uint8Array, format: string): Uint8Array =>
      json({ timestamp: time(stampNs), frame_id: env.sourceId, format, data: Buffer.from(data).toString('base64') });
    if (frame.encoding === 'jpeg' || frame.encoding === 'png') {
      this.#publish(this.#channels.image, stampNs, message(frame.data, frame.encoding));
      return;
    }
    const channelsIn = RAW_CHANNELS[frame.encoding];
    const rowBytes = (frame.width ?? 0) * (channelsIn ?? 0);
    if (!channelsIn || !frame.width || !frame.height || (frame.stride !== undefined && frame.stride !== rowBytes)) {
      this.#skip('unsupported_encoding');
      return;
    }
    if (this.#encoding) {
      this.#skip('encoder_busy');
      return;
    }
    this.#encoding = true;
    // sharp encodes on libuv's thread pool: the event loop only hands it the pixels.
    void encodeJpeg(frame, channelsIn, this.#quality)
      .then((jpeg) => this.#publish(this.#channels.image, stampNs, message(jpeg, 'jpeg')))
      .catch(() => this.#skip('encode_failed'))
      .finally(() => {
        this.#encoding = false;
      });
  }

  #onOutput(env: Envelope<unknown>): void {
    const message = env.payload as ActionMessage;
    const seen = this.#frames.get(env.frameId);
    this.#frames.delete(env.frameId);
    const stampNs = seen?.stampNs ?? env.stampNs ?? this.#clock.unixNs(env.captureNs);
    if (this.#subscribed.has(this.#channels.actions)) {
      const action = {
        timestamp: time(stampNs),
        frame_id: env.frameId,
        source_id: env.sourceId,
        schema_id: message.schemaId,
        capture_wall_ms: message.captureWallMs,
        action: message.action,
      };
      this.#publish(this.#channels.actions, stampNs, json(action));
    }
    if (this.#subscribed.has(this.#channels.annotations)) {
      const annotations = annotate(message.action, seen?.size, stampNs);
      if (annotations) this.#publish(this.#channels.annotations, stampNs, json(annotations));
    }
  }

  #onEvent(event: TelemetryEvent): void {
    const atNs = this.#clock.unixNs(event.atNs);
    if (event.type === 'drop') this.#frames.delete(event.frameId);
    if (event.type !== 'stats') {
      if (this.#subscribed.has(this.#channels.events)) this.#publish(this.#channels.events, atNs, Buffer.from(eventToJson(event)));
      return;
    }
    if (!this.#subscribed.has(this.#channels.stats)) return;
    const { summary } = event;
    const stats = {
      timestamp: time(atNs),
      stages: summary.stages,
      end_to_end: summary.endToEnd,
      frames: summary.frames,
      drops: summary.drops.byReason,
      degrade_level: summary.degrade.level,
      live_view: { sent: this.#sent, dropped: this.#dropped, skipped: this.#skipped },
    };
    this.#publish(this.#channels.stats, atNs, json(stats));
  }
}

async function encodeJpeg(frame: CameraFrame, channels: 1 | 3 | 4, quality: number): Promise<Buffer> {
  const { default: sharp } = await import('sharp');
  let image = sharp(frame.data, { raw: { width: frame.width!, height: frame.height!, channels } });
  if (channels === 4) image = image.removeAlpha();
  if (frame.encoding === 'bgr8' || frame.encoding === 'bgra8')
    image = image.recomb([
      [0, 0, 1],
      [0, 1, 0],
      [1, 0, 0],
    ]);
  return image.jpeg({ quality }).toBuffer();
}

const BOX_COLOR = { r: 0.1, g: 1, b: 0.2, a: 1 };

/** foxglove.ImageAnnotations for an action: its target's bbox ([x0, y0, x1, y1] in 0..1) in pixels as a LINE_LOOP,
 * and a text with the label and action at its top-left corner (top-left of the image without a bbox).
 * Undefined when the action has no target or the frame's size is unknown. */
export function annotate(action: unknown, size: { width: number; height: number } | undefined, stampNs: bigint): object | undefined {
  const a = (action ?? {}) as { action?: unknown; confidence?: unknown; target?: { label?: unknown; bbox?: unknown } };
  const target = a.target;
  if (!size || !target || typeof target !== 'object') return undefined;
  const timestamp = time(stampNs);
  const bbox =
    Array.isArray(target.bbox) && target.bbox.length === 4 && target.bbox.every((v) => typeof v === 'number')
      ? (target.bbox as number[])
      : undefined;
  const points = bbox
    ? [
        {
          timestamp,
          type: 2, // LINE_LOOP
          points: [
            { x: bbox[0]! * size.width, y: bbox[1]! * size.height },
            { x: bbox[2]! * size.width, y: bbox[1]! * size.height },
            { x: bbox[2]! * size.width, y: bbox[3]! * size.height },
            { x: bbox[0]! * size.width, y: bbox[3]! * size.height },
          ],
          outline_color: BOX_COLOR,
          outline_colors: [],
          fill_color: { r: 0, g: 0, b: 0, a: 0 },
          thickness: Math.max(2, Math.round(size.height / 240)),
        },
      ]
    : [];
  const words = [String(target.label ?? ''), typeof a.action === 'string' ? a.action : ''].filter(Boolean).join(' · ');
  const confidence = typeof a.confidence === 'number' ? ` ${a.confidence.toFixed(2)}` : '';
  const fontSize = Math.max(12, Math.round(size.height / 30));
  return {
    circles: [],
    points,
    texts: [
      {
        timestamp,
        position: bbox ? { x: bbox[0]! * size.width, y: Math.max(fontSize, bbox[1]! * size.height - 4) } : { x: 4, y: fontSize + 4 },
        text: `${words}${confidence}`,
        font_size: fontSize,
        text_color: { r: 1, g: 1, b: 1, a: 1 },
        background_color: { r: 0, g: 0, b: 0, a: 0.6 },
      },
    ],
  };
}
