// Metrics and health over HTTP for a running graph: GET /metrics in the Prometheus text exposition format
// (version 0.0.4, made by prom-client from a registry of this server's own), GET /healthz (alive: starting or
// running) and GET /readyz (ready: models loaded, frames flowing). The metrics fold the telemetry events as
// they come. Served over node:http; loopback by default.
//
//   const server = await startMetricsServer({ port: 9464, events: graph.events }); // subscribe before graph.run()
//   …
//   await server.close();
//
// Names and health semantics: docs/observability.md
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Observable, Subscription } from 'rxjs';
import type { RunSummary, TelemetryEvent } from '../../pipeline/telemetry/events.ts';

export const METRICS_CONTENT_TYPE: string = Registry.PROMETHEUS_CONTENT_TYPE;
/** Default: /healthz says 503 when no frame has come in this long. */
export const DEFAULT_STALE_AFTER_MS = 5000;
/** Upper bounds (seconds) of the latency histograms' buckets: a CPU stage call to a slow decode. */
export const LATENCY_BUCKETS_S: readonly number[] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

export interface MetricsServerOptions {
  /** Default 127.0.0.1: loopback only. Give '0.0.0.0' or an interface's address to serve beyond this host. */
  readonly host?: string;
  /** 0 picks a free port (see MetricsServer.port). */
  readonly port: number;
  /** The run's telemetry: graph.events or a GraphGroup's events. Subscribed at once, so start before the run. */
  readonly events: Observable<TelemetryEvent>;
  /** /healthz is 503 when no frame has come in this long (default 5000 ms). */
  readonly staleAfterMs?: number;
  /** Wall clock in ms (tests). Default Date.now. */
  readonly now?: () => number;
  /** Messages waiting in the publisher, by topic, read when scraped. */
  readonly queuedMessages?: () => Readonly<Record<string, number>>;
}

export type HealthStatus = 'starting' | 'running' | 'stalled' | 'ended';

export interface Health {
  /** true: HTTP 200. false: 503. */
  readonly ok: boolean;
  readonly status: HealthStatus;
  /** How the run ended (status 'ended'); null before. */
  readonly endReason: RunSummary['endReason'];
  /** Seconds since the last frame came in; null before the first. */
  readonly lastFrameAgeS: number | null;
  readonly frames: { readonly in: number; readonly out: number; readonly dropped: number; readonly inFlight: number };
}

/** Folds telemetry events into what /metrics and /healthz say. Usable without the server. */
export class MetricsCollector {
  /** This collector's own registry, never prom-client's global one, so two servers in one process keep apart. */
  readonly registry: Registry = new Registry();
  readonly #now: () => number;
  readonly #staleAfterMs: number;
  readonly #startedMs: number;
  #in = 0;
  #out = 0;
  #dropped = 0;
  #lastFrameMs: number | undefined;
  #endReason: RunSummary['endReason'] = null;
  #completed = false;
  readonly #framesIn: Counter;
  readonly #framesOut: Counter;
  readonly #framesLate: Counter;
  readonly #drops: Counter<'stage' | 'reason'>;
  readonly #cancels: Counter<'stage' | 'reason'>;
  readonly #degradeSteps: Counter<'direction'>;
  readonly #errors: Counter<'stage'>;
  readonly #incidents: Counter<'kind'>;
  readonly #ladderLevel: Gauge<'source'>;
  readonly #endToEnd: Histogram;
  readonly #stageLatency: Histogram<'stage'>;

