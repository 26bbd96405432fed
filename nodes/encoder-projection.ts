// A cheap, deterministic stand-in for a vision encoder, for configs that have no encoder yet.
// Each image token is its region's 48-value descriptor (4×4 sub-cells × RGB means) times a fixed random [48, nEmbd] matrix.
// Different images give different embeddings, for about tokens·48·nEmbd multiply-adds.
// So the decoder's image path can be exercised end to end.
import type { ImageEmbedding, PixelTensor } from './payloads.ts';
import type { EncoderConfig } from '../pipeline/config.ts';
import type { Stage, StageContext } from '../pipeline/types.ts';

/** The projection section of a defaulted config (seed, tokens) and the decoder's width. */
export interface ProjectionEncoderConfig extends Omit<Extract<EncoderConfig, { kind: 'projection' }>, 'kind'> {
  /** Output width: the decoder's n_embd. */
  readonly nEmbd: number;
}

const SUB = 4; // sub-cells per token side
const DESC = SUB * SUB * 3;

/** Fixed projection matrix from a seed (xorshift32, uniform in [-√3, √3]: unit variance). */
function projectionMatrix(nEmbd: number, seed: number): Float32Array {
  const m = new Float32Array(DESC * nEmbd);
  let s = (seed ^ 0x9e3779b9) >>> 0 || 1;
  const scale = Math.sqrt(3) / Math.sqrt(DESC);
  for (let i = 0; i < m.length; i++) {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    m[i] = ((s / 4294967296) * 2 - 1) * scale;
  }
  return m;
}

/** Gemma 3 CHW [1,3,S,S] → per token (g×g grid) a 4×4×3 mean descriptor. */
function gemma3Descriptors(t: PixelTensor, tokens: number): Float32Array {
  const [, c, h, w] = t.pixelDims as [number, number, number, number];
  const g = Math.round(Math.sqrt(tokens));
  const desc = new Float32Array(tokens * DESC);
  const counts = new Float32Array(tokens * SUB * SUB);
  const plane = h * w;
  for (let y = 0; y < h; y++) {
    const ty = Math.min(g - 1, Math.floor((y * g) / h));
    const sy = Math.min(SUB - 1, Math.floor(((y * g) / h - ty) * SUB));
    for (let x = 0; x < w; x++) {
      const tx = Math.min(g - 1, Math.floor((x * g) / w));
      const sx = Math.min(SUB - 1, Math.floor(((x * g) / w - tx) * SUB));
      const cell = (ty * g + tx) * SUB * SUB + sy * SUB + sx;
      counts[cell]!++;
      for (let ch = 0; ch < c; ch++) desc[cell * 3 + ch]! += t.pixelValues[ch * plane + y * w + x]!;
    }
  }
  for (let i = 0; i < counts.length; i++) for (let ch = 0; ch < 3; ch++) desc[i * 3 + ch]! /= counts[i]! || 1;
  return desc;
}

/** Gemma 4 patches [1,P,768] (16×16×3 HWC) → per pooled token (3×3 patches) a 4×4×3 mean descriptor. */
function gemma4Descriptors(t: PixelTensor): { desc: Float32Array; tokens: number } {
  const P = t.pixelDims[1]!;
  const pos = t.positionIds!;
  let cols = 0;
  let valid = 0;
  for (let p = 0; p < P; p++) {
    const col = Number(pos[2 * p]);
    if (col < 0) break;
    valid++;
    if (col + 1 > cols) cols = col + 1;
  }
  if (valid === 0 || cols % 3 !== 0 || valid % cols !== 0 || (valid / cols) % 3 !== 0) {
    throw new Error(`encoder-projection: gemma4 patch grid is not a whole number of 3×3 tokens (${valid} patches, ${cols} columns)`);
  }
  const tokCols = cols / 3;
  const tokens = (valid / cols / 3) * tokCols;
  const desc = new Float32Array(tokens * DESC);
  for (let p = 0; p < valid; p++) {
    const col = Number(pos[2 * p]);
    const row = Number(pos[2 * p + 1]);
    const token = Math.floor(row / 3) * tokCols + Math.floor(col / 3);
    // Within the 48×48 token region this patch covers sub-cells by its 16×16 pixels (12 px per sub-cell).
    const base = p * 768;
    for (let py = 0; py < 16; py++) {
      const sy = Math.floor((((row % 3) * 16 + py) * SUB) / 48);
      for (let px = 0; px < 16; px++) {
        const sx = Math.floor((((col % 3) * 16 + px) * SUB) / 48);
        const d = token * DESC + (sy * SUB + sx) * 3;
        const s = base + (py * 16 + px) * 3;
        desc[d]! += t.pixelValues[s]!;
        desc[d + 1]! += t.pixelValues[s + 1]!;
        desc[d + 2]! += t.pixelValues[s + 2]!;
      }
    }
  }
  const perSub = 12 * 12;
  for (let i = 0; i < desc.length; i++) desc[i]! /= perSub;
  return { desc, tokens };
}

export function createProjectionEncoderStage(cfg: ProjectionEncoderConfig): Stage<PixelTensor, ImageEmbedding> {
  const { nEmbd } = cfg;
  if (!Number.isInteger(nEmbd) || nEmbd <= 0) throw new RangeError(`encoder-projection: nEmbd must be a positive integer, got ${nEmbd}`);
  const { tokens, seed } = cfg;
  if (!Number.isInteger(tokens) || tokens <= 0 || !Number.isInteger(Math.sqrt(tokens))) {
    throw new RangeError(`encoder-projection: tokens must be a positive square number, got ${tokens}`);
  }
  if (!Number.isInteger(seed)) throw new RangeError(`encoder-projection: seed must be an integer, got ${seed}`);
  const matrix = projectionMatrix(nEmbd, seed);

  return {
    name: 'encode',
    async process(input: PixelTensor, _ctx: StageContext): Promise<ImageEmbedding> {
      if (input?.jpeg) throw new Error('encoder-projection: got an undecoded JPEG (for an encoder that decodes on its GPU)');
      let desc: Float32Array;
      let nTokens: number;
      if (input?.contract === 'gemma3') {
        if (input.pixelDims.length !== 4 || input.pixelDims[1] !== 3)
          throw new RangeError(`encoder-projection: gemma3 pixelDims must be [1,3,H,W], got [${input.pixelDims.join(',')}]`);
        nTokens = tokens;
        desc = gemma3Descriptors(input, tokens);
      } else if (input?.contract === 'gemma4') {
        if (input.pixelDims.length !== 3 || input.pixelDims[2] !== 768 || !input.positionIds) {
          throw new RangeError(
            `encoder-projection: gemma4 input needs pixelDims [1,P,768] and positionIds, got [${input.pixelDims.join(',')}]`,
          );
        }
        ({ desc, tokens: nTokens } = gemma4Descriptors(input));
        if (nTokens !== input.imageTokens)
          throw new Error(`encoder-projection: patch grid gives ${nTokens} tokens, the tensor announces ${input.imageTokens}`);
      } else {
        throw new TypeError(`encoder-projection: unknown tensor contract ${String(input?.contract)}`);
      }
      const out = new Float32Array(nTokens * nEmbd);
      for (let t = 0; t < nTokens; t++) {
        const o = t * nEmbd;
        for (let k = 0; k < DESC; k++) {
          const v = desc[t * DESC + k]!;
          if (v === 0) continue;
          const m = k * nEmbd;
          for (let e = 0; e < nEmbd; e++) out[o + e]! += v * matrix[m + e]!;
        }
      }
      return { data: out, nTokens, nEmbd };
    },
  };
}
