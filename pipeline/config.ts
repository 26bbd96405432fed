// Loads a percept config: JSON, then ajv against configs/percept.schema.json, then semantic checks.
// The result is a fully defaulted PerceptConfig; an invalid config throws a ConfigError listing every problem.
//
//   const config = loadConfig('configs/default.json');   // or loadConfig({ clock: 'virtual', ... })
//
// The TS types below mirror the schema, which owns defaults and limits (test/pipeline/config.test.ts).
// Errors and paths: pipeline/README.md#config
import { readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv, type ErrorObject } from 'ajv';
import { insecureEndpointProblem, parseEndpoint } from './endpoint.ts';
import { costsPerLevel, isDistribution, type StageServiceCosts } from './service-time.ts';
import type { Knobs } from './types.ts';

export type SourceConfig =
  | { readonly kind: 'pattern'; readonly fps: number; readonly frames: number; readonly width: number; readonly height: number }
  | {
      readonly kind: 'bag';
      readonly path: string;
      readonly topic?: string;
      readonly type?: string;
      readonly pace: 'recorded' | 'fast';
      readonly rate: number;
      readonly loop: boolean;
    }
  | { readonly kind: 'folder'; readonly path: string; readonly fps: number }
  | FfmpegSourceConfig
  | ZmqSourceConfig
  | Ros2SourceConfig;

/** A ROS 2 image topic over DDS; its domain is PerceptConfig.ros2's. */
export interface Ros2SourceConfig {
  readonly kind: 'ros2';
  readonly topic: string;
  readonly type: 'sensor_msgs/msg/CompressedImage' | 'sensor_msgs/msg/Image';
  readonly reliability: 'best_effort' | 'reliable';
  readonly depth: number;
}

/** One published ROS 2 topic's QoS (volatile, keep last `depth`). */
export interface Ros2QosConfig {
  readonly reliability: 'reliable' | 'best_effort';
  readonly depth: number;
}

/** ROS 2 over DDS: the publisher beside the ZeroMQ one, and the domain of a ros2 source. */
export interface Ros2Config {
  readonly publish: boolean;
  readonly domainId: number;
  /** Cyclone DDS XML or file:// URI; '' : CYCLONEDDS_URI when set, else loopback only. */
  readonly cyclonedds: string;
  readonly topics: { readonly actions: string; readonly detections: string; readonly diagnostics: string };
  readonly qos: { readonly actions: Ros2QosConfig; readonly detections: Ros2QosConfig; readonly diagnostics: Ros2QosConfig };
}

export interface FfmpegSourceConfig {
  readonly kind: 'ffmpeg';
  readonly url: string;
  readonly inputFormat: string | null;
  readonly inputOptions: readonly string[];
  readonly fps: number;
  readonly width: number;
  readonly height: number;
  readonly realtime: boolean;
  readonly restart: 'on-failure' | 'always' | 'never';
  readonly maxRestarts: number;
  readonly backoffMs: number;
  readonly maxBackoffMs: number;
  readonly ffmpegPath: string;
}

export interface ZmqSourceConfig {
  readonly kind: 'zmq';
  readonly endpoint: string;
  readonly socket: 'pull' | 'sub';
  readonly bind: boolean;
  readonly topic: string;
  readonly receiveHighWaterMark: number;
  /** Null: preprocess.maxPixels × 4 + 64 KiB (see maxMessageBytesFor). */
  readonly maxMessageBytes: number | null;
  readonly curve: CurveConfig | null;
  readonly insecure: boolean;
}

/** A message part's byte limit for a zmq source: its own, else the largest frame preprocessing takes. */
export function maxMessageBytesFor(source: ZmqSourceConfig, maxPixels: number): number {
  return source.maxMessageBytes ?? maxPixels * 4 + 64 * 1024;
}

/** CURVE keys, as paths of files holding Z85 text.
 * A bound socket names its secret key; a connecting socket names its server's public key. */
export interface CurveConfig {
  readonly secretKeyFile?: string;
  readonly serverKeyFile?: string;
}

export type EncoderConfig =
  | { readonly kind: 'onnx'; readonly model: string; readonly executionProvider: 'cpu' | 'cuda' | 'tensorrt'; readonly threads: number }
  | { readonly kind: 'mtmd'; readonly mmproj: string; readonly gpuLayers: number }
  | { readonly kind: 'projection'; readonly seed: number; readonly tokens: number };

