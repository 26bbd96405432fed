// llama.cpp's own programs, built from the same tree as the addon: the peers that benches compare
// against. Install builds none; the first bench that needs one builds it (tools/build-native.mjs --peers).
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { ADDON_PATH } from './binding.ts';
import { PER_LAYER_EMBEDDINGS } from './llama.ts';

/** The build the addon came from. PERCEPT_NATIVE may point at another build: its programs are the peers. */
export const PEER_BUILD_DIR = dirname(dirname(ADDON_PATH));

/** A peer program already built next to the addon, or undefined. */
export function findPeerProgram(name: string): string | undefined {
  return [join(PEER_BUILD_DIR, 'bin', name), join(PEER_BUILD_DIR, 'bin', 'Release', name)].find((p) => existsSync(p));
}

/** A peer program, built first where it is missing; the build runs in a child process, off the event loop. */
export async function ensurePeerProgram(name: string, log: (msg: string) => void = () => undefined): Promise<string> {
  if (!/^[a-z][a-z0-9-]*$/.test(name)) throw new TypeError(`ensurePeerProgram: '${name}' is not a program name`);
  const found = findPeerProgram(name);
  if (found) return found;
  if (!existsSync(join(PEER_BUILD_DIR, 'CMakeCache.txt')))
    throw new Error(`${name} is not built and ${PEER_BUILD_DIR} is no CMake build to build it in`);
  log(`building ${name} in ${PEER_BUILD_DIR} (once)`);
  try {
    await promisify(execFile)('cmake', ['--build', PEER_BUILD_DIR, '--config', 'Release', '--parallel', '--target', name], {
      maxBuffer: 64 << 20,
    });
  } catch (err) {
    const { stderr, stdout } = err as { stderr?: string; stdout?: string };
    const tail = `${stdout ?? ''}${stderr ?? ''}`.trim().split('\n').slice(-20).join('\n');
    throw new Error(`building ${name} in ${PEER_BUILD_DIR} failed:\n${tail}`, { cause: err });
  }
  const built = findPeerProgram(name);
  if (!built) throw new Error(`cmake built target ${name}, but no program ${name} is in ${PEER_BUILD_DIR}/bin`);
  return built;
}

/** The arguments that put a llama.cpp program's per-layer embedding table where LlamaModel put ours (info.perLayerEmbeddingsOnGpu). */
export function perLayerEmbeddingsArgs(onGpu: boolean): string[] {
  // percept builds CUDA only, so the first GPU's buffer type is CUDA0.
  return onGpu ? ['-ot', `${PER_LAYER_EMBEDDINGS}=CUDA0`] : [];
}
