// `percept doctor`: what a robotics engineer checks first on a new box. Can every native piece
// load, and which execution providers and devices are there?
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

type Check = () => Promise<string>;

const ok = (detail: string) => `ok (${detail})`;
const fail = (err: unknown) => `FAIL: ${err instanceof Error ? err.message : String(err)}`;

async function attempt(check: Check): Promise<string> {
  try {
    return await check();
  } catch (err) {
    return fail(err);
  }
}

export async function doctor(): Promise<Record<string, string>> {
  const root = new URL('..', import.meta.url).pathname;
  const checks: Record<string, Check> = {
    node: async () => {
      const [major, minor] = process.versions.node.split('.').map(Number);
      if (major < 20 || (major === 20 && minor < 17)) throw new Error(`Node ${process.versions.node}; need >= 20.17`);
      return ok(process.versions.node);
    },
    native_addon: async () => {
      const { loadAddon } = await import('../native/binding.ts');
      const addon = loadAddon();
      return ok(`llama.cpp ${addon.llamaVersion}; ${addon.systemInfo().trim()}`);
    },
    gpu_kernels: async () => {
      const { loadAddon } = await import('../native/binding.ts');
      const { visionAttention, jpegDecoder } = loadAddon().gpuKernels;
      if (!visionAttention) return ok('none: a CPU build (PERCEPT_CUDA=1 npm install builds them for CUDA)');
      return ok(`vision attention kernel (CUDA); JPEG decoder ${jpegDecoder ? 'nvJPEG' : 'none: the CUDA toolkit has no nvJPEG'}`);
    },
    onnxruntime: async () => {
      const ort = await import('onnxruntime-node');
      const backends = ort.listSupportedBackends?.() ?? [];
      return ok(backends.map((b: { name: string; bundled: boolean }) => `${b.name}${b.bundled ? '' : '(not bundled)'}`).join(', '));
    },
    sharp: async () => {
      const sharp = (await import('sharp')).default;
      return ok(`libvips ${sharp.versions.vips}`);
    },
    zeromq: async () => {
      const zmq = await import('zeromq');
      return ok(`libzmq ${zmq.version}, CURVE ${zmq.capability.curve ? 'yes' : 'NO: encrypted endpoints will not work'}`);
    },
    // Optional pieces: missing is not a failure, only the features that need them are unavailable.
    ffmpeg: async () => {
      const run = spawnSync('ffmpeg', ['-hide_banner', '-version'], { encoding: 'utf8' });
      if (run.error) return 'missing (only the ffmpeg source needs it: apt-get install ffmpeg)';
      return ok(run.stdout.split('\n')[0]!.replace(/ Copyright.*/, ''));
    },
    python_client: async () => {
      const run = spawnSync('/usr/bin/python3', ['-c', 'import zmq; print(zmq.zmq_version())'], { encoding: 'utf8' });
      if (run.status !== 0) return 'missing pyzmq (only client/python needs it: apt-get install python3-zmq python3-jsonschema)';
      return ok(`pyzmq on libzmq ${run.stdout.trim()}`);
    },
    configs: async () => {
      const { loadConfig } = await import('../pipeline/config.ts');
      const dir = join(root, 'configs');
      const files = readdirSync(dir).filter((f) => f.endsWith('.json') && !f.endsWith('.schema.json'));
      for (const f of files) loadConfig(join(dir, f));
      return ok(`${files.length} valid`);
    },
    sample_bag: async () => {
      const p = join(root, 'bags', 'sample.mcap');
      if (!existsSync(p)) throw new Error(`${p} missing`);
      return ok(p);
    },
  };
  const report: Record<string, string> = {};
  for (const [name, check] of Object.entries(checks)) report[name] = await attempt(check);
  return report;
}