export interface DecoderConfig {
  /** local: the in-process binding after the vision encoder; openai: a remote /v1/chat/completions server. */
  readonly kind: 'local' | 'openai';
  /** local: a GGUF path or synth: preset; openai: the model id the server serves. */
  readonly model: string;
  /** openai: the server's base URL. */
  readonly endpoint: string | null;
  /** openai: the environment variable that holds the bearer key. */
  readonly apiKey: { readonly env: string } | null;
  /** openai: requests in flight at most. */
  readonly concurrency: number;
  /** openai: one attempt's limit (ms); null: the stage deadline only. */
  readonly timeoutMs: number | null;
  /** openai: attempts after the first, for retryable failures while the deadline allows. */
  readonly retries: number;
  readonly draft: string | null;
  readonly draftMtp: string | null;
  readonly ngram: boolean;
  /** local: the longest draft per speculative step (null: the binding's DRAFT_MAX). */
  readonly draftMax: number | null;
  /** local: the KV cache's element type. */
  readonly kvType: 'f16' | 'q8_0';
  /** local: llama.cpp's CPU threads (null: every core). */
  readonly threads: number | null;
  /** local: tokens per camera and decode step, padded (1: no padding). */
  readonly stepTokens: number;
  /** local: built decode graphs kept besides the current one (null: the binding's default, DEFAULT_GRAPH_SLOTS). */
  readonly graphSlots: number | null;
  /** local, CUDA: decode steps as CUDA graphs, one per step shape (null: on). */
  readonly cudaGraphs: boolean | null;
  /** local: a causal Gemma 4 image and the prompt text after it in one decode (null: the binding's default, on). */
  readonly mixedPrefill: boolean | null;
  /** local: Gemma 4's per-layer embedding table on the GPU (null: when every layer is offloaded). */
  readonly perLayerEmbeddingsOnGpu: boolean | null;
  readonly gpuLayers: number;
  readonly nCtx: number;
  readonly systemPrompt: string;
  readonly instruction: string;
  /** null: the action grammar's worst case (the decoder resolves it at load). */
  readonly maxNewTokens: number | null;
  readonly temperature: number;
  readonly seed: number;
  readonly jumpForward: boolean;
}

export interface PublisherConfig {
  readonly endpoint: string;
  readonly topic: string;
  readonly sendHighWaterMark: number;
  /** Per topic: the capacity of percept's own queue in front of the socket. */
  readonly highWaterMarks: { readonly actions: number; readonly events: number; readonly telemetry: number };
  readonly lingerMs: number;
  /** How long a subscriber whose queue is full may hold the socket back before it stops waiting for it; null: for ever. */
  readonly stallTimeoutMs: number | null;
  readonly curve: CurveConfig | null;
  readonly insecure: boolean;
}

export interface ControlConfig {
  readonly enabled: boolean;
  readonly endpoint: string;
  readonly curve: CurveConfig | null;
  readonly insecure: boolean;
}

export type EdgePolicy = { readonly policy: 'latest' } | { readonly policy: 'queue'; readonly capacity: number };

export interface BudgetsConfig {
  readonly endToEndMs: number;
  /** Stage name → budget (ms). Entries for stages the graph does not have are ignored. */
  readonly stages: Readonly<Record<string, number>>;
  readonly dropPredictedMiss: boolean;
  readonly dropPredictedConflation: boolean;
  readonly shutdownGraceMs: number;
}

export interface LadderConfig {
  readonly enabled: boolean;
  readonly initial: Knobs;
  readonly rungs: readonly Partial<Knobs>[];
  readonly headroom: number;
  readonly upBelow: number;
  readonly upAfter: number;
  readonly quantile: number;
  readonly window: number;
  readonly minSamples: number;
  readonly ewmaAlpha: number;
}

export interface MetricsConfig {
  /** "[HOST:]PORT" to serve /metrics, /healthz and /readyz on (host default 127.0.0.1); null: off. */
  readonly endpoint: string | null;
}

/** Where a metrics endpoint "[HOST:]PORT" listens: the host defaults to loopback, an IPv6 host may be in brackets.
 * null when the text is not of that form or the port is not 0–65535. */
export function parseMetricsEndpoint(spec: string): { readonly host: string; readonly port: number } | null {
  const match = /^(?:(.+):)?(\d{1,5})$/.exec(spec);
  if (!match || Number(match[2]) > 65535) return null;
  const host = match[1] ?? '127.0.0.1';
  return { host: /^\[.+\]$/.test(host) ? host.slice(1, -1) : host, port: Number(match[2]) };
}

export interface TelemetryConfig {
  readonly liveTable: 'auto' | 'on' | 'off';
  readonly intervalMs: number;
}

