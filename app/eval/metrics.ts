// What `percept eval` measures (metrics.json) and what its report plots besides.

/** measured: durations on the real clock. modelled: the virtual clock's charges (virtualServiceMs). */
export type LatencyKind = 'measured' | 'modelled';

/** How the virtual clock charged a stage: sampled from a distribution, a fixed figure, or nothing given (0 ms). */
export type StageCost = 'sampled' | 'fixed' | 'none';

export interface StageQuantiles {
  /** Whether these figures are measured or modelled. */
  readonly latency: LatencyKind;
  readonly count: number;
  readonly p50Ms: number | null;
  readonly p95Ms: number | null;
  readonly p99Ms: number | null;
  readonly maxMs: number | null;
}

export interface Accuracy {
  readonly labeled: number;
  /** Labels whose frame is in the recording. */
  readonly matched: number;
  /** Labeled frames that produced an action. */
  readonly covered: number;
  /** Share of labeled frames whose action is the expected one (a frame without an action is wrong). */
  readonly action: number;
  /** Same for target.label, over the labels that name a target. */
  readonly label: number | null;
  /** Mean bbox IoU over the labels with a bbox (a missing predicted bbox counts 0). */
  readonly meanIoU: number | null;
  /** Share of those with IoU >= 0.5. */
  readonly iou50: number | null;
  readonly confusion: { readonly labels: readonly string[]; readonly matrix: readonly (readonly number[])[] };
}

export interface TokenAgreement {
  readonly reference: string;
  /** Frames decoded in both runs. */
  readonly frames: number;
  /** Share of those whose token sequences are identical. */
  readonly exactMatchRate: number | null;
  /** The common prefix of the two token sequences over the longer one's length, summed over frames.
   * It is 1 when every frame decodes the same. */
  readonly tokenAgreement: number | null;
  /** Share of frames with an action in both runs whose actions are equal. */
  readonly actionAgreement: number | null;
}

/** What the latencies of a run are: where they come from, per stage and overall. */
export interface Timing {
  readonly clock: 'real' | 'virtual';
  /** End to end: measured only when every stage was. */
  readonly latency: LatencyKind;
  /** Per stage: measured (null cost), or modelled and how it was charged (null when the recording does not say). */
  readonly stages: Readonly<Record<string, { readonly latency: LatencyKind; readonly cost: StageCost | null }>>;
  /** The calibration file the virtual clock's costs came from, when known. */
  readonly calibration: string | null;
  /** The seed of the draws from distributions (virtual clock), when the run had one. */
  readonly seed: number | null;
  /** The same in one sentence, as the report and `eval` print it. */
  readonly summary: string;
}

export interface EvalMetrics {
  readonly kind: 'percept.eval';
  /** 2 adds `timing` and each quantile set's `latency`. */
  readonly version: 2;
  readonly bag: string;
  readonly config: string | null;
  readonly labels: string | null;
  readonly recording: string;
  readonly frames: { readonly in: number; readonly out: number; readonly dropped: number; readonly rejected: number };
  /** Actions that passed the schema / frames whose generation was checked (out + dropped 'invalid'). */
  readonly validRate: number | null;
  /** Deadline misses (late outputs and stale drops) / frames in. */
  readonly deadlineMissRate: number | null;
  readonly drops: { readonly byReason: Readonly<Record<string, number>>; readonly causes: Readonly<Record<string, number>> };
  readonly timing: Timing;
  readonly stages: Readonly<Record<string, StageQuantiles>>;
  readonly endToEnd: StageQuantiles;
  readonly accuracy: Accuracy | null;
  readonly tokens: TokenAgreement | null;
  readonly warnings: readonly string[];
}

/** What the report plots, besides the metrics. */
export interface EvalSeries {
  /** Per frame: seconds since the first capture, and end-to-end latency in ms or null when dropped. */
  readonly timeline: readonly {
    readonly frameId: number;
    readonly t: number;
    readonly latencyMs: number | null;
    readonly late: boolean;
    readonly drop: string | null;
  }[];
  readonly spans: ReadonlyMap<string, readonly number[]>;
}
