// The demo model on a CUDA build against PyTorch's fixture (test/fixtures/demo-model/parity.json): the sample bag
// through the default config in lockstep, every decoder layer on the GPU and the mmproj encoder on CUDA.
// Prints one JSON line: the frames whose action equals PyTorch's, text and decision, and eval's accuracy.
//   node --import tsx tools/device/parity-gpu.ts
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { evaluate, readRecording } from '../../app/eval/eval.ts';

type Action = { action: string; target?: { label: string; bbox?: number[] }; hazards?: string[] };

const root = join(import.meta.dirname, '..', '..');
const parity = JSON.parse(readFileSync(join(root, 'test/fixtures/demo-model/parity.json'), 'utf8')) as { frames: { text: string }[] };
const torch = parity.frames.map((f) => JSON.parse(f.text) as Action);
const decision = (a: Action | undefined) => a && { action: a.action, label: a.target?.label, hazards: a.hazards ?? [] };

const dir = mkdtempSync(join(tmpdir(), 'percept-parity-gpu-'));
try {
  const config = JSON.parse(readFileSync(join(root, 'configs/default.json'), 'utf8')) as Record<string, Record<string, unknown>>;
  delete config.$schema;
  config.actions = { schema: join(root, 'configs/actions/robot-action.schema.json') };
  config.encoder = { kind: 'mtmd', mmproj: 'demo:gemma4-robot', gpuLayers: 99 };
  config.decoder = { ...config.decoder, gpuLayers: 99 };
  const configPath = join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify(config));
  const { code, metrics } = await evaluate({ bag: join(root, 'bags/sample.mcap'), out: dir, config: configPath, progress: false });
  const frames = [...(await readRecording(join(dir, 'run.mcap'))).frames.values()].sort((a, b) => a.frameId - b.frameId);
  const got = frames.map((f) => f.action as Action | undefined);
  const boxDiff = got.map((a, i) => {
    const [p, q] = [a?.target?.bbox ?? [], torch[i]?.target?.bbox ?? []];
    return p.length === q.length ? Math.max(0, ...p.map((v, k) => Math.abs(v - q[k]!))) : Infinity;
  });
  console.log(
    JSON.stringify({
      code,
      frames: got.length,
      same_text: got.filter((a, i) => isDeepStrictEqual(a, torch[i])).length,
      same_decision: got.filter((a, i) => isDeepStrictEqual(decision(a), decision(torch[i]))).length,
      box_diff_max: Math.max(...boxDiff),
      differing: got.flatMap((a, i) => (isDeepStrictEqual(a, torch[i]) ? [] : [{ frame: i, percept: a, torch: torch[i] }])),
      accuracy: metrics.accuracy,
      valid_rate: metrics.validRate,
    }),
  );
  process.exitCode = code;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
