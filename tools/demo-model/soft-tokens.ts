// The demo model's soft tokens (the ONNX vision encoder's output rows) for frames, as raw float32 files, so that
// Python tools (target_torch.py) can run the text decoder on exactly the image rows percept feeds it:
//   node --import tsx tools/demo-model/soft-tokens.ts --out DIR [--bag bags/sample.mcap] [--config configs/default.json] [--threads N]
//     writes DIR/frame-NNN.f32 per bag frame (little-endian float32, rows × width, row-major) and DIR/index.json;
//     when the bag is the sample bag it checks the first values against test/fixtures/demo-model/parity.json
//     (PyTorch's soft tokens, within 1e-4, as test/e2e/demo-model.test.ts does).
//   node --import tsx tools/demo-model/soft-tokens.ts --out DIR --scenes SCENES_DIR [--limit N]
//     encodes a make-scenes dataset (SCENES_DIR/scenes.jsonl + images/<seed>.jpg, or sample-frames.ts output):
//     DIR/<seed>.f32 per line, streaming (one frame in memory at a time), DIR/index.jsonl (one line per seed,
//     written as it goes) and DIR/index.json at the end; progress every 100 frames.
// The path is test/e2e/demo-model.test.ts': the default config's preprocess (contract gemma4, the ladder's
// initial image-token budget) and createOnnxEncoderStage on resolveModel('demo:gemma4-robot', 'vision'), ep cpu.
import { createReadStream, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { appendFile, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { resolveModel } from '../../models/resolve.ts';
import { createOnnxEncoderStage } from '../../nodes/encoder-onnx.ts';
import type { CameraFrame, ImageEmbedding } from '../../nodes/payloads.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import { createBagSource } from '../../nodes/source-bag.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';

const ROOT = resolve(new URL('../..', import.meta.url).pathname);
const PARITY = join(ROOT, 'test/fixtures/demo-model/parity.json');
const SAMPLE_BAG = join(ROOT, 'bags/sample.mcap');
/** As test/e2e/demo-model.test.ts' ENCODER_TOLERANCE.onnx. */
const TOLERANCE = 1e-4;

const { values } = parseArgs({
  options: {
    out: { type: 'string' },
    bag: { type: 'string' },
    scenes: { type: 'string' },
    config: { type: 'string', default: join(ROOT, 'configs/default.json') },
    threads: { type: 'string' },
    limit: { type: 'string' },
  },
  strict: true,
});
if (!values.out) throw new Error('--out DIR is required');
if (values.bag && values.scenes) throw new Error('give --bag or --scenes, not both');
const out = values.out;
const threads = values.threads === undefined ? undefined : Number(values.threads);
const limit = values.limit === undefined ? Infinity : Number(values.limit);
mkdirSync(out, { recursive: true });

const config = loadConfig(values.config!);
const imageTokens = config.ladder.initial.imageTokens;
const preprocess = createPreprocessStage({ ...config.preprocess, contract: 'gemma4' });
const model = await resolveModel('demo:gemma4-robot', 'vision');
const encoder = await createOnnxEncoderStage({ model, ep: 'cpu', copyInputs: true, ...(threads ? { threads } : {}) });

async function encode(frame: CameraFrame, i: number): Promise<ImageEmbedding> {
  const ctx = (extra: object = {}) => standaloneContext({ frame: { frameId: i, sourceId: 'soft-tokens' }, ...extra });
  const t = await preprocess.process(frame, ctx({ knobs: { imageTokens, maxNewTokens: 1 } }));
  return encoder.process(t, ctx());
}

const bytesOf = (e: ImageEmbedding): Uint8Array => new Uint8Array(e.data.buffer, e.data.byteOffset, e.nTokens * e.nEmbd * 4);
const t0 = Date.now();
const secs = () => ((Date.now() - t0) / 1000).toFixed(1);

try {
  if (values.scenes) {
    // A make-scenes dataset, one line at a time.
    const lines = createInterface({ input: createReadStream(join(values.scenes, 'scenes.jsonl')), crlfDelay: Infinity });
    const indexLines = join(out, 'index.jsonl');
    writeFileSync(indexLines, '');
    const index: object[] = [];
    let n = 0;
    for await (const line of lines) {
      if (!line.trim()) continue;
      if (n >= limit) break;
      const o = JSON.parse(line) as { seed: number; image: string };
      const file = `${o.seed}.f32`;
      const path = join(out, file);
      const jpeg = await readFile(join(values.scenes, o.image));
      const e = await encode({ encoding: 'jpeg', data: jpeg }, n);
      const entry = { seed: o.seed, file, rows: e.nTokens, width: e.nEmbd };
      await writeFile(path, bytesOf(e));
      await appendFile(indexLines, JSON.stringify(entry) + '\n');
      index.push(entry);
      n++;
      if (n % 100 === 0)
        console.log(
          JSON.stringify({ event: 'progress', frames: n, seconds: Number(secs()), perFrameMs: Math.round((Date.now() - t0) / n) }),
        );
    }
    writeFileSync(
      join(out, 'index.json'),
      JSON.stringify({ format: 'percept-demo-soft-tokens/1', source: values.scenes, imageTokens, frames: index }) + '\n',
    );
    console.log(JSON.stringify({ event: 'done', frames: n, seconds: Number(secs()), out }));
  } else {
    // The frames of a bag (the sample bag by default), in order.
    const bag = resolve(values.bag ?? SAMPLE_BAG);
    const parity =
      bag === SAMPLE_BAG && existsSync(PARITY)
        ? (JSON.parse(readFileSync(PARITY, 'utf8')) as {
            frames: { encoder: { rows: number; width: number; first: Record<string, number[]> } }[];
          })
        : undefined;
    const source = await createBagSource({ path: bag, pace: 'fast' });
    const index: object[] = [];
    let worst = { diff: 0, at: '' };
    try {
      for await (const item of source.frames(new VirtualClock(), new AbortController().signal)) {
        if ('rejected' in item) throw new Error(`${bag}: ${item.rejected}`);
        const i = index.length;
        if (i >= limit) break;
        const e = await encode(item.payload, i);
        const file = `frame-${String(i).padStart(3, '0')}.f32`;
        writeFileSync(join(out, file), bytesOf(e));
        index.push({ index: i, file, rows: e.nTokens, width: e.nEmbd });
        const want = parity?.frames[i]?.encoder;
        if (want) {
          if (want.rows !== e.nTokens || want.width !== e.nEmbd)
            throw new Error(`frame ${i}: ${e.nTokens}×${e.nEmbd} soft tokens, the fixture has ${want.rows}×${want.width}`);
          for (const [row, vs] of Object.entries(want.first)) {
            vs.forEach((v, k) => {
              const diff = Math.abs(e.data[Number(row) * e.nEmbd + k]! - v);
              if (diff > worst.diff) worst = { diff, at: `frame ${i} row ${row} value ${k}` };
            });
          }
        }
      }
    } finally {
      await source.close();
    }
    const check = parity
      ? {
          frames: Math.min(index.length, parity.frames.length),
          maxDiff: worst.diff,
          at: worst.at,
          tolerance: TOLERANCE,
          ok: worst.diff <= TOLERANCE,
        }
      : undefined;
    writeFileSync(
      join(out, 'index.json'),
      JSON.stringify({ format: 'percept-demo-soft-tokens/1', source: bag, imageTokens, check, frames: index }, null, 1) + '\n',
    );
    console.log(
      JSON.stringify({
        event: 'done',
        frames: index.length,
        seconds: Number(secs()),
        out,
        parityCheck: check ?? 'not the sample bag: no fixture to check',
      }),
    );
    if (check && !check.ok) {
      console.error(`soft tokens differ from PyTorch's by ${worst.diff} at ${worst.at} (tolerance ${TOLERANCE})`);
      process.exitCode = 1;
    }
  }
} finally {
  await encoder.close();
}
