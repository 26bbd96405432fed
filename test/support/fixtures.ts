// Shared test fixtures: synthetic checkpoints generated on first use into .cache/models (git-ignored).
// synthesize() writes to a temp name and renames, so test files asking for the same model at once both end
// up with a complete file (the second rename replaces the first with identical bytes).
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { resolveModel } from '../../models/resolve.ts';
import type { WeightType } from '../../models/synth.ts';
import { loadConfig } from '../../pipeline/config.ts';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const MODEL_CACHE = join(REPO_ROOT, '.cache', 'models');

/** The config's preprocess section as the schema defaults it, for preprocess stages made outside a run. */
export const PREPROCESS_DEFAULTS = loadConfig({}).preprocess;

/** A config for a short real run of the tiny decoder: `frames` pattern frames, every one decoded (queues, no deadlines). */
export function tinyPatternRunConfig(frames: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    source: { kind: 'pattern', fps: 4, frames, width: 320, height: 240 },
    encoder: { kind: 'projection', seed: 1, tokens: 16 },
    decoder: { model: 'synth:gemma4-tiny', maxNewTokens: 128, nCtx: 2048 },
    actions: { schema: join(REPO_ROOT, 'configs/actions/robot-action.schema.json') },
    budgets: { endToEndMs: 3_600_000, stages: {}, dropPredictedMiss: false },
    edges: { default: { policy: 'queue', capacity: frames } },
    ladder: { enabled: false, initial: { imageTokens: 70, maxNewTokens: 128, draft: true, frameSkip: 0 }, rungs: [] },
    telemetry: { liveTable: 'off' },
    ...extra,
  };
}

/** Path of the synthetic checkpoint `preset` in `wtype` (default seed), generating it once if missing. */
export async function ensureSynthModel(preset: string, wtype: WeightType = 'q8_0'): Promise<string> {
  return resolveModel(`synth:${preset}?wtype=${wtype}`, 'decoder', { cacheDir: MODEL_CACHE });
}

/**
 * A llama.cpp peer program from the same tree as the addon, or undefined if not built:
 * percept-peer-greedy (native/peer/greedy.cc) lands in build/native, llama.cpp's own tools
 * (PERCEPT_PEERS="llama-speculative-simple …") in build/native/bin.
 */
export function findPeer(name: string): string | undefined {
  const dirs = ['', 'bin', 'Release', join('bin', 'Release'), join('llama.cpp', 'bin')];
  return dirs.map((d) => join(REPO_ROOT, 'build', 'native', d, name)).find((p) => existsSync(p));
}

/** A TCP port free on loopback right now (the OS picks it; closed again before it is returned). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

/** Deterministic pseudo-random image rows (xorshift): nTokens × nEmbd floats in [-1, 1]; equal seeds give equal images. */
export function fakeImage(nTokens: number, nEmbd: number, seed: number): Float32Array {
  const out = new Float32Array(nTokens * nEmbd);
  let s = seed >>> 0 || 1;
  for (let i = 0; i < out.length; i++) {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    out[i] = (s / 0xffffffff - 0.5) * 2;
  }
  return out;
}
