// The remote decode stage: camera frame → generation through any OpenAI-compatible
// /v1/chat/completions server (llama-server, vLLM, trtllm-serve). It stands in for preprocess, encode
// and decode: the frame goes as an image part (a JPEG data URL), the action schema as response_format,
// and the server runs the vision tower, the decoder and the grammar. The Generation it returns is the
// local decoder's, so the actions and publish stages are the same.
//
// Time: a request is aborted at the stage deadline (ctx.signal reaches fetch; the server sees the
// connection close and frees its slot) and counted as a cancel. `timeoutMs` bounds one attempt on
// top of that. Up to `concurrency` requests are in flight: that is the runtime's concurrency for this
// stage, so further frames wait on its edge under the edge policy, never in a queue here. Only the
// failures another attempt can fix are retried (connection refused or reset, 429, 503), with
// exponential backoff and only while the next attempt can still end before the deadline: it is
// expected to take at least as long as the fastest reply so far.
//
// At load, GET /v1/models checks that the server serves `model`, and a probe request (a small image
// and the action schema) fails the run with an error that names the server and what it lacks: vision
// or structured output.
import sharp from 'sharp';
import { decodeBudget, type ActionSchema } from './action-schema.ts';
import { jsonSchemaToGbnf } from '../native/schema-grammar.ts';
import type { CameraFrame, FrameEncoding, Generation, StopReason } from './payloads.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';

export interface OpenAIDecoderStageConfig {
  /** The server's base URL, with or without the trailing /v1: http://127.0.0.1:8080 or https://host/v1. */
  readonly endpoint: string;
  /** The model id the server serves (GET /v1/models lists them). */
  readonly model: string;
  /** A bearer key for the server (read from its environment variable by the caller), if it wants one. */
  readonly apiKey?: string;
  /** Requests in flight at most. */
  readonly concurrency: number;
  /** One attempt's time limit (ms); null: the stage deadline only. */
  readonly timeoutMs: number | null;
  /** Attempts after the first, for retryable failures only. */
  readonly retries: number;
  readonly systemPrompt: string;
  readonly instruction: string;
  /** New tokens per action at most; null: the ladder's maxNewTokens knob alone. */
  readonly maxNewTokens: number | null;
  readonly temperature: number;
  readonly seed: number;
  /** Sent as response_format json_schema; the actions stage validates the reply with the same schema. */
  readonly actionSchema: ActionSchema;
}

/** What the load-time probe found out about the server. */
export interface ServerInfo {
  /** The endpoint's /v1 base URL. */
  readonly baseUrl: string;
  /** Who serves the model: /v1/models' owned_by (llamacpp, vllm, …), else the Server header, else the host. */
  readonly name: string;
  readonly model: string;
  /** The probe's round trip (ms): it ran vision, prefill and a schema-constrained decode on the server. */
  readonly probeMs: number;
  /** The request field that constrains each frame's output: percept's own finite grammar (GBNF) where the
   * server takes one (see GrammarField), else the schema as `json_schema` (response_format). */
  readonly constraint: GrammarField | 'json_schema';
  /** Why a server that takes grammars got the json_schema instead: what it answered to percept's grammar. */
  readonly grammarRefused: string | null;
}

/**
 * Where a server takes percept's GBNF: llama-server's `grammar`; vLLM's `structured_outputs.grammar` from 0.10.2
 * (XGrammar or llguidance reads it), its `guided_grammar` before.
 */
export type GrammarField = 'grammar' | 'structured_outputs' | 'guided_grammar';

/** The first vLLM that takes `structured_outputs`, 0.10.2, as major·10⁶ + minor·10³ + patch (0.12 dropped `guided_grammar`). */
const VLLM_STRUCTURED_OUTPUTS = 10_002;

export interface OpenAIDecoderStage extends Stage<CameraFrame, Generation> {
  readonly server: ServerInfo;
}

/** The load-time requests' time limit: a server may still be warming up its first image graph. */
const PROBE_TIMEOUT_MS = 60_000;
/** The probe's new tokens when decoder.maxNewTokens is unset: more than a complete action needs. */
const PROBE_MAX_TOKENS = 256;
/** Side of the probe's test image (px). */
const PROBE_IMAGE_SIDE = 64;
/** Backoff before retry n: RETRY_BASE_MS · 2^(n−1), at most RETRY_MAX_MS, half of it random (jitter keeps
 * a fleet of clients from retrying a recovering replica in step). */