/** One camera of a multi-camera config: its source, and its own budgets, edges and ladder.
 * Each of those is the top-level section with the camera's fields on top. */
export interface CameraConfig {
  readonly id: string;
  readonly source: SourceConfig;
  readonly budgets: BudgetsConfig;
  readonly edges: PerceptConfig['edges'];
  readonly ladder: LadderConfig;
}

/** How the engines several cameras share batch their work. */
export interface BatchingConfig {
  readonly encodeWaitMs: number;
  /** null: every camera. */
  readonly decodeMaxActive: number | null;
  /** together: a group of arrivals at a time (native/README.md#admitting-together); rolling: together, and the group's tail
   * takes the next one in; adaptive: together, and the tail takes them in when predicted to pay; each: one at a time. */
  readonly admit: 'together' | 'rolling' | 'adaptive' | 'each';
  /** Admitting together: how long an idle decoder holds a group for frames still on their way. */
  readonly groupWaitMs: number;
  /** Admitting together: a frame that would miss waiting for the running group's end joins it at once (else it is dropped). */
  readonly joinRunning: boolean;
  /** Admitting rolling: the fewest waiting frames that go in beside a running group's tail. */
  readonly rollingJoin: number;
  readonly prefillChunk: number;
  /** Contexts the cameras are spread over on the one model (camera i on lane i % lanes). */
  readonly lanes: number;
  /** One KV buffer: every token decode has a row per camera, its rows padded to a multiple of this (0: off). */
  readonly stepRows: number;
  readonly kvUnified: boolean;
  /** A step's causal image rows and its token rows in one decode (kvUnified, no stepRows). */
  readonly mixSteps: boolean;
}

export interface PerceptConfig {
  readonly source: SourceConfig;
  /** Several cameras on shared engines, and `source` is then unused. Absent: `source` is the one camera. */
  readonly cameras?: readonly CameraConfig[];
  readonly batching: BatchingConfig;
  readonly preprocess: {
    readonly maxPixels: number;
    readonly threads: number;
    /** auto: JPEG frames are decoded on the encoder's GPU (nvJPEG) where it can. host: always by libvips here. */
    readonly jpegDecode: 'auto' | 'host';
  };
  readonly encoder: EncoderConfig;
  readonly decoder: DecoderConfig;
  readonly actions: { readonly schema: string };
  readonly publisher: PublisherConfig;
  readonly control: ControlConfig;
  readonly recorder: {
    readonly enabled: boolean;
    readonly path: string;
    readonly frames: boolean;
    readonly chunkMs: number;
    /** '' Foxglove JSON (percept eval reads it); 'ros2' the MCAP ros2 profile (rosbag2 plays it). */
    readonly profile: '' | 'ros2';
    /** A failed write: stop the run (exit 1, saying why) or carry on unrecorded. Either way an error event and the summary say so. */
    readonly onError: 'stop' | 'continue';
  };
  readonly budgets: BudgetsConfig;
  /** `default` plus optional per-stage entries. */
  readonly edges: Readonly<Record<string, EdgePolicy>> & { readonly default: EdgePolicy };
  readonly ladder: LadderConfig;
  readonly clock: 'real' | 'virtual';
  /** Virtual clock only: the next frame enters when the previous one has ended (every frame is processed). */
  readonly lockstep: boolean;
  /** Stage name → service time charged on a virtual clock: one cost, or one per ladder level; a cost is
   * fixed ms or a distribution sampled per call. A calibration file named in the config file is read into this. */
  readonly virtualServiceMs: Readonly<Record<string, StageServiceCosts>>;
  /** Seeds the draws from virtualServiceMs distributions: same seed, same replay. */
  readonly virtualServiceSeed: number;
  readonly telemetry: TelemetryConfig;
  readonly metrics: MetricsConfig;
  readonly ros2: Ros2Config;
}

/** The part of the config the graph runtime reads. */
export type GraphConfig = Pick<
  PerceptConfig,
  'budgets' | 'edges' | 'ladder' | 'clock' | 'lockstep' | 'virtualServiceMs' | 'virtualServiceSeed' | 'telemetry'
>;

export interface ConfigIssue {
  /** JSON pointer into the config ('' is the whole document). */
  readonly path: string;
  readonly message: string;
}

/** An invalid config: every problem found, each naming its JSON path. */
export class ConfigError extends Error {
  readonly origin: string;
  readonly issues: readonly ConfigIssue[];
  constructor(origin: string, issues: readonly ConfigIssue[]) {
    super(`invalid config ${origin}:\n${issues.map((i) => `  ${i.path || '/'}: ${i.message}`).join('\n')}`);
    this.name = 'ConfigError';
    this.origin = origin;
    this.issues = issues;
  }
}

