// percept's attention kernel for the vision graph (native/src/vision-attention.cu): where it runs, where
// it is refused, and on a CUDA machine that it computes what ggml computes.
import assert from 'node:assert/strict';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { synthesizeMmproj } from '../../models/mmproj-synth.ts';
import { loadAddon } from '../../native/binding.ts';
import { LlamaVision, type VisionImage } from '../../native/vision.ts';
import { doctor } from '../../app/doctor.ts';
import { tokenCosines } from '../../nodes/payloads.ts';

const dir = join(import.meta.dirname, '../..', '.cache', 'test-vision-attention');
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });

// Head sizes 16, 40 and 72 (the kernel pads each to 64 or 80 inside); patch counts that are not a
// multiple of the kernel's 64-key tile (630 = 30 × 21 patches) and one that is (256), 2 images a call.
const CASES = [
  { preset: 'gemma4-vision-tiny-mmproj', head: 16, image: { layout: 'patches', width: 480, height: 336 }, lo: 0 },
  { preset: 'gemma4-vision-tiny-h40', head: 40, image: { layout: 'patches', width: 480, height: 336 }, lo: 0 },
  { preset: 'siglip-tiny-h72', head: 72, image: { layout: 'chw', width: 224, height: 224 }, lo: -1 },
] as const satisfies readonly { preset: string; head: number; image: VisionImage; lo: number }[];

async function mmproj(preset: string): Promise<string> {
  const file = join(dir, `${preset}.mmproj.gguf`);
  await synthesizeMmproj({ preset, out: file, seed: 5 });
  return file;
}

function pixels(n: number, seed: number, lo: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = lo + ((1 - lo) * (Math.sin(seed * 78.233 + i * 0.917) + 1)) / 2;
  return a;
}

describe('on the CPU', () => {
  test("auto runs ggml's flash attention; 'percept' is refused by name and clip encodes instead", async () => {
    const file = await mmproj('siglip-tiny-h72');
    const auto = await LlamaVision.load(file, { threads: 1 });
    const asked = await LlamaVision.load(file, { threads: 1, flashAttention: 'percept' });
    try {
      assert.equal(auto.info.attentionKernel, 'ggml');
      assert.equal(auto.info.graph, 'percept');
      assert.equal(asked.info.graph, 'clip');
      assert.match(asked.info.graphFallback ?? '', /percept's attention kernel needs a CUDA build .*CPU.*head size 72/);
      const off = await LlamaVision.load(file, { threads: 1, flashAttention: 'off' });
      assert.equal(off.info.attentionKernel, null, 'no flash attention, no kernel');
      off.dispose();
    } finally {
      auto.dispose();
      asked.dispose();
    }
  });

  test('an unknown mode is refused with the modes there are', async () => {
    const file = await mmproj('gemma4-vision-tiny-mmproj');
    await assert.rejects(
      // @ts-expect-error: not a mode
      LlamaVision.load(file, { flashAttention: 'fast' }),
      /'auto'.*'percept' for options\.flashAttention/,
    );
  });
});

const cuda = await (async () => {
  const v = await LlamaVision.load(await mmproj('gemma4-vision-tiny-mmproj'), { useGpu: true, threads: 1 }).catch(() => undefined);
  const runs = v?.info.attentionKernel === 'percept';
  v?.dispose();
  return runs;
})();

test('the addon says whether this build has the kernel, and doctor says so', async () => {
  const { visionAttention, jpegDecoder } = loadAddon().gpuKernels;
  assert.equal(typeof visionAttention, 'boolean');
  assert.equal(typeof jpegDecoder, 'boolean');
  if (cuda) assert.equal(visionAttention, true, "percept's graph ran the kernel: the build has it");
  if (jpegDecoder) assert.equal(visionAttention, true, 'nvJPEG is built only into CUDA builds');
  const report = await doctor();
  assert.match(report.gpu_kernels ?? '', visionAttention ? /^ok \(vision attention kernel \(CUDA\)/ : /^ok \(none: a CPU build/);
});

describe("on CUDA: percept's kernel", { skip: cuda ? false : "this build or machine has no CUDA (percept's kernel is not used)" }, () => {
  for (const { preset, head, image, lo } of CASES) {
    test(`gives ggml's embeddings: ${preset} (head size ${head}), two images of ${image.width}×${image.height} in one call`, async () => {
      const file = await mmproj(preset);
      const ours = await LlamaVision.load(file, { useGpu: true, threads: 1, profile: true });
      // ggml without flash attention: q·kᵀ and the softmax in f32, the reference the kernel's f16 is read against
      const plain = await LlamaVision.load(file, { useGpu: true, threads: 1, flashAttention: 'off' });
      const ggml = await LlamaVision.load(file, { useGpu: true, threads: 1, flashAttention: 'padded' });
      try {
        assert.equal(ours.info.attentionKernel, 'percept');
        assert.equal(ours.info.flashAttentionHead, head, 'the graph keeps the tower head size (the kernel pads inside)');
        assert.equal(ggml.info.attentionKernel, 'ggml');
        assert.equal(ours.info.copiedWeightBytes, plain.info.copiedWeightBytes, 'no padded weight copies');
        if (preset.startsWith('gemma4')) {
          // gemma4v's per-head norms, v's norm and the two RoPEs are the kernel's (5 to 7 nodes a layer)
          assert.ok(ours.info.graphNodes <= ggml.info.graphNodes - 5 * ours.info.layers, `${ours.info.graphNodes} nodes`);
        }
        const images = [pixels(image.width * image.height * 3, 3, lo), pixels(image.width * image.height * 3, 11, lo)];
        const want = await plain.encodeBatch(images, image);
        const got = await ours.encodeBatch(images, image);
        const theirs = await ggml.encodeBatch(images, image);
        assert.equal(got.batched, true);
        for (let i = 0; i < images.length; i++) {
          const shape = { nTokens: want.nTokens, nEmbd: want.nEmbd };
          const worst = Math.min(...tokenCosines({ ...shape, data: got.data[i]! }, { ...shape, data: want.data[i]! }));
          const worstGgml = Math.min(...tokenCosines({ ...shape, data: theirs.data[i]! }, { ...shape, data: want.data[i]! }));
          assert.ok(worst >= 0.9999, `image ${i}: worst per-token cosine ${worst} (ggml's flash attention: ${worstGgml})`);
          // the two images differ: a kernel that mixed them up would not match both
          const across = Math.min(...tokenCosines({ ...shape, data: got.data[i]! }, { ...shape, data: want.data[1 - i]! }));
          assert.ok(across < worst, `image ${i}: as close to the other image (${across}) as to its own`);
        }
        // node by node (profile 'ops') the same nodes, the attention ones by the kernel
        const profiled = await ours.encode(images[0]!, image, 'ops');
        const op = profiled.profile?.ops?.find((o) => o.op === 'FLASH_ATTN_EXT (percept)');
        assert.equal(op?.count, ours.info.layers, 'one kernel call per layer');
        const single = await plain.encode(images[0]!, image);
        const worst = Math.min(...tokenCosines(profiled, single));
        assert.ok(worst >= 0.9999, `node by node: worst per-token cosine ${worst}`);
      } finally {
        for (const v of [ours, plain, ggml]) v.dispose();
      }
    });
  }
});
