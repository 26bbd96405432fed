// llama-server as a child process on loopback: the remote decoder's reference server in tests and benchmarks.
// It is built from the same llama.cpp tree as the addon (a peer of tools/build-native.mjs). It binds a
// free port (--port 0) and is ready when it prints the address it listens on and /health answers.
import { spawn, type ChildProcess } from 'node:child_process';
import { dirname } from 'node:path';
import { OPENMP_SPIN_COUNT } from '../../native/binding.ts';
import { ensurePeerProgram, perLayerEmbeddingsArgs } from '../../native/peers.ts';

export interface LlamaServerOptions {
  /** Decoder GGUF path. */
  readonly model: string;
  /** Vision projector GGUF path. Absent, the server is text-only. */
  readonly mmproj?: string;
  /** The id /v1/models lists. Default: llama-server's own, the model path. */
  readonly alias?: string;
  /** CPU threads, 1 by default since the tests share the machine. */
  readonly threads?: number;
  /** Parallel slots, i.e. requests decoded at once (default 1). */
  readonly parallel?: number;
  /** Context size over all slots (default 4096). */
  readonly ctx?: number;
  readonly gpuLayers?: number;
  /** Gemma 4's per-layer embedding table on the GPU (`-ot`), where a local decoder put it (default: llama.cpp's place). */
  readonly perLayerEmbeddingsOnGpu?: boolean;
  /** Gemma 4 image tokens per image (--image-min-tokens and --image-max-tokens), to match a local run. */
  readonly imageTokens?: number;
  /** Readiness limit in ms. The default, 120 s, allows for a model load on a busy machine. */
  readonly startTimeoutMs?: number;
}

export interface LlamaServer {
  /** http://127.0.0.1:PORT */
  readonly url: string;
  readonly pid: number;
  /** What it printed so far (stdout and stderr). */
  log(): string;
  /** Stops it (SIGTERM, then SIGKILL after 5 s) and waits for the exit. */
  close(): Promise<void>;
}

const LISTENING = /listening on (http:\/\/[^\s]+)/;
/** What log() keeps: the end of the server's output, which logs every request. */
const LOG_CHARS = 1 << 16;

export async function startLlamaServer(opts: LlamaServerOptions): Promise<LlamaServer> {
  const args = ['-m', opts.model, '--host', '127.0.0.1', '--port', '0', '-t', String(opts.threads ?? 1)];
  // No RAM prompt cache: it would hand a frame seen before its image encoding and prefill for free.
  // A bench's rounds replay the same pattern frames. A camera never repeats a frame, and the binding
  // it is compared with keeps only the text prefix, as the server's slot does.
  args.push('-np', String(opts.parallel ?? 1), '-c', String(opts.ctx ?? 4096), '--no-webui', '--cache-ram', '0');
  if (opts.mmproj) args.push('--mmproj', opts.mmproj);
  if (opts.alias) args.push('--alias', opts.alias);
  if (opts.gpuLayers !== undefined) args.push('-ngl', String(opts.gpuLayers));
  args.push(...perLayerEmbeddingsArgs(opts.perLayerEmbeddingsOnGpu ?? false));
  if (opts.imageTokens !== undefined)
    args.push('--image-min-tokens', String(opts.imageTokens), '--image-max-tokens', String(opts.imageTokens));
  const bin = await ensurePeerProgram('llama-server', (msg) => process.stderr.write(`percept: ${msg}\n`));
  // The binding's short OpenMP spin (OPENMP_SPIN_COUNT) unless the environment chooses, so the threading
  // matches the in-process decoder it is compared with.
  const env = { ...process.env };
  if (env.GOMP_SPINCOUNT === undefined && env.OMP_WAIT_POLICY === undefined) env.GOMP_SPINCOUNT = String(OPENMP_SPIN_COUNT);
  const child = spawn(bin, args, { cwd: dirname(bin), env, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const close = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
  };
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`llama-server did not start within ${opts.startTimeoutMs ?? 120_000} ms:\n${output.slice(-2000)}`)),
        opts.startTimeoutMs ?? 120_000,
      );
      const onData = (chunk: Buffer) => {
        output = (output + chunk.toString()).slice(-LOG_CHARS);
        const m = LISTENING.exec(output);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]!);
        }
      };
      child.stdout!.on('data', onData);
      child.stderr!.on('data', onData);
      child.once('error', (err) => reject(err));
      void exited.then((code) => reject(new Error(`llama-server exited (${code}) before it listened:\n${output.slice(-2000)}`)));
    });
    await waitHealthy(url, child);
    return { url, pid: child.pid!, log: () => output, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** /health answers 503 while the model loads, 200 when the server takes requests. */
async function waitHealthy(url: string, child: ChildProcess): Promise<void> {
  for (;;) {
    if (child.exitCode !== null) throw new Error(`llama-server exited (${child.exitCode})`);
    const ok = await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return;
    await new Promise((r) => setTimeout(r, 100));
  }
}
