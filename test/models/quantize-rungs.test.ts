// The ladder's rungs (models/quantize-rungs.ts): percept's quantizer writes llama-quantize's type mix with
// values within each type's quantization error of the reference, keeps the metadata, refuses a quantized
// reference, and a rung is made once (its stamp) and made again when the reference changes.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFile, mkdir, rm, stat, utimes } from 'node:fs/promises';
import { join } from 'node:path';
import { readGGUF, readTensorData, type GGUFFile } from '../../models/gguf.ts';
import { GGMLType, dequantize, f32ToF16Bits, type CodecType } from '../../models/quant.ts';
import { convertBlocks, makeRung, quantizeGGUF, readReference, runLlamaQuantize, type LadderQuant } from '../../models/quantize-rungs.ts';
import { planCheckpoint } from '../../models/synth.ts';
import { REPO_ROOT, ensureSynthModel, findPeer } from '../support/fixtures.ts';

const DIR = join(REPO_ROOT, '.cache', 'test-quantize-rungs');

async function values(path: string, file: GGUFFile, name: string): Promise<Float32Array> {
  const t = file.tensor(name)!;
  const n = t.shape.reduce((a, b) => a * b, 1);
  return dequantize(t.type as CodecType, await readTensorData(path, file, name), n);
}

/** ‖a − b‖ / ‖a‖ */
function relativeRms(a: Float32Array, b: Float32Array): number {
  let err = 0;
  let norm = 0;
  for (let i = 0; i < a.length; i++) {
    err += (a[i]! - b[i]!) ** 2;
    norm += a[i]! ** 2;
  }
  return Math.sqrt(err / norm);
}

describe("percept's quantizer on the gemma4-tiny F16 checkpoint", async () => {
  await mkdir(DIR, { recursive: true });
  const source = await ensureSynthModel('gemma4-tiny', 'f16');
  const src = await readGGUF(source);

  for (const [quant, wtype, fileType, bound] of [
    ['q8_0', 'q8_0', 7, 0.01],
    ['q4_k_m', 'q4_k', 15, 0.1],
  ] as const) {
    test(`${quant}: the synthetic preset's ${wtype} mix, the file type, every value within ${bound} relative RMS`, async () => {
      const out = join(DIR, `tiny.${quant}.gguf`);
      const progress: number[] = [];
      await quantizeGGUF({ source, out, quant, workers: 2, onProgress: (done) => progress.push(done) });
      const q = await readGGUF(out);
      const plan = planCheckpoint({ preset: 'gemma4-tiny', wtype });
      assert.deepEqual(
        q.tensors.map((t) => [t.name, t.type]),
        plan.tensors.map((t) => [t.name, t.type]),
      );
      assert.equal(q.get('general.file_type'), fileType);
      assert.equal(q.fileSize, (await stat(out)).size);
      assert.ok(progress.length > 1 && progress.at(-1) === q.fileSize, 'progress reaches the file size');
      // Metadata: every KV kept byte for byte but the file type, and the synthetic stamp (it describes the source).
      for (const kv of src.kvs) {
        if (kv.key === 'general.file_type') continue;
        if (kv.key.startsWith('percept.synth.')) assert.equal(q.kv(kv.key), undefined, kv.key);
        else assert.deepEqual(q.kv(kv.key)?.raw, kv.raw, kv.key);
      }
      for (const t of src.tensors) {
        const a = await values(source, src, t.name);
        const b = await values(out, q, t.name);
        const qt = q.tensor(t.name)!;
        if (qt.type === t.type)
          assert.deepEqual(await readTensorData(out, q, t.name), await readTensorData(source, src, t.name), `${t.name} copied as is`);
        else assert.ok(relativeRms(a, b) < bound, `${t.name} (${qt.type}): relative RMS ${relativeRms(a, b)}`);
      }
    });
  }

  test('a quantized reference is refused, naming a tensor and its type', async () => {
    const q8 = await ensureSynthModel('gemma4-tiny', 'q8_0');
    await assert.rejects(readReference(q8), /must be unquantized .* tensor 'token_embd\.weight' is Q8_0/);
    await assert.rejects(quantizeGGUF({ source: q8, out: join(DIR, 'never.gguf'), quant: 'q4_k_m' }), /must be unquantized/);
  });

  test('BF16 weights are read as the top half of an f32', () => {
    const floats = [1, -2.5, 0.15625, 3e-3];
    const bf16 = new Uint8Array(floats.length * 2);
    const view = new DataView(bf16.buffer);
    floats.forEach((x, i) => view.setUint16(i * 2, new Uint32Array(new Float32Array([x]).buffer)[0]! >>> 16, true));
    const out = new Float32Array(convertBlocks(bf16, GGMLType.BF16, GGMLType.F32, floats.length).buffer);
    const truncated = floats.map(
      (x) => new Float32Array(new Uint32Array([new Uint32Array(new Float32Array([x]).buffer)[0]! & 0xffff0000]).buffer)[0],
    );
    assert.deepEqual([...out], truncated);
    const f16 = convertBlocks(bf16, GGMLType.BF16, GGMLType.F16, floats.length);
    assert.deepEqual(
      [...new Uint16Array(f16.buffer)],
      truncated.map((x) => f32ToF16Bits(x!)),
    );
  });

  test('a rung is made once: reused while the reference is unchanged, made again after it changes', async () => {
    const dir = join(DIR, 'rungs');
    await rm(dir, { recursive: true, force: true });
    const ref = join(DIR, 'ref.f16.gguf');
    await copyFile(source, ref);
    const quant: LadderQuant = 'q8_0';
    const first = await makeRung({ source: ref, quant, dir, quantizer: { kind: 'percept', workers: 1 } });
    assert.equal(first.reused, false);
    const made = (await stat(first.path)).mtimeMs;
    const again = await makeRung({ source: ref, quant, dir, quantizer: { kind: 'percept', workers: 1 } });
    assert.deepEqual(again, { ...first, reused: true });
    assert.equal((await stat(again.path)).mtimeMs, made, 'not rewritten');
    await utimes(ref, new Date(), new Date(Date.now() + 5000));
    const remade = await makeRung({ source: ref, quant, dir, quantizer: { kind: 'percept', workers: 1 } });
    assert.equal(remade.reused, false);
    assert.equal(remade.path, first.path);
  });
});