const CONFIG_SCHEMA_PATH = new URL('../configs/percept.schema.json', import.meta.url);
/** What the schema's default paths are relative to: the folder that holds configs/. */
const DEFAULTS_BASE = fileURLToPath(new URL('..', import.meta.url));

/** The config fields that name files (their keys from the root). */
export const PATH_FIELDS: readonly (readonly string[])[] = [
  ['source', 'path'],
  ['source', 'url'],
  ['source', 'curve', 'secretKeyFile'],
  ['source', 'curve', 'serverKeyFile'],
  ['publisher', 'curve', 'secretKeyFile'],
  ['control', 'curve', 'secretKeyFile'],
  ['encoder', 'model'],
  ['encoder', 'mmproj'],
  ['decoder', 'model'],
  ['decoder', 'draft'],
  ['decoder', 'draftMtp'],
  ['actions', 'schema'],
  ['recorder', 'path'],
];

/** Reads, validates and defaults a config. `input` is a file path or an already-parsed object
 * (which is not modified). Throws ConfigError naming every problem; nothing is half-applied. */
export function loadConfig(input: string | object): PerceptConfig {
  const origin = typeof input === 'string' ? input : '<object>';
  let data: unknown;
  if (typeof input === 'string') {
    let text: string;
    try {
      text = readFileSync(input, 'utf8');
    } catch (err) {
      throw new ConfigError(origin, [{ path: '', message: `cannot read the file (${(err as Error).message})` }]);
    }
    try {
      data = JSON.parse(text);
    } catch (err) {
      throw new ConfigError(origin, [{ path: '', message: `is not valid JSON (${(err as Error).message})` }]);
    }
  } else if (input !== null && typeof input === 'object' && !Array.isArray(input)) {
    data = structuredClone(input);
  } else {
    throw new TypeError(
      `loadConfig: expected a file path or a config object but received ${input === null ? 'null' : Array.isArray(input) ? 'an array' : typeof input}`,
    );
  }

  // A remote decoder's model is the id a server serves, not a file.
  const remoteDecoder = isRecord(data) && isRecord(data.decoder) && data.decoder.kind === 'openai';
  const pathFields = remoteDecoder ? PATH_FIELDS.filter((f) => f.join('.') !== 'decoder.model') : PATH_FIELDS;
  const given = new Set(pathFields.filter((keys) => pathAt(data, keys) !== undefined));
  if (typeof input === 'string') resolvePaths(data, pathFields, dirname(resolve(input)));
  const cameraIssues = prepareCameras(data, typeof input === 'string' ? dirname(resolve(input)) : undefined);
  if (cameraIssues.length > 0) throw new ConfigError(origin, cameraIssues);
  const calibrationIssue = inlineCalibration(data, typeof input === 'string' ? dirname(resolve(input)) : process.cwd());
  if (calibrationIssue) throw new ConfigError(origin, [calibrationIssue]);
  const validate = compileSchema();
  if (!validate(data)) throw new ConfigError(origin, describeAjvErrors(validate.errors ?? []));
  const cameraSchemaIssues = validateCameras(data, validate);
  if (cameraSchemaIssues.length > 0) throw new ConfigError(origin, cameraSchemaIssues);
  resolvePaths(
    data,
    pathFields.filter((field) => !given.has(field)),
    DEFAULTS_BASE,
  );
  const config = data as PerceptConfig;
  const issues = checkSemantics(config);
  if (issues.length > 0) throw new ConfigError(origin, issues);
  return config;
}

/** The calibration file version `percept calibrate` writes: stage costs as distributions. */
export const CALIBRATION_VERSION = 2;

/** A `virtualServiceMs` that names a calibration file (`percept calibrate`) becomes the file's service times.
 * The schema then checks them like any others. */
function inlineCalibration(data: unknown, base: string): ConfigIssue | undefined {
  if (!isRecord(data) || typeof data.virtualServiceMs !== 'string' || data.virtualServiceMs === '') return undefined;
  const path = resolve(base, data.virtualServiceMs);
  let file: unknown;
  try {
    file = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    return { path: '/virtualServiceMs', message: `cannot read the calibration file ${path} (${(err as Error).message})` };
  }
  if (!isRecord(file) || file.kind !== 'percept.calibration' || !isRecord(file.virtualServiceMs)) {
    return { path: '/virtualServiceMs', message: `${path} is not a calibration file written by percept calibrate` };
  }
  // Version 1 kept medians only: they are read as fixed costs. Version 2 keeps distributions.
  if (file.version !== 1 && file.version !== CALIBRATION_VERSION) {
    return {
      path: '/virtualServiceMs',
      message: `${path} is a calibration file of version ${String(file.version)}; this percept reads versions 1 and ${CALIBRATION_VERSION}`,
    };
  }
  data.virtualServiceMs = file.virtualServiceMs;
  return adoptCalibrationLadder(data, file, path);
}

