// The sample bag's frames as percept's preprocess gives them to the demo model, written as PNGs for
// record-parity.py: PyTorch then reads percept's own pixels, so logits compare without resampling differences.
//   node --import tsx tools/demo-model/parity-frames.ts --out DIR [--bag bags/sample.mcap] [--config configs/default.json]
// writes DIR/NNN.png (the resized frame, rebuilt from its patches) and DIR/frames.json.
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';
import sharp from 'sharp';
import { createBagSource } from '../../nodes/source-bag.ts';
import type { PixelTensor } from '../../nodes/payloads.ts';
import { createPreprocessStage } from '../../nodes/preprocess.ts';
import { VirtualClock } from '../../pipeline/clock.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';

const PATCH = 16;

/** A Gemma 4 tensor's real patches (position id ≥ 0) as bytes, in patch order, and their grid. */
export function gemma4PatchBytes(t: PixelTensor): { bytes: Uint8Array; cols: number; rows: number } {
  if (t.contract !== 'gemma4' || !t.positionIds) throw new TypeError('parity frames: a gemma4 pixel tensor with position ids is required');
  const width = t.pixelDims.at(-1)!;
  let n = 0;
  let cols = 0;
  let rows = 0;
  while (n < t.positionIds.length / 2 && t.positionIds[2 * n]! >= 0n) {
    cols = Math.max(cols, Number(t.positionIds[2 * n]!) + 1);
    rows = Math.max(rows, Number(t.positionIds[2 * n + 1]!) + 1);
    n++;
  }
  if (n !== cols * rows) throw new RangeError(`parity frames: ${n} real patches do not fill a ${cols}×${rows} grid`);
  if (t.pixelValues.length < n * width) {
    throw new RangeError(`parity frames: ${t.pixelValues.length} pixel values for ${n} patches of ${width} (host pixels are required)`);
  }
  const bytes = new Uint8Array(n * width);
  for (let i = 0; i < bytes.length; i++) bytes[i] = Math.round(t.pixelValues[i]! * 255);
  return { bytes, cols, rows };
}

/** sha256 of the real patches' bytes: what record-parity.py computes from the same pixels. */
export const pixelDigest = (t: PixelTensor): string => createHash('sha256').update(gemma4PatchBytes(t).bytes).digest('hex');

/** The frame rebuilt from its patches (HWC inside a patch, patches row-major) as RGB bytes. */
function patchesToImage(bytes: Uint8Array, cols: number, rows: number): Buffer {
  const w = cols * PATCH;
  const img = Buffer.alloc(rows * PATCH * w * 3);
  for (let p = 0; p < cols * rows; p++) {
    const [c, r] = [p % cols, Math.floor(p / cols)];
    for (let y = 0; y < PATCH; y++) {
      const src = p * PATCH * PATCH * 3 + y * PATCH * 3;
      img.set(bytes.subarray(src, src + PATCH * 3), ((r * PATCH + y) * w + c * PATCH) * 3);
    }
  }
  return img;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      out: { type: 'string' },
      bag: { type: 'string', default: 'bags/sample.mcap' },
      config: { type: 'string', default: 'configs/default.json' },
    },
    strict: true,
  });
  if (!values.out) throw new Error('--out DIR is required');
  const config = loadConfig(values.config!);
  const imageTokens = config.ladder.initial.imageTokens;
  const stage = createPreprocessStage({ ...config.preprocess, contract: 'gemma4' });
  mkdirSync(values.out, { recursive: true });
  const frames: object[] = [];
  const source = await createBagSource({ path: values.bag!, pace: 'fast' });
  for await (const item of source.frames(new VirtualClock(), new AbortController().signal)) {
    if ('rejected' in item) throw new Error(`${values.bag}: ${item.rejected}`);
    const i = frames.length;
    const t = await stage.process(
      item.payload,
      standaloneContext({ frame: { frameId: i, sourceId: 'parity' }, knobs: { imageTokens, maxNewTokens: 1 } }),
    );
    const { bytes, cols, rows } = gemma4PatchBytes(t);
    const png = `${String(i).padStart(3, '0')}.png`;
    await sharp(patchesToImage(bytes, cols, rows), { raw: { width: cols * PATCH, height: rows * PATCH, channels: 3 } })
      .png({ compressionLevel: 9 })
      .toFile(join(values.out, png));
    frames.push({ index: i, image: png, width: cols * PATCH, height: rows * PATCH, imageTokens: t.imageTokens, sha256: pixelDigest(t) });
  }
  await source.close();
  writeFileSync(join(values.out, 'frames.json'), JSON.stringify({ imageTokens, frames }, null, 1) + '\n');
  console.log(`wrote ${frames.length} frames to ${values.out}`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