const RETRY_BASE_MS = 50;
const RETRY_MAX_MS = 2000;
/** JPEG quality for raw frames. */
const JPEG_QUALITY = 90;
/** Characters of a server's error body quoted in an error. */
const SNIPPET_CHARS = 300;

/** A failed request: retryable or not, with the server's Retry-After when it sent one. */
export class RequestError extends Error {
  readonly retryable: boolean;
  readonly retryAfterMs: number | undefined;
  /** The HTTP status and the server's own error message, when it answered. */
  readonly status: number | undefined;
  readonly serverMessage: string | undefined;
  constructor(
    message: string,
    opts: { retryable: boolean; retryAfterMs?: number; status?: number; serverMessage?: string; cause?: unknown },
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'RequestError';
    this.retryable = opts.retryable;
    this.retryAfterMs = opts.retryAfterMs;
    this.status = opts.status;
    this.serverMessage = opts.serverMessage;
  }
}

/** `http://host:port[/…]` → its /v1 base URL. */
export function apiBaseUrl(endpoint: string): string {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new TypeError(`decoder.endpoint must be an http(s) URL such as http://127.0.0.1:8080, got ${JSON.stringify(endpoint)}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new TypeError(`decoder.endpoint must be an http(s) URL, got ${JSON.stringify(endpoint)}`);
  const path = url.pathname.replace(/\/+$/, '');
  return `${url.origin}${path.endsWith('/v1') ? path : `${path}/v1`}`;
}

/** The key in environment variable `ref.env`; a missing or empty variable is an error naming it. */
export function apiKeyFromEnv(ref: { readonly env: string } | null, env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (ref === null) return undefined;
  const key = env[ref.env];
  if (!key) throw new Error(`decoder.apiKey: environment variable ${ref.env} is not set (it holds the server's API key)`);
  return key;
}

const CONNECT_FAILURES: Readonly<Record<string, { what: string; retryable: boolean }>> = {
  ECONNREFUSED: { what: 'connection refused', retryable: true },
  ECONNRESET: { what: 'connection reset', retryable: true },
  EPIPE: { what: 'connection reset', retryable: true },
  UND_ERR_SOCKET: { what: 'connection closed by the server', retryable: true },
  ENOTFOUND: { what: 'host not found', retryable: false },
  EAI_AGAIN: { what: 'host name lookup failed', retryable: false },
  EHOSTUNREACH: { what: 'host unreachable', retryable: false },
  ENETUNREACH: { what: 'network unreachable', retryable: false },
  UND_ERR_CONNECT_TIMEOUT: { what: 'connect timeout', retryable: false },
};

/** fetch's rejection (a TypeError whose cause holds the socket error) → a RequestError. */
function connectError(err: unknown, url: string): RequestError {
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  const code = cause?.code ?? '';
  const known = CONNECT_FAILURES[code];
  const what = known ? `${known.what} (${code})` : (cause?.message ?? (err as Error).message);
  return new RequestError(`cannot reach ${url}: ${what}`, { retryable: known?.retryable ?? false, cause: err });
}

/** Retry-After as seconds or an HTTP date → ms from now. */
function retryAfterMs(header: string | null): number | undefined {
  if (header === null) return undefined;
  const seconds = Number(header);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** The message of an OpenAI-style error body ({error: {message}} or {error: "…"}), else the text. */
function errorMessage(text: string): string {
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } | string; message?: unknown; detail?: unknown };
    const message = typeof body.error === 'string' ? body.error : (body.error?.message ?? body.message ?? body.detail);
    if (typeof message === 'string' && message.length > 0) return message;
  } catch {
    // not JSON: the text itself
  }
  return text.length > SNIPPET_CHARS ? `${text.slice(0, SNIPPET_CHARS)}…` : text;
}

interface Reply {
  readonly status: number;
  readonly headers: Headers;
  readonly body: unknown;
}