/** A config that names a calibration but sets no ladder rungs takes the ladder it was measured with.
 * Level 0 becomes `initial` unless set, and each next level's changed knobs become a rung. */
function adoptCalibrationLadder(data: Record<string, unknown>, file: Record<string, unknown>, path: string): ConfigIssue | undefined {
  const ladder = isRecord(data.ladder) ? data.ladder : {};
  const levels = file.levels;
  if ('rungs' in ladder || !Array.isArray(levels) || levels.length === 0 || !levels.every(isRecord)) return undefined;
  const rungs: Record<string, unknown>[] = [];
  for (let i = 1; i < levels.length; i++) {
    const rung = Object.fromEntries(Object.entries(levels[i]!).filter(([knob, value]) => levels[i - 1]![knob] !== value));
    if (Object.keys(rung).length === 0) {
      return { path: '/virtualServiceMs', message: `${path}: levels ${i - 1} and ${i} have the same knobs, so no ladder follows from it` };
    }
    rungs.push(rung);
  }
  data.ladder = { ...ladder, initial: ladder.initial ?? levels[0], rungs };
  return undefined;
}

/** The file path at data[keys[0]][keys[1]]…, if there is one.
 * A path is a non-empty string without a `scheme:`, such as synth:, rtsp:// or http://. */
function pathAt(data: unknown, keys: readonly string[]): string | undefined {
  const value = keys.reduce<unknown>((node, key) => (isRecord(node) ? node[key] : undefined), data);
  return typeof value === 'string' && value !== '' && !/^[a-z][a-z0-9+.-]*:/i.test(value) ? value : undefined;
}

function resolvePaths(data: unknown, fields: readonly (readonly string[])[], base: string): void {
  for (const keys of fields) {
    const path = pathAt(data, keys);
    if (path === undefined || isAbsolute(path)) continue;
    const parent = keys.slice(0, -1).reduce<unknown>((node, key) => (node as Record<string, unknown>)[key], data);
    (parent as Record<string, unknown>)[keys.at(-1)!] = resolve(base, path);
  }
}

const isRecord = (value: unknown): value is Record<string, unknown> => value !== null && typeof value === 'object' && !Array.isArray(value);

function compileSchema() {
  const schema = JSON.parse(readFileSync(CONFIG_SCHEMA_PATH, 'utf8')) as object;
  const ajv = new Ajv({ strict: true, allErrors: true, useDefaults: true, discriminator: true });
  return ajv.compile(schema);
}

function describeAjvErrors(errors: readonly ErrorObject[]): ConfigIssue[] {
  const issues = new Map<string, ConfigIssue>();
  for (const error of errors) {
    if (error.keyword === 'propertyNames') continue; // its inner errors name the key
    // A bad key yields several errors: the inner enum or anyOf, and propertyNames. Report the key once.
    const issue: ConfigIssue =
      error.propertyName !== undefined
        ? {
            path: `${error.instancePath}/${error.propertyName}`,
            message: `is not a known name here (expected ${error.instancePath === '/edges' ? '"default" or ' : ''}a stage name: preprocess, encode, decode, actions, publish, record)`,
          }
        : describeAjvError(error);
    issues.set(`${issue.path}\0${issue.message}`, issue);
  }
  return [...issues.values()];
}

/** One ajv error as `{path, message}` in words (also for the other JSON files percept validates). */
export function describeAjvError(error: ErrorObject): ConfigIssue {
  const params = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case 'additionalProperties':
      return { path: `${error.instancePath}/${String(params.additionalProperty)}`, message: 'is not a known property' };
    case 'enum':
      return {
        path: error.instancePath,
        message: `must be one of ${(params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`,
      };
    case 'const':
      return { path: error.instancePath, message: `must be ${JSON.stringify(params.allowedValue)}` };
    case 'discriminator':
      return params.error === 'mapping'
        ? {
            path: `${error.instancePath}/${String(params.tag)}`,
            message: `${JSON.stringify(params.tagValue)} is not one of the known kinds`,
          }
        : { path: `${error.instancePath}/${String(params.tag)}`, message: 'must be a string naming the kind' };
    default:
      return { path: error.instancePath, message: error.message ?? `fails ${error.keyword}` };
  }
}

