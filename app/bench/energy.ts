// Board power sampled while a benchmark runs, integrated into joules.
//
// Sources, tried in this order by 'auto':
//  - tegrastats on Jetson, one line per sample with per-rail power in mW. It covers CPU and GPU alike.
//    Board power is the module's input rail where it has one, else the sum of the module's rails.
//  - NVML through nvidia-smi on discrete GPUs, summed over the GPUs the process can see (CUDA_VISIBLE_DEVICES).
//    It is GPU board power only, so it says nothing about a run on the CPU.
// Where neither applies the reading is "not available" with the reason. No number is ever made up.
//
// Power is held from each sample to the next, per channel, and integrated over the windows begin()/end() mark.
// Samples are timed on our clock as they arrive.
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';

export const ENERGY_SOURCES = ['auto', 'tegrastats', 'nvidia-smi', 'off'] as const;
export type EnergySource = (typeof ENERGY_SOURCES)[number];

export function checkEnergySource(v: unknown): EnergySource {
  if (typeof v !== 'string' || !(ENERGY_SOURCES as readonly string[]).includes(v)) {
    throw new RangeError(`energy source must be one of ${ENERGY_SOURCES.join(', ')}, got ${JSON.stringify(v)}`);
  }
  return v as EnergySource;
}

// ---------------------------------------------------------------------------------------------------------
// Parsers

export type NvidiaSmiSample = { readonly gpu: string; readonly watts: number } | { readonly gpu: string; readonly error: string };

/** One line of `nvidia-smi --query-gpu=index,power.draw --format=csv,noheader,nounits`, e.g. "0, 71.23". */
export function parseNvidiaSmiLine(line: string): NvidiaSmiSample | undefined {
  const m = /^\s*(\d+)\s*,\s*(.+?)\s*$/.exec(line);
  if (!m) return undefined;
  const watts = Number(m[2]);
  // Unsupported fields print "[N/A]" or "[Not Supported]".
  return /^-?\d+(\.\d+)?$/.test(m[2]!) && Number.isFinite(watts) ? { gpu: m[1]!, watts } : { gpu: m[1]!, error: m[2]! };
}

/**
 * Power rails of one tegrastats line in mW, each the current value of "NAME 1234mW/1200mW[/…]".
 * JetPack 4's unit-less "POM_5V_IN 1868/1868" is read too.
 */
export function parseTegrastatsRails(line: string): Map<string, number> {
  const rails = new Map<string, number>();
  for (const m of line.matchAll(/(?:^|\s)([A-Z][A-Z0-9_]*)\s+(\d+)(mW)?(?:\/\d+(?:mW)?)*(?=\s|$)/g)) {
    if (m[3] || m[1]!.startsWith('POM_')) rails.set(m[1]!, Number(m[2]));
  }
  return rails;
}

// The input rail: VDD_IN on Orin Nano/NX, VIN on Thor carriers with an input monitor, POM_5V_IN on Nano/TX2.
const INPUT_RAILS = ['VDD_IN', 'VIN', 'POM_5V_IN'];
// Without one, the rails that make up the module.
const MODULE_RAIL_SETS = [
  ['VDD_GPU_SOC', 'VDD_CPU_CV', 'VIN_SYS_5V0'], // AGX Orin
  ['VDD_GPU', 'VDD_CPU_SOC_MSS', 'VIN_SYS_5V0'], // Thor
];

/** Board power in W from a line's rails, and the rails it came from; undefined if no known rail set is there. */
export function tegrastatsBoardPower(rails: ReadonlyMap<string, number>): { watts: number; rails: string[] } | undefined {
  const input = INPUT_RAILS.find((r) => rails.has(r));
  if (input) return { watts: rails.get(input)! / 1000, rails: [input] };
  const set = MODULE_RAIL_SETS.find((s) => s.every((r) => rails.has(r)));
  if (set) return { watts: set.reduce((sum, r) => sum + rails.get(r)!, 0) / 1000, rails: [...set] };
  return undefined;
}

