// Metrics and health over HTTP for a running graph: GET /metrics in the Prometheus text exposition format
// (version 0.0.4), GET /healthz (alive: starting or running) and GET /readyz (ready: models loaded, frames flowing). Counters and gauges fold the telemetry events as they come; the latency
// summaries are the last stats event's (the graph's own histograms). node:http only; loopback by default.
//
//   const server = await startMetricsServer({ port: 9464, events: graph.events }); // subscribe before graph.run()
//   …
//   await server.close();
//
// Names and health semantics: docs/observability.md
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Observable, Subscription } from 'rxjs';
import type { LatencyStats, RunSummary, TelemetryEvent } from '../../pipeline/telemetry/events.ts';

export const METRICS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';
/** Default: /healthz says 503 when no frame has come in this long. */
export const DEFAULT_STALE_AFTER_MS = 5000;

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
  readonly #now: () => number;
  readonly #staleAfterMs: number;
  readonly #startedMs: number;
  #in = 0;
  #out = 0;
  #late = 0;
  #dropped = 0;
  readonly #drops = new Map<string, number>(); // `${stage}\0${reason}`
  readonly #cancels = new Map<string, number>();
  readonly #errors = new Map<string, number>();
  readonly #incidents = new Map<string, number>();
  readonly #degrade = { down: 0, up: 0 };
  /** Ladder level of each source's latest frame. */
  readonly #levels = new Map<string, number>();
  #lastFrameMs: number | undefined;
  #summary: RunSummary | undefined;
  #completed = false;

  constructor(options: { staleAfterMs?: number; now?: () => number } = {}) {
    this.#now = options.now ?? Date.now;
    this.#staleAfterMs = options.staleAfterMs ?? DEFAULT_STALE_AFTER_MS;
    if (!(Number.isFinite(this.#staleAfterMs) && this.#staleAfterMs > 0))
      throw new RangeError(`metrics: expected staleAfterMs > 0 but received ${this.#staleAfterMs}`);
    this.#startedMs = this.#now();
  }

  /** Takes one event of the run, in order. */
  readonly accept = (event: TelemetryEvent): void => {
    switch (event.type) {
      case 'frame':
        this.#in += 1;
        this.#lastFrameMs = this.#now();
        this.#levels.set(event.sourceId, event.degradeLevel);
        break;
      case 'output':
        this.#out += 1;
        if (event.late) this.#late += 1;
        break;
      case 'drop':
        this.#dropped += 1;
        bump(this.#drops, `${event.stage}\0${event.reason}`);
        break;
      case 'cancel':
        bump(this.#cancels, `${event.stage}\0${event.reason}`);
        break;
      case 'degrade':
        this.#degrade[event.direction] += 1;
        break;
      case 'error':
        bump(this.#errors, event.stage);
        break;
      case 'source':
        bump(this.#incidents, event.kind);
        break;
      case 'stats':
        this.#summary = event.summary;
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
    const endReason = this.#summary?.endReason ?? null;
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

  /** Everything in the Prometheus text exposition format, version 0.0.4. */
  exposition(): string {
    const out: string[] = [];
    const family = (name: string, type: 'counter' | 'gauge' | 'summary', help: string, samples: [string, Labels, number][]) => {
      out.push(`# HELP ${name} ${help.replace(/\\/g, '\\\\').replace(/\n/g, '\\n')}`, `# TYPE ${name} ${type}`);
      for (const [sample, labels, value] of samples) out.push(`${sample}${formatLabels(labels)} ${formatValue(value)}`);
    };
    const pairs = (counts: Map<string, number>, a: string, b: string): [string, Labels, number][] =>
      [...counts].map(([key, n]) => {
        const [x, y] = key.split('\0') as [string, string];
        return ['', { [a]: x, [b]: y }, n];
      });
    const named = (name: string, rows: [string, Labels, number][]): [string, Labels, number][] => rows.map(([, l, v]) => [name, l, v]);
    const health = this.health();
    family('percept_frames_in_total', 'counter', 'Frames that entered the graph.', [['percept_frames_in_total', {}, this.#in]]);
    family('percept_frames_out_total', 'counter', 'Frames the last stage finished.', [['percept_frames_out_total', {}, this.#out]]);
    family('percept_frames_late_total', 'counter', 'Frames that came out after their deadline.', [
      ['percept_frames_late_total', {}, this.#late],
    ]);
    family(
      'percept_frames_dropped_total',
      'counter',
      'Frames dropped, by the stage where and the reason.',
      named('percept_frames_dropped_total', pairs(this.#drops, 'stage', 'reason')),
    );
    family(
      'percept_cancels_total',
      'counter',
      'Stage calls cancelled, by stage and reason.',
      named('percept_cancels_total', pairs(this.#cancels, 'stage', 'reason')),
    );
    family('percept_degrade_steps_total', 'counter', 'Ladder steps, by direction (down: cheaper knobs).', [
      ['percept_degrade_steps_total', { direction: 'down' }, this.#degrade.down],
      ['percept_degrade_steps_total', { direction: 'up' }, this.#degrade.up],
    ]);
    family(
      'percept_errors_total',
      'counter',
      'Errors, by stage.',
      [...this.#errors].map(([stage, n]) => ['percept_errors_total', { stage }, n]),
    );
    family(
      'percept_source_incidents_total',
      'counter',
      'What the source reported besides frames, by kind.',
      [...this.#incidents].map(([kind, n]) => ['percept_source_incidents_total', { kind }, n]),
    );
    family('percept_frames_in_flight', 'gauge', 'Frames inside the graph now.', [['percept_frames_in_flight', {}, health.frames.inFlight]]);
    family(
      'percept_ladder_level',
      'gauge',
      "Ladder level of each source's latest frame (0: the initial knobs).",
      [...this.#levels].map(([source, level]) => ['percept_ladder_level', { source }, level]),
    );
    family('percept_running', 'gauge', '1 while the run is running and frames flow (as /healthz says 200).', [
      ['percept_running', {}, health.ok ? 1 : 0],
    ]);
    family(
      'percept_last_frame_age_seconds',
      'gauge',
      'Seconds since the last frame entered.',
      health.lastFrameAgeS === null ? [] : [['percept_last_frame_age_seconds', {}, health.lastFrameAgeS]],
    );
    const summary = this.#summary;
    family(
      'percept_end_to_end_latency_seconds',
      'summary',
      'Capture to last stage exit, over frames that came out (from the last stats event).',
      summary ? summarySamples('percept_end_to_end_latency_seconds', {}, summary.endToEnd) : [],
    );
    family(
      'percept_stage_latency_seconds',
      'summary',
      "Duration of a stage's process() calls (from the last stats event).",
      summary
        ? Object.entries(summary.stages).flatMap(([stage, stats]) => summarySamples('percept_stage_latency_seconds', { stage }, stats))
        : [],
    );
    return `${out.join('\n')}\n`;
  }
}

type Labels = Readonly<Record<string, string>>;

function bump(map: Map<string, number>, key: string): void {
  map.set(key, (map.get(key) ?? 0) + 1);
}

const QUANTILES: [string, keyof LatencyStats][] = [
  ['0.5', 'p50Ms'],
  ['0.95', 'p95Ms'],
  ['0.99', 'p99Ms'],
];

/** A summary's samples from LatencyStats: quantiles (NaN when there is none yet), _sum and _count, in seconds. */
function summarySamples(name: string, labels: Labels, stats: LatencyStats): [string, Labels, number][] {
  const seconds = (ms: number | null): number => (ms === null ? NaN : ms / 1000);
  return [
    ...QUANTILES.map(([q, key]): [string, Labels, number] => [name, { ...labels, quantile: q }, seconds(stats[key] as number | null)]),
    [`${name}_sum`, labels, stats.count > 0 && stats.meanMs !== null ? (stats.meanMs * stats.count) / 1000 : 0],
    [`${name}_count`, labels, stats.count],
  ];
}

function formatLabels(labels: Labels): string {
  const entries = Object.entries(labels);
  if (entries.length === 0) return '';
  const escape = (v: string) => v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
  return `{${entries.map(([k, v]) => `${k}="${escape(v)}"`).join(',')}}`;
}

function formatValue(value: number): string {
  if (Number.isNaN(value)) return 'NaN';
  if (value === Infinity) return '+Inf';
  if (value === -Infinity) return '-Inf';
  return String(value);
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
  const [status, type, body] =
    path === '/metrics'
      ? [200, METRICS_CONTENT_TYPE, collector.exposition()]
      : ((health) => [health.ok ? 200 : 503, 'application/json', `${JSON.stringify(health)}\n`])(
          path === '/readyz' ? collector.readiness() : collector.health(),
        );
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body) });
  res.end(req.method === 'HEAD' ? undefined : body);
}
