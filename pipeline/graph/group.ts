// Several graphs run as one: one graph per camera, their stages sharing engines.
// The group has one event stream, one stop, and one summary with each graph's own (RunSummary.cameras).
// Semantics: pipeline/README.md#cameras
//
//   const group = new GraphGroup([{ id: 'front', graph: front }, { id: 'rear', graph: rear }], clock, 1000);
//   group.events.subscribe(...);   // every graph's events but their own stats, then the group's stats
//   const summary = await group.run();
import { Subject, type Observable } from 'rxjs';
import type { Clock } from '../clock.ts';
import { TelemetryAggregator } from '../telemetry/aggregator.ts';
import type { RunSummary, TelemetryEvent } from '../telemetry/events.ts';
import type { Graph } from './graph.ts';

export interface GroupMember {
  readonly id: string;
  readonly graph: Graph;
}

export class GraphGroup {
  readonly events: Observable<TelemetryEvent>;
  readonly #members: readonly GroupMember[];
  readonly #clock: Clock;
  readonly #intervalMs: number;
  readonly #events = new Subject<TelemetryEvent>();
  readonly #aggregator: TelemetryAggregator;
  readonly #ended = new Map<string, RunSummary>();
  #stopReason: string | undefined;
  #run: Promise<RunSummary> | undefined;

  /** Subscribes to the graphs' events at once: make the group before running any of them. */
  constructor(members: readonly GroupMember[], clock: Clock, intervalMs: number) {
    if (!Array.isArray(members) || members.length === 0) throw new TypeError('GraphGroup: expected at least one graph');
    const ids = new Set(members.map((m) => m.id));
    if (ids.size !== members.length) throw new TypeError('GraphGroup: graph ids must be unique');
    if (clock.virtual) throw new TypeError('GraphGroup: graphs that share engines run on the real clock');
    if (!(Number.isFinite(intervalMs) && intervalMs > 0))
      throw new RangeError(`GraphGroup: expected intervalMs > 0 but received ${intervalMs}`);
    this.#members = members;
    this.#clock = clock;
    this.#intervalMs = intervalMs;
    this.#aggregator = new TelemetryAggregator('real');
    for (const { graph } of members) {
      graph.events.subscribe((event: TelemetryEvent) => {
        if (event.type === 'stats') return; // the group's stats say it for every graph
        this.#aggregator.add(event);
        this.#events.next(event);
      });
    }
    this.events = this.#events.asObservable();
  }

  /** Every frame so far, and each graph's own summary (final for a graph that has ended). */
  snapshot(): RunSummary {
    const cameras: Record<string, RunSummary> = {};
    for (const { id, graph } of this.#members) cameras[id] = this.#ended.get(id) ?? graph.control.status().summary;
    return { ...this.#aggregator.snapshot(), cameras };
  }

  /** Runs every graph; resolves when all have ended, with the summary over all of them. */
  run(): Promise<RunSummary> {
    if (this.#run) return Promise.reject(new Error('GraphGroup.run: a group runs once'));
    this.#aggregator.start(this.#clock.nowNs());
    const timer = setInterval(() => this.#stats(), this.#intervalMs);
    timer.unref();
    this.#run = (async () => {
      const summaries = await Promise.all(
        this.#members.map(async ({ id, graph }) => {
          const summary = await graph.run();
          this.#ended.set(id, summary);
          return summary;
        }),
      );
      clearInterval(timer);
      const endReason =
        this.#stopReason !== undefined ? 'stopped' : summaries.some((s) => s.endReason === 'source_error') ? 'source_error' : 'source_end';
      this.#aggregator.end(this.#clock.nowNs(), endReason, this.#stopReason ?? null);
      const summary = this.snapshot();
      this.#events.next({ type: 'stats', atNs: this.#clock.nowNs(), summary });
      this.#events.complete();
      return summary;
    })();
    return this.#run;
  }

  /** Stops every graph (idempotent); resolves with the group's summary. */
  stop(reason = 'stop'): Promise<RunSummary> {
    this.#stopReason ??= reason;
    for (const { graph } of this.#members) void graph.stop(reason);
    return this.#run ?? this.run();
  }

  #stats(): void {
    this.#events.next({ type: 'stats', atNs: this.#clock.nowNs(), summary: this.snapshot() });
  }
}