// ---------------------------------------------------------------------------------------------------------
// Integration

/** Zero-order-hold integration of power samples (per channel) over measured windows. Times in ms. */
export class PowerIntegrator {
  readonly #channels = new Map<string, { t: number; watts: number }[]>();
  readonly #windows: [number, number][] = [];
  #open: number | undefined;

  add(t: number, channel: string, watts: number): void {
    let samples = this.#channels.get(channel);
    if (!samples) this.#channels.set(channel, (samples = []));
    if (samples.length > 0 && t < samples[samples.length - 1]!.t)
      throw new RangeError(`power samples must come in time order (${t} < ${samples[samples.length - 1]!.t})`);
    samples.push({ t, watts });
  }

  begin(t: number): void {
    if (this.#open !== undefined) throw new Error('begin() while a window is open');
    this.#open = t;
  }

  end(t: number): void {
    if (this.#open === undefined) throw new Error('end() without begin()');
    if (t < this.#open) throw new RangeError(`window ends (${t}) before it begins (${this.#open})`);
    this.#windows.push([this.#open, t]);
    this.#open = undefined;
  }

  /** Joules over the closed windows; undefined while no channel has a sample. */
  result(): { joules: number; seconds: number; samples: number } | undefined {
    if (this.#channels.size === 0) return undefined;
    let joules = 0;
    let inWindows = 0;
    for (const samples of this.#channels.values()) {
      for (const [a, b] of this.#windows) {
        // P(t) is the last sample at or before t. Before the first sample, it is the first sample's value.
        let i = 0;
        while (i + 1 < samples.length && samples[i + 1]!.t <= a) i++;
        for (let t = a; t < b;) {
          const change = i + 1 < samples.length ? samples[i + 1]!.t : Infinity;
          const until = Math.min(b, change);
          joules += (samples[i]!.watts * (until - t)) / 1000;
          t = until;
          if (change <= t) i++;
        }
        inWindows += samples.filter((s) => s.t >= a && s.t <= b).length;
      }
    }
    const seconds = this.#windows.reduce((sum, [a, b]) => sum + (b - a), 0) / 1000;
    return { joules, seconds, samples: inWindows };
  }
}

// ---------------------------------------------------------------------------------------------------------
// Meter

export type EnergyReading =
  | {
      readonly available: true;
      readonly source: string;
      readonly joules: number;
      readonly seconds: number;
      readonly avgWatts: number;
      readonly samples: number;
    }
  | { readonly available: false; readonly source: string | null; readonly reason: string };

export interface EnergyMeterOptions {
  readonly source?: EnergySource;
  /** Sampling interval. Default 100 ms. */
  readonly intervalMs?: number;
  /** Where the measured work runs: nvidia-smi's GPU power says nothing about a CPU run. Default 'gpu'. */
  readonly device?: 'gpu' | 'cpu';
  /** Environment of the sampling tool (PATH, CUDA_VISIBLE_DEVICES). Default process.env. */
  readonly env?: NodeJS.ProcessEnv;
  /** How long to wait for the tool's first sample. Default 5000 ms. */
  readonly firstSampleTimeoutMs?: number;
}

interface Sampler {
  readonly source: string;
  readonly child: ChildProcess;
}

/**
 * Samples board power from start() to stop(); begin()/end() mark the windows whose energy is reported.
 * start() never throws for a missing or failing tool. Then stop() returns `available: false` and why.
 */
export class EnergyMeter {
  readonly #integrator = new PowerIntegrator();
  #sampler: Sampler | undefined;
  #unavailable: { source: string | null; reason: string } | undefined;
  #failure: string | undefined;

  private constructor() {}

  static async start(options: EnergyMeterOptions = {}): Promise<EnergyMeter> {
    const meter = new EnergyMeter();
    await meter.#connect(options);
    return meter;
  }

  begin(): void {
    this.#integrator.begin(performance.now());
  }

  end(): void {
    this.#integrator.end(performance.now());
  }

  /** Stops the sampling tool and reports the energy of the closed windows. */
  async stop(): Promise<EnergyReading> {
    const sampler = this.#sampler;
    if (sampler) {
      this.#sampler = undefined;
      await stopChild(sampler.child);
    }
    if (this.#unavailable) return { available: false, ...this.#unavailable };
    const source = sampler?.source ?? null;
    if (this.#failure) return { available: false, source, reason: this.#failure };
    const r = this.#integrator.result();
    if (!r) return { available: false, source, reason: 'no power sample arrived' };
    if (r.seconds === 0) return { available: false, source, reason: 'no measured window (begin/end) closed' };
    return { available: true, source: source!, joules: r.joules, seconds: r.seconds, avgWatts: r.joules / r.seconds, samples: r.samples };
  }

  async #connect(options: EnergyMeterOptions): Promise<void> {
    const source = checkEnergySource(options.source ?? 'auto');
    const intervalMs = options.intervalMs ?? 100;
    if (!Number.isInteger(intervalMs) || intervalMs < 1)
      throw new RangeError(`intervalMs must be an integer ≥ 1, got ${String(intervalMs)}`);
    if (source === 'off') {
      this.#unavailable = { source: null, reason: 'energy sampling is off (--energy off)' };
      return;
    }
    const env = options.env ?? process.env;
    const timeoutMs = options.firstSampleTimeoutMs ?? 5000;
    const tried: string[] = [];
    if (source === 'auto' || source === 'tegrastats') {
      const r = await this.#tryTegrastats(intervalMs, env, timeoutMs);
      if (r === true) return;
      tried.push(r);
    }
    if (source === 'auto' || source === 'nvidia-smi') {
      if ((options.device ?? 'gpu') === 'cpu') {
        tried.push('nvidia-smi: reports GPU board power, but the measured work runs on the CPU');
      } else {
        const r = await this.#tryNvidiaSmi(intervalMs, env, timeoutMs);
        if (r === true) return;
        tried.push(r);
      }
    }
    this.#unavailable = { source: null, reason: tried.join('; ') };
  }

  #tryTegrastats(intervalMs: number, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<true | string> {
    return this.#launch('tegrastats', ['--interval', String(intervalMs)], env, timeoutMs, (line, t) => {
      if (line.trim() === '') return undefined;
      const rails = parseTegrastatsRails(line);
      const board = tegrastatsBoardPower(rails);
      if (!board)
        return {
          unusable: rails.size > 0 ? `no known board-power rail among ${[...rails.keys()].join(', ')}` : 'no power rail in its output',
        };
      this.#integrator.add(t, 'board', board.watts);
      return { source: `tegrastats ${board.rails.join('+')}` };
    });
  }

  #tryNvidiaSmi(intervalMs: number, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<true | string> {
    const visible = env.CUDA_VISIBLE_DEVICES;
    if (visible !== undefined && (visible.trim() === '' || visible.trim() === '-1')) {
      return Promise.resolve(`nvidia-smi: CUDA_VISIBLE_DEVICES=${JSON.stringify(visible)} hides every GPU`);
    }
    const args = ['--query-gpu=index,power.draw', '--format=csv,noheader,nounits', '-lms', String(intervalMs)];
    if (visible !== undefined) args.push('-i', visible.trim());
    const gpus = new Set<string>();
    return this.#launch('nvidia-smi', args, env, timeoutMs, (line, t) => {
      const s = parseNvidiaSmiLine(line);
      if (!s) return undefined;
      // One GPU without a power reading makes any sum over the GPUs a made-up number.
      if ('error' in s) return { unusable: `power.draw of GPU ${s.gpu} is ${s.error}` };
      gpus.add(s.gpu);
      this.#integrator.add(t, `gpu${s.gpu}`, s.watts);
      return { source: `nvidia-smi power.draw (GPU ${[...gpus].join(', ')})` };
    });
  }

  /**
   * Runs a sampling tool. Resolves true once its first sample is in and the sampler keeps running, else
   * with the reason it is unusable. `onLine` records a sample and names the source, or says why the tool's
   * output is unusable, or ignores the line (undefined).
   */
  #launch(
    command: string,
    args: string[],
    env: NodeJS.ProcessEnv,
    timeoutMs: number,
    onLine: (line: string, t: number) => { source: string } | { unusable: string } | undefined,
  ): Promise<true | string> {
    return new Promise((resolve) => {
      let settled = false;
      let stderr = '';
      // Tools print some failures on stdout, like "No devices were found", so keep what was not a sample.
      let otherOutput = '';
      const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
      const running = () => this.#sampler?.child === child;
      const settle = (result: true | string) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (result !== true) void stopChild(child);
        resolve(result === true ? true : `${command}: ${result}`);
      };
      const timer = setTimeout(() => settle(`no power sample within ${timeoutMs} ms`), timeoutMs);
      child.stderr!.setEncoding('utf8').on('data', (d: string) => {
        stderr = (stderr + d).slice(-2000);
      });
      child.on('error', (err: NodeJS.ErrnoException) => settle(err.code === 'ENOENT' ? 'not found on PATH' : err.message));
      // 'close', not 'exit': stdout is drained by then, so a failure printed there is in otherOutput.
      child.on('close', (code, signal) => {
        const output = stderr.trim() || otherOutput.trim();
        if (!settled) settle(output || `exited (${signal ?? `code ${code}`}) before a power sample`);
        else if (running()) this.#failure ??= `${command} stopped during the measurement: ${output || `code ${code}`}`;
      });
      createInterface({ input: child.stdout! }).on('line', (line) => {
        const r = onLine(line, performance.now());
        if (r === undefined) {
          otherOutput = `${otherOutput}${line}\n`.slice(-2000);
        } else if ('unusable' in r) {
          if (!settled) settle(r.unusable);
          else if (running()) this.#failure ??= `${command} during the measurement: ${r.unusable}`;
        } else if (!settled) {
          this.#sampler = { source: r.source, child };
          settle(true);
        } else if (running()) {
          this.#sampler = { source: r.source, child };
        }
      });
    });
  }
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('close', () => resolve());
    child.kill('SIGTERM');
  });
}