/** Every endpoint has a real port: 1–65535, or * where a bind may pick one.
 * Nothing other hosts can reach goes without CURVE, unless the section says insecure: true. */
function checkEndpoints(config: PerceptConfig): ConfigIssue[] {
  const sockets: { section: string; endpoint: string; bind: boolean; curve: CurveConfig | null; insecure: boolean }[] = [
    { section: '/publisher', bind: true, ...config.publisher },
  ];
  if (config.control.enabled) sockets.push({ section: '/control', bind: true, ...config.control });
  if (config.source.kind === 'zmq') sockets.push({ section: '/source', ...config.source });
  const issues: ConfigIssue[] = [];
  for (const { section, endpoint, bind, curve, insecure } of sockets) {
    try {
      const parsed = parseEndpoint(endpoint, { bind });
      const problem = insecureEndpointProblem(parsed, endpoint, { bind, curve: curve != null, insecure });
      if (problem) issues.push({ path: `${section}/endpoint`, message: problem });
    } catch (err) {
      issues.push({ path: `${section}/endpoint`, message: (err as Error).message });
    }
    if (curve && bind && !curve.secretKeyFile)
      issues.push({ path: `${section}/curve/secretKeyFile`, message: "is required to bind with CURVE (the server's secret key)" });
    if (curve && !bind && !curve.serverKeyFile)
      issues.push({ path: `${section}/curve/serverKeyFile`, message: "is required to connect with CURVE (the server's public key)" });
  }
  return issues;
}

/** The decoder's kind-specific fields: each kind gets only its own.
 * A setting the other kind would silently ignore is refused. */
function checkDecoder(decoder: DecoderConfig): ConfigIssue[] {
  const issues: ConfigIssue[] = [];
  const only = (key: string, kind: string) => issues.push({ path: `/decoder/${key}`, message: `applies to decoder.kind "${kind}" only` });
  if (decoder.kind === 'openai') {
    if (decoder.endpoint === null) {
      issues.push({
        path: '/decoder/endpoint',
        message: 'is required with decoder.kind "openai" (the server\'s base URL, e.g. http://127.0.0.1:8080)',
      });
    } else if (!/^https?:\/\/[^/\s]+/i.test(decoder.endpoint)) {
      issues.push({ path: '/decoder/endpoint', message: `must be an http:// or https:// URL, got ${JSON.stringify(decoder.endpoint)}` });
    }
    if (decoder.model.startsWith('synth:'))
      issues.push({
        path: '/decoder/model',
        message: `with decoder.kind "openai" must be the model id the server serves (GET /v1/models lists it), not ${JSON.stringify(decoder.model)}`,
      });
    if (decoder.draft !== null) only('draft', 'local');
    if (decoder.draftMtp !== null) only('draftMtp', 'local');
    if (decoder.ngram) only('ngram', 'local');
    if (decoder.draftMax !== null) only('draftMax', 'local');
    if (decoder.kvType !== 'f16') only('kvType', 'local');
    if (decoder.threads !== null) only('threads', 'local');
    if (decoder.stepTokens !== 1) only('stepTokens', 'local');
    if (decoder.graphSlots !== null) only('graphSlots', 'local');
    if (decoder.cudaGraphs !== null) only('cudaGraphs', 'local');
    if (decoder.mixedPrefill !== null) only('mixedPrefill', 'local');
    if (decoder.perLayerEmbeddingsOnGpu !== null) only('perLayerEmbeddingsOnGpu', 'local');
  } else {
    if (decoder.endpoint !== null) only('endpoint', 'openai');
    if (decoder.apiKey !== null) only('apiKey', 'openai');
    if (decoder.timeoutMs !== null) only('timeoutMs', 'openai');
    if (decoder.concurrency !== 1)
      issues.push({ path: '/decoder/concurrency', message: 'must be 1 for decoder.kind "local" (it decodes one frame at a time)' });
  }
  return issues;
}