/** One HTTP exchange. Throws the signal's reason when it aborts, a RequestError otherwise. */
async function request(url: string, init: RequestInit & { signal: AbortSignal }): Promise<Reply> {
  let res: Response;
  let text: string;
  try {
    res = await fetch(url, init);
    text = await res.text();
  } catch (err) {
    if (init.signal.aborted) throw init.signal.reason;
    throw connectError(err, url);
  }
  if (!res.ok) {
    const retryable = res.status === 429 || res.status === 503;
    const serverMessage = errorMessage(text);
    throw new RequestError(`${url} answered ${res.status} ${res.statusText}: ${serverMessage}`, {
      retryable,
      status: res.status,
      serverMessage,
      ...(retryable ? { retryAfterMs: retryAfterMs(res.headers.get('retry-after')) } : {}),
    });
  }
  try {
    return { status: res.status, headers: res.headers, body: JSON.parse(text) as unknown };
  } catch {
    throw new RequestError(`${url} answered ${res.status} with a body that is not JSON: ${errorMessage(text)}`, { retryable: false });
  }
}

interface ChatCompletion {
  readonly choices: readonly { readonly finish_reason?: string | null; readonly message?: { readonly content?: string | null } }[];
  readonly usage?: {
    readonly prompt_tokens?: number;
    readonly completion_tokens?: number;
    readonly prompt_tokens_details?: { readonly cached_tokens?: number } | null;
  };
  /** llama-server's own timings. */
  readonly timings?: {
    readonly cache_n?: number;
    readonly prompt_n?: number;
    readonly prompt_ms?: number;
    readonly predicted_n?: number;
    readonly predicted_ms?: number;
    readonly draft_n?: number;
    readonly draft_n_accepted?: number;
  };
}

function asCompletion(body: unknown, url: string): ChatCompletion {
  const choices = (body as { choices?: unknown } | null)?.choices;
  if (!Array.isArray(choices) || choices.length === 0 || typeof choices[0] !== 'object' || choices[0] === null) {
    throw new RequestError(`${url} answered without choices: ${errorMessage(JSON.stringify(body))}`, { retryable: false });
  }
  return body as ChatCompletion;
}

const FINISH: Readonly<Record<string, StopReason>> = { stop: 'eos', length: 'max_tokens' };
const num = (x: unknown): number => (typeof x === 'number' && Number.isFinite(x) ? x : 0);

/** A chat completion → the local decoder's Generation. Token ids do not come over this API (tokens is
 * empty; the count is timings.decodeTokens); timings the server does not report are 0. */
export function generationOf(completion: ChatCompletion, ttftMs: number): Generation {
  const choice = completion.choices[0]!;
  const { usage, timings } = completion;
  const promptTokens = num(usage?.prompt_tokens ?? num(timings?.prompt_n) + num(timings?.cache_n));
  const reusedTokens = num(usage?.prompt_tokens_details?.cached_tokens ?? timings?.cache_n);
  return {
    text: choice.message?.content ?? '',
    tokens: [],
    stopReason: FINISH[choice.finish_reason ?? ''] ?? 'stop',
    promptTokens,
    reusedTokens,
    drafted: num(timings?.draft_n),
    accepted: num(timings?.draft_n_accepted),
    forced: 0,
    timings: {
      prefillMs: num(timings?.prompt_ms),
      prefillTokens: num(timings?.prompt_n ?? promptTokens - reusedTokens),
      ttftMs,
      decodeMs: num(timings?.predicted_ms),
      decodeTokens: num(usage?.completion_tokens ?? timings?.predicted_n),
      sampleMs: 0,
    },
  };
}

const RAW_CHANNELS: Readonly<Partial<Record<FrameEncoding, number>>> = { rgb8: 3, bgr8: 3, rgba8: 4, bgra8: 4, mono8: 1, mono16: 2 };