// ---------------------------------------------------------------------------------------------------------
// JSON for the benchmarks

export interface EnergyJson {
  readonly available: boolean;
  readonly source: string | null;
  readonly joules: number | null;
  readonly avg_watts: number | null;
  readonly seconds: number | null;
  readonly samples: number;
  /** Tokens per joule, i.e. (tok/s) per watt. */
  readonly tok_per_watt?: number | null;
  readonly joules_per_frame?: number | null;
  readonly reason?: string;
}

/** The `energy` object of a benchmark's JSON, per decoded token or per frame. */
export function energyJson(reading: EnergyReading, work: { readonly tokens: number } | { readonly frames: number }): EnergyJson {
  const perWork = (value: number | null) => ('tokens' in work ? { tok_per_watt: value } : { joules_per_frame: value });
  if (!reading.available) {
    return {
      available: false,
      source: reading.source,
      joules: null,
      avg_watts: null,
      seconds: null,
      samples: 0,
      ...perWork(null),
      reason: reading.reason,
    };
  }
  const count = 'tokens' in work ? work.tokens : work.frames;
  const value = count > 0 && reading.joules > 0 ? ('tokens' in work ? count / reading.joules : reading.joules / count) : null;
  return {
    available: true,
    source: reading.source,
    joules: reading.joules,
    avg_watts: reading.avgWatts,
    seconds: reading.seconds,
    samples: reading.samples,
    ...perWork(value),
  };
}