/** Checks the schema cannot express. Returns the problems found (empty when the config is sound). */
function checkSemantics(config: PerceptConfig): ConfigIssue[] {
  const issues: ConfigIssue[] = [...checkEndpoints(config), ...checkDecoder(config.decoder), ...checkCameras(config)];
  if ((config.source.kind === 'ffmpeg' || config.source.kind === 'zmq') && config.clock === 'virtual') {
    issues.push({ path: '/clock', message: `must be "real" for a live source (${config.source.kind}): its frames come in real time` });
  }
  const { budgets, ladder } = config;
  for (const [stage, ms] of Object.entries(budgets.stages)) {
    if (ms > budgets.endToEndMs) {
      issues.push({
        path: `/budgets/stages/${stage}`,
        message: `must be at most /budgets/endToEndMs (${budgets.endToEndMs}) but is ${ms}`,
      });
    }
  }
  // Each rung must make the frame cheaper in the knob it names, or the ladder would not be a ladder.
  let knobs: Knobs = ladder.initial;
  ladder.rungs.forEach((rung, index) => {
    const at = `/ladder/rungs/${index}`;
    if (rung.imageTokens !== undefined && rung.imageTokens >= knobs.imageTokens) {
      issues.push({
        path: `${at}/imageTokens`,
        message: `must be below the level above (${knobs.imageTokens}) but is ${rung.imageTokens}`,
      });
    }
    if (rung.maxNewTokens !== undefined && rung.maxNewTokens >= knobs.maxNewTokens) {
      issues.push({
        path: `${at}/maxNewTokens`,
        message: `must be below the level above (${knobs.maxNewTokens}) but is ${rung.maxNewTokens}`,
      });
    }
    if (rung.draft !== undefined && (rung.draft || !knobs.draft)) {
      issues.push({
        path: `${at}/draft`,
        message: knobs.draft ? 'can only turn drafting off (false)' : 'drafting is already off at the level above',
      });
    }
    if (rung.frameSkip !== undefined && rung.frameSkip <= knobs.frameSkip) {
      issues.push({ path: `${at}/frameSkip`, message: `must be above the level above (${knobs.frameSkip}) but is ${rung.frameSkip}` });
    }
    knobs = { ...knobs, ...rung };
  });
  const { endpoint } = config.metrics;
  if (endpoint !== null && !parseMetricsEndpoint(endpoint)) {
    issues.push({
      path: '/metrics/endpoint',
      message: `${JSON.stringify(endpoint)} is not [HOST:]PORT with a port 0–65535 (e.g. 9464 or 127.0.0.1:9464)`,
    });
  }
  if (config.lockstep && config.clock !== 'virtual') {
    issues.push({ path: '/lockstep', message: 'needs /clock "virtual" (lockstep replays on the virtual clock)' });
  }
  if (ladder.minSamples > ladder.window) {
    issues.push({ path: '/ladder/minSamples', message: `must be at most /ladder/window (${ladder.window}) but is ${ladder.minSamples}` });
  }
  for (const [stage, value] of Object.entries(config.virtualServiceMs)) {
    costsPerLevel(value).forEach((cost, level) => {
      if (isDistribution(cost) && cost.quantilesMs.some((ms, i) => i > 0 && ms < cost.quantilesMs[i - 1]!))
        issues.push({
          path: `/virtualServiceMs/${stage}${Array.isArray(value) ? `/${level}` : ''}/quantilesMs`,
          message: 'must be ascending',
        });
    });
    if (Array.isArray(value) && value.length > ladder.rungs.length + 1) {
      issues.push({
        path: `/virtualServiceMs/${stage}`,
        message:
          `has ${value.length} levels but the ladder has ${ladder.rungs.length + 1} (ladder.rungs + 1): ` +
          "calibrate again with this ladder, or leave ladder.rungs out to take the calibration file's",
      });
    }
  }
  return issues;
}

// --- cameras ---------------------------------------------------------------------------------

const CAMERA_SECTIONS = ['budgets', 'edges', 'ladder'] as const;
const CAMERA_PATH_FIELDS: readonly (readonly string[])[] = [
  ['source', 'path'],
  ['source', 'url'],
  ['source', 'curve', 'secretKeyFile'],
  ['source', 'curve', 'serverKeyFile'],
];

/** Objects merge key by key. Anything else, arrays included, is replaced.
 * So is a tagged object such as an edge policy, whose kind decides which fields it may have. */
function mergeSection(base: unknown, over: unknown): unknown {
  if (!isRecord(base) || !isRecord(over) || 'policy' in over) return over === undefined ? structuredClone(base) : over;
  const out: Record<string, unknown> = structuredClone(base);
  for (const [key, value] of Object.entries(over)) out[key] = mergeSection(base[key], value);
  return out;
}

/** Before validation, a camera's budgets, edges and ladder become the top-level sections with its fields on top.
 * Its source's paths are resolved like the top-level ones. */