describe('llama-quantize, the peer built from the same llama.cpp tree', () => {
  const binary = findPeer('llama-quantize');
  const skip = binary ? false : 'llama-quantize not built (PERCEPT_PEERS="llama-quantize" node tools/build-native.mjs)';

  test(
    "percept's type mix is llama-quantize's, tensor for tensor, and so are the values within the error of each type",
    { skip },
    async () => {
      await mkdir(DIR, { recursive: true });
      const source = await ensureSynthModel('gemma4-tiny', 'f16');
      const src = await readGGUF(source);
      for (const quant of ['q8_0', 'q4_k_m'] as const) {
        const ours = join(DIR, `ours.${quant}.gguf`);
        const theirs = join(DIR, `llama-quantize.${quant}.gguf`);
        await quantizeGGUF({ source, out: ours, quant, workers: 2 });
        let lastDone = 0;
        await runLlamaQuantize({ binary: binary!, source, out: theirs, quant, threads: 2, onProgress: (done) => (lastDone = done) });
        const a = await readGGUF(ours);
        const b = await readGGUF(theirs);
        assert.ok(lastDone === b.tensors.length, 'progress counts the tensors');
        // llama-quantize writes the tensors in its own order.
        const byName = (f: GGUFFile) => f.tensors.map((t) => [t.name, t.type]).sort(([x], [y]) => String(x).localeCompare(String(y)));
        assert.deepEqual(byName(a), byName(b));
        assert.equal(a.get('general.file_type'), b.get('general.file_type'));
        for (const t of a.tensors) {
          const ref = await values(source, src, t.name);
          const oursErr = relativeRms(ref, await values(ours, a, t.name));
          const theirsErr = relativeRms(ref, await values(theirs, b, t.name));
          // ggml searches its K-quant scales; ours rounds: at most a little worse, never far off.
          assert.ok(oursErr <= theirsErr * 1.25 + 1e-6, `${quant} ${t.name}: ours ${oursErr}, llama-quantize ${theirsErr}`);
        }
      }
    },
  );
});