  constructor(options: Pick<MetricsServerOptions, 'staleAfterMs' | 'now' | 'queuedMessages'> = {}) {
    this.#now = options.now ?? Date.now;
    this.#staleAfterMs = options.staleAfterMs ?? DEFAULT_STALE_AFTER_MS;
    if (!(Number.isFinite(this.#staleAfterMs) && this.#staleAfterMs > 0))
      throw new RangeError(`metrics: expected staleAfterMs > 0 but received ${this.#staleAfterMs}`);
    this.#startedMs = this.#now();
    const registers = [this.registry];
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[] = []) =>
      new Counter<L>({ name, help, labelNames, registers });
    this.#framesIn = counter('percept_frames_in_total', 'Frames that entered the graph.');
    this.#framesOut = counter('percept_frames_out_total', 'Frames the last stage finished.');
    this.#framesLate = counter('percept_frames_late_total', 'Frames that came out after their deadline.');
    this.#drops = counter('percept_frames_dropped_total', 'Frames dropped, by the stage where and the reason.', ['stage', 'reason']);
    this.#cancels = counter('percept_cancels_total', 'Stage calls cancelled, by stage and reason.', ['stage', 'reason']);
    this.#degradeSteps = counter('percept_degrade_steps_total', 'Ladder steps, by direction (down: cheaper knobs).', ['direction']);
    for (const direction of ['down', 'up']) this.#degradeSteps.inc({ direction }, 0);
    this.#errors = counter('percept_errors_total', 'Errors, by stage.', ['stage']);
    this.#incidents = counter('percept_source_incidents_total', 'What the source reported besides frames, by kind.', ['kind']);
    // The gauges that follow health are set when scraped (collect), so they are never stale.
    const health = (): Health => this.health();
    new Gauge({
      name: 'percept_frames_in_flight',
      help: 'Frames inside the graph now.',
      registers,
      collect(this: Gauge) {
        this.set(health().frames.inFlight);
      },
    });
    this.#ladderLevel = new Gauge({
      name: 'percept_ladder_level',
      help: "Ladder level of each source's latest frame (0: the initial knobs).",
      labelNames: ['source'],
      registers,
    });
    new Gauge({
      name: 'percept_running',
      help: '1 while the run is running and frames flow (as /healthz says 200).',
      registers,
      collect(this: Gauge) {
        this.set(health().ok ? 1 : 0);
      },
    });
    new Gauge({
      name: 'percept_last_frame_age_seconds',
      help: 'Seconds since the last frame entered.',
      registers,
      collect(this: Gauge) {
        const age = health().lastFrameAgeS;
        // No sample before the first frame.
        if (age === null) this.remove();
        else this.set(age);
      },
    });
    const queued = options.queuedMessages;
    if (queued) {
      new Gauge({
        name: 'percept_publisher_queued_messages',
        help: 'Messages waiting in the publisher to be sent, by topic.',
        labelNames: ['topic'],
        registers,
        collect(this: Gauge<'topic'>) {
          for (const [topic, n] of Object.entries(queued())) this.set({ topic }, n);
        },
      });
    }
    // Histograms observed from each output and span event as it comes: Prometheus can aggregate and rate
    // them, which the graph's own whole-run quantiles cannot.
    this.#endToEnd = new Histogram({
      name: 'percept_end_to_end_latency_seconds',
      help: 'Capture to last stage exit, over frames that came out.',
      buckets: [...LATENCY_BUCKETS_S],
      registers,
    });
    this.#stageLatency = new Histogram({
      name: 'percept_stage_latency_seconds',
      help: "Duration of a stage's process() calls.",
      labelNames: ['stage'],
      buckets: [...LATENCY_BUCKETS_S],
      registers,
    });
  }

  /** Takes one event of the run, in order. */
  readonly accept = (event: TelemetryEvent): void => {
    switch (event.type) {
      case 'frame':
        this.#in += 1;
        this.#framesIn.inc();
        this.#lastFrameMs = this.#now();
        this.#ladderLevel.set({ source: event.sourceId }, event.degradeLevel);
        break;
      case 'output':
        this.#out += 1;
        this.#framesOut.inc();
        if (event.late) this.#framesLate.inc();
        this.#endToEnd.observe(Number(event.latencyNs) / 1e9);
        break;
      case 'span':
        this.#stageLatency.observe({ stage: event.stage }, Number(event.exitNs - event.enterNs) / 1e9);
        break;
      case 'drop':
        this.#dropped += 1;
        this.#drops.inc({ stage: event.stage, reason: event.reason });
        break;
      case 'cancel':
        this.#cancels.inc({ stage: event.stage, reason: event.reason });
        break;
      case 'degrade':
        this.#degradeSteps.inc({ direction: event.direction });
        break;
      case 'error':
        this.#errors.inc({ stage: event.stage });
        break;
      case 'source':
        this.#incidents.inc({ kind: event.kind });
        break;
      case 'stats':
        this.#endReason = event.summary.endReason;
        break;
      default:
        break;
    }
  };

  /** The event stream completed: the run is over. */
  readonly complete = (): void => {
    this.#completed = true;
  };

  health(): Health {
    const now = this.#now();
    const endReason = this.#endReason;
    const lastFrameAgeS = this.#lastFrameMs === undefined ? null : (now - this.#lastFrameMs) / 1000;
    const status: HealthStatus =
      this.#completed || endReason !== null
        ? 'ended'
        : this.#lastFrameMs === undefined
          ? now - this.#startedMs < this.#staleAfterMs
            ? 'starting'
            : 'stalled'
          : now - this.#lastFrameMs < this.#staleAfterMs
            ? 'running'
            : 'stalled';
    return {
      ok: status === 'running' || status === 'starting',
      status,
      endReason,
      lastFrameAgeS,
      frames: { in: this.#in, out: this.#out, dropped: this.#dropped, inFlight: this.#in - this.#out - this.#dropped },
    };
  }

  /** Readiness: the models are loaded (the server starts once they are) and frames flow; not while starting. */
  readiness(): Health {
    const health = this.health();
    return { ...health, ok: health.status === 'running' };
  }

  /** Everything in the Prometheus text exposition format, version 0.0.4 (prom-client's). */
  exposition(): Promise<string> {
    return this.registry.metrics();
  }
}