/** A frame as a data URL: JPEG and PNG as they came, raw pixels encoded to JPEG by sharp. */
export async function imageDataUrl(frame: CameraFrame): Promise<string> {
  const { encoding, data } = frame;
  const base64 = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
  if (encoding === 'jpeg' || encoding === 'png') return `data:image/${encoding};base64,${base64(data)}`;
  const bpp = RAW_CHANNELS[encoding];
  if (bpp === undefined) throw new TypeError(`decoder: unknown frame encoding '${String(encoding)}'`);
  const { width, height } = frame;
  if (!Number.isInteger(width) || !Number.isInteger(height) || width! < 1 || height! < 1)
    throw new TypeError(`decoder: a ${encoding} frame needs integer width and height ≥ 1 (got ${width}×${height})`);
  const w = width!;
  const h = height!;
  const rowBytes = w * bpp;
  const stride = frame.stride ?? rowBytes;
  if (!Number.isInteger(stride) || stride < rowBytes)
    throw new RangeError(`decoder: ${encoding} frame stride ${stride} is below width × ${bpp} = ${rowBytes}`);
  if (data.byteLength < stride * (h - 1) + rowBytes)
    throw new RangeError(`decoder: ${encoding} frame has ${data.byteLength} bytes, needs ${stride * (h - 1) + rowBytes} for ${w}×${h}`);
  // Packed 8-bit rows for sharp: a 16-bit mono frame keeps its high byte (host little-endian order).
  const channels = encoding === 'mono16' ? 1 : bpp;
  let pixels = data;
  if (encoding === 'mono16' || stride !== rowBytes) {
    pixels = new Uint8Array(w * h * channels);
    for (let y = 0; y < h; y++) {
      const row = data.subarray(y * stride, y * stride + rowBytes);
      if (encoding === 'mono16') for (let x = 0; x < w; x++) pixels[y * w + x] = row[2 * x + 1]!;
      else pixels.set(row, y * rowBytes);
    }
  }
  let image = sharp(pixels, { raw: { width: w, height: h, channels: channels as 1 | 3 | 4 } });
  if (channels === 4) image = image.removeAlpha();
  if (encoding === 'bgr8' || encoding === 'bgra8')
    image = image.recomb([
      [0, 0, 1],
      [0, 1, 0],
      [1, 0, 0],
    ]);
  return `data:image/jpeg;base64,${(await image.jpeg({ quality: JPEG_QUALITY }).toBuffer()).toString('base64')}`;
}

/** response_format's json_schema.name: the schema's title, else its $id, as [A-Za-z0-9_-]{1,64}. */
function schemaName(schema: ActionSchema): string {
  const title = typeof schema.schema.title === 'string' ? schema.schema.title : schema.id;
  return title.replace(/[^A-Za-z0-9_-]+/g, '_').slice(0, 64) || 'action';
}

const sleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason as Error);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });

/** Connects to the server, checks it at load (see the top of the file) and returns the stage. */
export async function createOpenAIDecoderStage(config: OpenAIDecoderStageConfig): Promise<OpenAIDecoderStage> {
  if (typeof config !== 'object' || config === null) throw new TypeError('createOpenAIDecoderStage: config must be an object');
  const baseUrl = apiBaseUrl(config.endpoint);
  if (typeof config.model !== 'string' || config.model.length === 0)
    throw new TypeError('decoder.model must name the model the server serves (GET /v1/models lists them)');
  if (!Number.isInteger(config.concurrency) || config.concurrency < 1)
    throw new RangeError(`decoder.concurrency must be an integer ≥ 1, got ${config.concurrency}`);
  if (!Number.isInteger(config.retries) || config.retries < 0)
    throw new RangeError(`decoder.retries must be an integer ≥ 0, got ${config.retries}`);
  if (config.timeoutMs !== null && !(config.timeoutMs > 0))
    throw new RangeError(`decoder.timeoutMs must be > 0 or null, got ${config.timeoutMs}`);
  if (!(config.temperature >= 0)) throw new RangeError(`decoder.temperature must be ≥ 0, got ${config.temperature}`);
  if (typeof config.actionSchema?.schema !== 'object')
    throw new TypeError('createOpenAIDecoderStage: actionSchema must be the result of loadActionSchema()');
  // The server runs the grammar, so only the configured value bounds an action here (and the level's, under json_schema).
  const budget = decodeBudget(config.maxNewTokens, null, config.actionSchema.path);
  const { model, timeoutMs, retries, temperature, seed } = config;
  const chatUrl = `${baseUrl}/chat/completions`;
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (config.apiKey) headers.authorization = `Bearer ${config.apiKey}`;
  const responseFormat = {
    type: 'json_schema',
    json_schema: { name: schemaName(config.actionSchema), schema: config.actionSchema.schema, strict: true },
  };
  // The probe checks the json_schema path every server takes; frames use the grammar where the server takes it.
  let constraint: Record<string, unknown> = { response_format: responseFormat };
  const body = (image: string, maxTokens: number, frameSeed: number): string =>
    JSON.stringify({
      model,
      messages: [
        { role: 'system', content: config.systemPrompt },
        {
          role: 'user',
          content: [
            { type: 'image_url', image_url: { url: image } },
            { type: 'text', text: config.instruction },
          ],
        },
      ],
      ...constraint,
      max_tokens: maxTokens,
      temperature,
      seed: frameSeed,
      stream: false,
      // An action, not a chain of thought: Gemma 4 and other thinking templates otherwise open a
      // reasoning block, and servers (llama-server) apply the schema only after it.
      chat_template_kwargs: { enable_thinking: false },
    });

  const probeTokens = config.maxNewTokens ?? PROBE_MAX_TOKENS;
  const probed = await probeServer(baseUrl, chatUrl, headers, model, body, probeTokens);
  // The same bounded grammar the local decoder runs: servers' own json_schema grammars leave numbers unbounded.
  const field = await grammarField(probed.name, baseUrl, headers);
  let grammarRefused: string | null = null;
  if (field) {
    const gbnf = jsonSchemaToGbnf(config.actionSchema.schema);
    constraint = field === 'structured_outputs' ? { structured_outputs: { grammar: gbnf } } : { [field]: gbnf };
    grammarRefused = await probeGrammar(chatUrl, headers, body(probed.image, probeTokens, 0));
    if (grammarRefused !== null) constraint = { response_format: responseFormat };
  }
  const { image: _, ...info } = probed;
  const server: ServerInfo = { ...info, constraint: field && grammarRefused === null ? field : 'json_schema', grammarRefused };
  // Under percept's grammar an action ends by the grammar's own bound, as the local decoder's does: the level's
  // maxNewTokens must not cut it. Its worst case in this server's tokens is unknown here, so the probe's bound holds.
  const grammarTokens = server.constraint === 'json_schema' ? null : probeTokens;
  const who = `${server.name} at ${baseUrl}`;
  /** The fastest reply so far (ms): what a retry needs left before the deadline to be worth starting. */
  let fastestMs = Infinity;

  const process = async (frame: CameraFrame, sc: StageContext): Promise<Generation> => {
    const image = await imageDataUrl(frame);
    const maxTokens = grammarTokens ?? budget.atKnob(sc.knobs.maxNewTokens);
    const payload = body(image, maxTokens, (seed + sc.frame.frameId) >>> 0);
    const leftMs = (): number => Number(sc.stageDeadlineNs - sc.clock.nowNs()) / 1e6;
    const cancelled = (what: string): unknown => {
      const reason = (sc.signal.reason as { reason?: string } | undefined)?.reason === 'shutdown' ? 'shutdown' : 'deadline';
      sc.report({ kind: 'cancel', reason, detail: `${what} (${who})` });
      return sc.signal.reason;
    };
    for (let attempt = 1; ; attempt++) {
      const t0 = performance.now();
      const timeout = timeoutMs === null ? undefined : AbortSignal.timeout(timeoutMs);
      const signal = timeout ? AbortSignal.any([sc.signal, timeout]) : sc.signal;
      let failure: RequestError;
      try {
        const reply = await request(chatUrl, { method: 'POST', headers, body: payload, signal });
        const requestMs = performance.now() - t0;
        fastestMs = Math.min(fastestMs, requestMs);
        const completion = asCompletion(reply.body, chatUrl);
        // Without streaming the first token is seen with the last: the server's prefill is the nearest measure.
        const generation = generationOf(completion, num(completion.timings?.prompt_ms) || requestMs);
        const serverMs = generation.timings.prefillMs + generation.timings.decodeMs;
        sc.report({
          kind: 'note',
          message: 'decode',
          data: {
            promptTokens: generation.promptTokens,
            reusedTokens: generation.reusedTokens,
            tokens: generation.timings.decodeTokens,
            prefillMs: generation.timings.prefillMs,
            decodeMs: generation.timings.decodeMs,
            stopReason: generation.stopReason,
            requestMs,
            // The HTTP path's own cost where the server reports its timings (llama-server): transport,
            // JSON and base64, image decoding, templating, grammar setup, and any wait for a free slot.
            ...(completion.timings ? { httpMs: requestMs - serverMs } : {}),
            attempts: attempt,
          },
        });
        return generation;
      } catch (err) {
        const ms = (performance.now() - t0).toFixed(0);
        if (sc.signal.aborted) throw cancelled(`request aborted after ${ms} ms, attempt ${attempt}`);
        if (timeout?.aborted) {
          sc.report({
            kind: 'cancel',
            reason: 'deadline',
            detail: `request aborted at decoder.timeoutMs (${timeoutMs} ms), attempt ${attempt} (${who})`,
          });
          failure = new RequestError(`no reply from ${chatUrl} within decoder.timeoutMs (${timeoutMs} ms)`, { retryable: true });
        } else if (err instanceof RequestError) {
          failure = err;
        } else {
          throw err;
        }
      }
      const tried = `${attempt} attempt${attempt > 1 ? 's' : ''}`;
      if (!failure.retryable) throw new Error(`decoder: ${failure.message}`, { cause: failure });
      if (attempt > retries) throw new Error(`decoder: ${failure.message} (${tried}; decoder.retries is ${retries})`, { cause: failure });
      const backoff = Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** (attempt - 1));
      const waitMs = Math.max(failure.retryAfterMs ?? 0, backoff / 2 + (Math.random() * backoff) / 2);
      const needMs = waitMs + (Number.isFinite(fastestMs) ? fastestMs : 0);
      if (needMs >= leftMs()) {
        throw new Error(
          `decoder: ${failure.message} (${tried}; no retry: waiting ${waitMs.toFixed(0)} ms${Number.isFinite(fastestMs) ? ` and the fastest reply so far, ${fastestMs.toFixed(0)} ms,` : ''} would end past the deadline, ${Math.max(0, leftMs()).toFixed(0)} ms away)`,
          { cause: failure },
        );
      }
      try {
        await sleep(waitMs, sc.signal);
      } catch {
        throw cancelled(`aborted while waiting to retry after ${tried}`);
      }
    }
  };

  return { name: 'decode', concurrency: config.concurrency, server, process };
}