function prepareCameras(data: unknown, base: string | undefined): ConfigIssue[] {
  if (!isRecord(data) || data.cameras === undefined) return [];
  if (data.source !== undefined) return [{ path: '/source', message: 'give either source (one camera) or cameras, not both' }];
  if (!Array.isArray(data.cameras)) return []; // the schema says what is wrong
  for (const camera of data.cameras) {
    if (!isRecord(camera)) continue;
    for (const section of CAMERA_SECTIONS) camera[section] = mergeSection(data[section] ?? {}, camera[section]);
    if (base !== undefined) resolvePaths(camera, CAMERA_PATH_FIELDS, base);
  }
  return [];
}

/** Each camera's sections against the schema of the top-level ones (which fills in their defaults). */
function validateCameras(data: unknown, validate: ReturnType<typeof compileSchema>): ConfigIssue[] {
  if (!isRecord(data) || !Array.isArray(data.cameras)) return [];
  const issues: ConfigIssue[] = [];
  data.cameras.forEach((camera: Record<string, unknown>, i) => {
    const sections = { source: camera.source, budgets: camera.budgets, edges: camera.edges, ladder: camera.ladder };
    if (validate(sections)) return;
    for (const issue of describeAjvErrors(validate.errors ?? [])) issues.push({ ...issue, path: `/cameras/${i}${issue.path}` });
  });
  return issues;
}

/** Each camera's sections pass the same checks as the top-level ones; and what one graph per camera
 * cannot do yet is refused. */
function checkCameras(config: PerceptConfig): ConfigIssue[] {
  const cameras = config.cameras;
  if (!cameras) return [];
  const issues: ConfigIssue[] = [];
  const seen = new Set<string>();
  cameras.forEach((camera, i) => {
    if (seen.has(camera.id)) issues.push({ path: `/cameras/${i}/id`, message: `"${camera.id}" names two cameras` });
    seen.add(camera.id);
    const own = checkSemantics({ ...config, cameras: undefined, source: camera.source, budgets: camera.budgets, ladder: camera.ladder });
    for (const issue of own) {
      if (/^\/(source|budgets|ladder)(\/|$)/.test(issue.path)) issues.push({ ...issue, path: `/cameras/${i}${issue.path}` });
    }
  });
  if (config.clock !== 'real') {
    issues.push({ path: '/clock', message: 'must be "real" with cameras: the shared engines batch frames as they arrive in real time' });
  }
  const unsupported: [string, boolean][] = [
    ['/control/enabled', config.control.enabled],
    ['/recorder/enabled', config.recorder.enabled],
  ];
  for (const [path, on] of unsupported) if (on) issues.push({ path, message: 'is not supported with cameras yet (it serves one graph)' });
  const drafts: [string, boolean][] = [
    ['/decoder/draft', config.decoder.draft !== null],
    ['/decoder/draftMtp', config.decoder.draftMtp !== null],
    ['/decoder/ngram', config.decoder.ngram],
  ];
  for (const [path, on] of drafts) if (on) issues.push({ path, message: 'cameras are decoded together in one batch, without drafts' });
  const { decodeMaxActive, lanes, stepRows, kvUnified, mixSteps, admit, joinRunning } = config.batching;
  if (!joinRunning && admit !== 'together')
    issues.push({ path: '/batching/joinRunning', message: `false is for admit "together" (a group without a tail), not "${admit}"` });
  if (stepRows > 0 && !kvUnified) issues.push({ path: '/batching/stepRows', message: 'pads steps in one KV buffer: needs kvUnified' });
  if (mixSteps && (!kvUnified || stepRows > 0))
    issues.push({ path: '/batching/mixSteps', message: 'mixes steps in one KV buffer without padding: needs kvUnified and stepRows 0' });
  if (decodeMaxActive !== null && decodeMaxActive > cameras.length) {
    issues.push({ path: '/batching/decodeMaxActive', message: `must be at most the number of cameras (${cameras.length})` });
  }
  if (lanes > maxLanes(cameras.length)) {
    issues.push({
      path: '/batching/lanes',
      message: `must leave two cameras a lane at least: at most ${maxLanes(cameras.length)} with ${cameras.length} cameras`,
    });
  }
  return issues;
}

/** batching.lanes at most for `cameras`: two cameras a lane at least (one lane always). */
export function maxLanes(cameras: number): number {
  return Math.max(1, Math.floor(cameras / 2));
}

/** The part of the config one camera's graph reads. */
export function cameraGraphConfig(config: PerceptConfig, camera: CameraConfig): GraphConfig {
  return { ...config, budgets: camera.budgets, edges: camera.edges, ladder: camera.ladder };
}