export interface MetricsServer {
  /** http://host:port */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly collector: MetricsCollector;
  /** Stops listening and unsubscribes. Idempotent. */
  close(): Promise<void>;
}

/** Serves GET /metrics, /healthz and /readyz for the run whose events it is given. Resolves once listening. */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  const { host = '127.0.0.1', port, events } = options;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new RangeError(`metrics: expected a port 0–65535 but received ${port}`);
  if (typeof events?.subscribe !== 'function') throw new TypeError('metrics: expected events to be an Observable of telemetry events');
  const collector = new MetricsCollector(options);
  const subscription: Subscription = events.subscribe({ next: collector.accept, complete: collector.complete });
  const server = createServer((req, res) => handle(collector, req, res));
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    subscription.unsubscribe();
    throw new Error(`metrics: cannot listen on ${host}:${port}: ${(err as Error).message}`, { cause: err });
  }
  const bound = (server.address() as AddressInfo).port;
  let closing: Promise<void> | undefined;
  return {
    url: `http://${host.includes(':') ? `[${host}]` : host}:${bound}`,
    host,
    port: bound,
    collector,
    close() {
      closing ??= new Promise<void>((resolve) => {
        subscription.unsubscribe();
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}

function handle(collector: MetricsCollector, req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? '/').split('?')[0];
  if (path !== '/metrics' && path !== '/healthz' && path !== '/readyz') {
    res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found: try /metrics, /healthz or /readyz\n');
    return;
  }
  if (req.method !== 'GET' && req.method !== 'HEAD') {
    res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' }).end('method not allowed\n');
    return;
  }
  const reply = (status: number, type: string, body: string) => {
    res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body) });
    res.end(req.method === 'HEAD' ? undefined : body);
  };
  if (path === '/metrics') {
    collector.exposition().then(
      (body) => reply(200, METRICS_CONTENT_TYPE, body),
      (err: unknown) => reply(500, 'text/plain; charset=utf-8', `metrics: ${(err as Error).message}\n`),
    );
    return;
  }
  const health = path === '/readyz' ? collector.readiness() : collector.health();
  reply(health.ok ? 200 : 503, 'application/json', `${JSON.stringify(health)}\n`);
}