/** Where the server named `name` (GET /v1/models' owned_by) takes percept's GBNF, or null. */
async function grammarField(name: string, baseUrl: string, headers: Record<string, string>): Promise<GrammarField | null> {
  if (name === 'llamacpp') return 'grammar';
  if (name !== 'vllm') return null;
  // vLLM answers GET /version at its root with {"version": "0.11.0"}; a server that does not is taken as current.
  const root = baseUrl.replace(/\/v1$/, '');
  try {
    const { body } = await request(`${root}/version`, { headers, signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
    const [major, minor, patch] = String((body as { version?: unknown }).version ?? '')
      .split(/[.+-]/)
      .map(Number);
    if (major! * 1e6 + minor! * 1e3 + patch! < VLLM_STRUCTURED_OUTPUTS) return 'guided_grammar';
  } catch (err) {
    if (!(err instanceof RequestError)) throw err;
  }
  return 'structured_outputs';
}

/** One probe under percept's grammar: null when the server took it and replied JSON, else what went wrong. */
async function probeGrammar(chatUrl: string, headers: Record<string, string>, body: string): Promise<string | null> {
  try {
    const reply = await request(chatUrl, { method: 'POST', headers, body, signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
    const text = notJson(asCompletion(reply.body, chatUrl));
    return text === null ? null : `under it, the reply was not JSON: ${text}`;
  } catch (err) {
    if (err instanceof RequestError) return err.message;
    if ((err as Error).name === 'TimeoutError') return `it did not answer a probe under the grammar within ${PROBE_TIMEOUT_MS} ms`;
    throw err;
  }
}

/** A reply that stopped on its own with text that is not JSON: the start of that text, quoted; else null. */
function notJson(completion: ChatCompletion): string | null {
  const choice = completion.choices[0]!;
  const text = choice.message?.content ?? '';
  if (choice.finish_reason !== 'stop') return null;
  try {
    JSON.parse(text);
    return null;
  } catch {
    return JSON.stringify(text.slice(0, SNIPPET_CHARS));
  }
}

/** Finds who serves `model` at `baseUrl` and checks it takes an image and a json_schema response_format:
 * a small request with both must come back as JSON. Every failure names the server and what is missing. */
async function probeServer(
  baseUrl: string,
  chatUrl: string,
  headers: Record<string, string>,
  model: string,
  body: (image: string, maxTokens: number, seed: number) => string,
  maxTokens: number,
): Promise<Omit<ServerInfo, 'constraint' | 'grammarRefused'> & { readonly image: string }> {
  const fail = (what: string, cause?: unknown): Error =>
    new Error(`decoder: the OpenAI-compatible server at ${baseUrl} ${what}`, cause === undefined ? undefined : { cause });
  const modelsUrl = `${baseUrl}/models`;
  let listed: Reply;
  try {
    listed = await request(modelsUrl, { headers, signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
  } catch (err) {
    if (err instanceof RequestError && err.status === 401) throw fail(`rejected the API key (set decoder.apiKey.env): ${err.message}`, err);
    if (err instanceof RequestError) throw fail(`cannot be used: ${err.message}`, err);
    if ((err as Error).name === 'TimeoutError') throw fail(`did not answer GET ${modelsUrl} within ${PROBE_TIMEOUT_MS} ms`, err);
    throw err;
  }
  const entries = (listed.body as { data?: unknown }).data;
  const models = Array.isArray(entries) ? (entries as { id?: unknown; owned_by?: unknown }[]) : [];
  const entry = models.find((m) => m.id === model);
  if (!entry) {
    const ids = models.map((m) => JSON.stringify(m.id)).join(', ') || 'none';
    throw fail(`does not serve model ${JSON.stringify(model)} (GET ${modelsUrl} lists ${ids}): set decoder.model to one of them`);
  }
  const name = (typeof entry.owned_by === 'string' && entry.owned_by) || listed.headers.get('server') || new URL(baseUrl).host || baseUrl;
  const who = `${name} at ${baseUrl}`;
  const lacks = (what: string, detail: string, cause?: unknown): Error =>
    new Error(`decoder: ${who} (model ${JSON.stringify(model)}) lacks ${what}: ${detail}`, cause === undefined ? undefined : { cause });

  const gray = Buffer.alloc(PROBE_IMAGE_SIDE * PROBE_IMAGE_SIDE, 128);
  const image = await imageDataUrl({ encoding: 'mono8', data: gray, width: PROBE_IMAGE_SIDE, height: PROBE_IMAGE_SIDE });
  const t0 = performance.now();
  let reply: Reply;
  try {
    reply = await request(chatUrl, {
      method: 'POST',
      headers,
      body: body(image, maxTokens, 0),
      signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
    });
  } catch (err) {
    if ((err as Error).name === 'TimeoutError') throw fail(`did not answer a probe request within ${PROBE_TIMEOUT_MS} ms`, err);
    if (!(err instanceof RequestError)) throw err;
    // What the server said (not the URL, which may hold any word) tells which capability is missing.
    const said = err.serverMessage ?? '';
    if (/image|vision|multimodal|mmproj|modalit/i.test(said))
      throw lacks('vision (it refused an image part)', `${err.message} — serve a vision model (llama-server: --mmproj FILE)`, err);
    if (/response_format|json_schema|grammar|guided|structured/i.test(said))
      throw lacks('structured output (it refused response_format json_schema)', err.message, err);
    throw fail(`failed a probe request with an image and the action schema: ${err.message}`, err);
  }
  const text = notJson(asCompletion(reply.body, chatUrl));
  if (text !== null)
    throw lacks('structured output', `asked for response_format json_schema, it replied with text that is not JSON: ${text}`);
  return { baseUrl, name, model, probeMs: performance.now() - t0, image };
}
