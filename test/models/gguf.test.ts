// GGUF reader/writer and ggml block codecs (models/gguf.ts, models/quant.ts).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, readFile, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  BufferReadable,
  GGUFFormatError,
  GGUFWriter,
  arr,
  bool,
  f32,
  f64,
  i16,
  i32,
  i64,
  i8,
  raw,
  readGGUF,
  readTensorData,
  str,
  u16,
  u32,
  u64,
  u8,
  type GGUFValue,
} from '../../models/gguf.ts';
import {
  GGMLType,
  KeystreamRng,
  WEIGHT_STD,
  dequantize,
  f16BitsToF32,
  f32ToF16Bits,
  quantize,
  randomBlocks,
  type CodecType,
} from '../../models/quant.ts';

const DIR = join(import.meta.dirname, '../..', '.cache', 'test-gguf');
before(async () => mkdir(DIR, { recursive: true }));
after(async () => rm(DIR, { recursive: true, force: true }));

/** Deterministic test bytes (not from the module under test). */
const bytesOf = (n: number, salt: number) => Uint8Array.from({ length: n }, (_, i) => (i * 131 + salt * 17 + (i >> 8) * 7) & 0xff);

/** Yields `data` in uneven chunks, so the writer's chunk handling is exercised. */
function* chunked(data: Uint8Array): Generator<Uint8Array> {
  const sizes = [1, 7, 64, 1000];
  for (let o = 0, k = 0; o < data.length; k++) {
    const n = Math.min(sizes[k % sizes.length]!, data.length - o);
    yield data.slice(o, o + n);
    o += n;
  }
}

describe('GGUF writer → reader round trip', () => {
  const kvs: [string, GGUFValue, unknown][] = [
    ['general.architecture', str('gemma4'), 'gemma4'],
    ['t.u8', u8(255), 255],
    ['t.i8', i8(-128), -128],
    ['t.u16', u16(65535), 65535],
    ['t.i16', i16(-32768), -32768],
    ['t.u32', u32(4294967295), 4294967295],
    ['t.i32', i32(-2147483648), -2147483648],
    ['t.f32', f32(1e-6), Math.fround(1e-6)],
    ['t.f64', f64(Math.PI), Math.PI],
    ['t.u64', u64(2n ** 64n - 1n), 2n ** 64n - 1n],
    ['t.i64', i64(-(2n ** 63n)), -(2n ** 63n)],
    ['t.bool', bool(true), true],
    ['t.str', str('héllo ▁world'), 'héllo ▁world'],
    ['t.empty', str(''), ''],
    ['t.arr_i32', arr('i32', [256, 256, 512, -1]), [256, 256, 512, -1]],
    ['t.arr_bool', arr('bool', [true, false, true]), [true, false, true]],
    ['t.arr_str', arr('string', ['<pad>', '', 'ü']), ['<pad>', '', 'ü']],
    ['t.arr_f32', arr('f32', [0.5, -2]), [0.5, -2]],
    ['t.arr_empty', arr('u32', []), []],
  ];
  const tensors = [
    { name: 'a.f32', type: GGMLType.F32, shape: [3] }, // 12 bytes: forces padding to 32
    { name: 'b.q8', type: GGMLType.Q8_0, shape: [64, 3] }, // 6 blocks × 34 = 204
    { name: 'c.q4k', type: GGMLType.Q4_K, shape: [256, 2, 2] }, // 4 × 144
    { name: 'd.f16', type: GGMLType.F16, shape: [5, 1] },
    { name: 'e.q6k', type: GGMLType.Q6_K, shape: [512] },
  ];
  const expectedBytes = [12, 204, 576, 10, 420];
  const data = expectedBytes.map((n, i) => bytesOf(n, i));
  const path = join(DIR, 'roundtrip.gguf');

  before(async () => {
    const w = new GGUFWriter();
    for (const [k, v] of kvs) w.set(k, v);
    for (const t of tensors) w.addTensor(t);
    await w.write(path, (_t, i) => chunked(data[i]!));
  });

  test('keys come back in order with their exact wire types and values', async () => {
    const f = await readGGUF(path);
    assert.equal(f.version, 3);
    assert.deepEqual(
      f.kvs.map((kv) => kv.key),
      kvs.map(([k]) => k),
    );
    for (const [key, value, decoded] of kvs) {
      const kv = f.kv(key)!;
      assert.equal(kv.type, value.type, key);
      if (value.type === 'array') {
        assert.equal(kv.itemType, value.itemType, key);
        assert.equal(kv.count, value.value.length, key);
      }
      assert.deepEqual(kv.value, decoded, key);
    }
  });

  test('tensor infos: names, shapes, types, 32-aligned consecutive offsets, sizes', async () => {
    const f = await readGGUF(path);
    assert.equal(f.alignment, 32);
    assert.equal(f.dataOffset % 32, 0);
    let offset = 0;
    f.tensors.forEach((t, i) => {
      assert.equal(t.name, tensors[i]!.name);
      assert.deepEqual(t.shape, tensors[i]!.shape);
      assert.equal(t.type, tensors[i]!.type);
      assert.equal(t.byteLength, expectedBytes[i]);
      assert.equal(t.offset, offset, `offset of ${t.name}`);
      offset += Math.ceil(expectedBytes[i]! / 32) * 32;
    });
    assert.equal(f.dataBytes, offset);
    assert.equal(f.fileSize, f.dataOffset + offset, 'file ends with the last tensor padded to 32');
  });

  test('tensor data bytes come back identical', async () => {
    const f = await readGGUF(path);
    for (let i = 0; i < tensors.length; i++) {
      assert.deepEqual(new Uint8Array(await readTensorData(path, f, tensors[i]!.name)), data[i]);
    }
    const slice = await readTensorData(path, f, 'b.q8', { start: 34, length: 34 });
    assert.deepEqual(new Uint8Array(slice), data[1]!.subarray(34, 68));
  });

  test('padding between tensors and after the header is zero', async () => {
    const bytes = await readFile(path);
    const f = await readGGUF(path);
    const t0 = f.tensors[0]!;
    const gap = bytes.subarray(f.dataOffset + t0.byteLength, f.dataOffset + f.tensors[1]!.offset);
    assert.equal(gap.length, 20);
    assert.ok(gap.every((b) => b === 0));
  });

  test('an independent parser (node-llama-cpp readGgufFileInfo) reads the same file', async () => {
    const { readGgufFileInfo } = await import('node-llama-cpp');
    const info = await readGgufFileInfo(path, { readTensorInfo: true, logWarnings: false });
    const meta = info.metadata as unknown as Record<string, Record<string, unknown>>;
    assert.equal(meta.general!.architecture, 'gemma4');
    assert.deepEqual(meta.t!.arr_i32, [256, 256, 512, -1]);
    assert.equal(meta.t!.u32, 4294967295);
    assert.deepEqual(meta.t!.arr_str, ['<pad>', '', 'ü']);
    const f = await readGGUF(path);
    assert.deepEqual(
      info.tensorInfo!.map((t) => [t.name, t.dimensions.map(Number), t.ggmlType, Number(t.offset), Number(t.fileOffset)]),
      f.tensors.map((t) => [t.name, [...t.shape], t.type, t.offset, f.dataOffset + t.offset]),
    );
  });

  test("skeleton(): the written file's exact header and size, tensor data reading as zeros", async () => {
    const w = new GGUFWriter();
    for (const [k, v] of kvs) w.set(k, v);
    for (const t of tensors) w.addTensor(t);
    const skeleton = w.skeleton();
    const bytes = await readFile(path);
    assert.equal(await skeleton.size(), bytes.length);
    const f = await readGGUF(path);
    assert.deepEqual(new Uint8Array(await skeleton.read(0, f.dataOffset)), new Uint8Array(bytes.subarray(0, f.dataOffset)));
    const s = await readGGUF(skeleton);
    assert.deepEqual(s.tensors, f.tensors);
    assert.deepEqual(
      s.kvs.map((kv) => [kv.key, kv.raw]),
      f.kvs.map((kv) => [kv.key, kv.raw]),
    );
    const data = await readTensorData(skeleton, s, 'c.q4k');
    assert.equal(data.length, 576);
    assert.ok(data.every((b) => b === 0));
    assert.equal((await skeleton.read(bytes.length - 4, 100)).length, 4, 'reads stop at the end of the file');
  });

  test('raw KVs copy byte for byte into a new file', async () => {
    const f = await readGGUF(path);
    const w = new GGUFWriter();
    for (const kv of f.kvs) w.set(kv.key, kv.asValue());
    const copy = join(DIR, 'copy.gguf');
    await w.write(copy, () => []);
    const g = await readGGUF(copy);
    for (const kv of f.kvs) assert.deepEqual(g.kv(kv.key)!.raw, kv.raw, kv.key);
    assert.equal(g.tensors.length, 0);
  });
});

describe('GGUF wire format', () => {
  test('a minimal file matches hand-built bytes (u32 type id 4, i32 type id 5, offsets, padding)', async () => {
    const w = new GGUFWriter()
      .set('k', u32(7))
      .set('n', i32(-1))
      .addTensor({ name: 't', type: GGMLType.F32, shape: [2] });
    const path = join(DIR, 'minimal.gguf');
    await w.write(path, () => [Uint8Array.of(0, 0, 128, 63, 0, 0, 0, 64)]);
    const le = (n: number, size: number) => {
      const b = Buffer.alloc(size);
      if (size === 8) b.writeBigUInt64LE(BigInt(n));
      else b.writeUInt32LE(n >>> 0);
      return b;
    };
    const header = Buffer.concat([
      Buffer.from('GGUF'),
      le(3, 4),
      le(1, 8),
      le(2, 8),
      le(1, 8),
      Buffer.from('k'),
      le(4, 4),
      le(7, 4),
      le(1, 8),
      Buffer.from('n'),
      le(5, 4),
      le(0xffffffff, 4),
      le(1, 8),
      Buffer.from('t'),
      le(1, 4),
      le(2, 8),
      le(0, 4),
      le(0, 8),
    ]);
    const padded = Buffer.concat([header, Buffer.alloc(Math.ceil(header.length / 32) * 32 - header.length)]);
    const expected = Buffer.concat([padded, Buffer.from([0, 0, 128, 63, 0, 0, 0, 64]), Buffer.alloc(24)]);
    assert.deepEqual(await readFile(path), expected);
  });

  test('a non-default alignment is written as general.alignment (u32) and honoured', async () => {
    const w = new GGUFWriter({ alignment: 64 })
      .addTensor({ name: 'a', type: GGMLType.F32, shape: [1] })
      .addTensor({ name: 'b', type: GGMLType.F32, shape: [1] });
    const path = join(DIR, 'align64.gguf');
    await w.write(path, () => [new Uint8Array(4)]);
    const f = await readGGUF(path);
    assert.equal(f.kv('general.alignment')!.type, 'u32');
    assert.equal(f.alignment, 64);
    assert.equal(f.dataOffset % 64, 0);
    assert.equal(f.tensors[1]!.offset, 64);
  });
});

describe('GGUF writer validation', () => {
  const cases: [string, (w: GGUFWriter) => unknown, RegExp][] = [
    ['duplicate key', (w) => w.set('a', u32(1)).set('a', u32(2)), /'a' is already set/],
    ['negative u32', (w) => w.set('a', u32(-1)), /a: expected an integer in \[0, 4294967295\] for u32, got -1/],
    ['fractional i32', (w) => w.set('a', i32(1.5)), /expected an integer .* for i32, got 1\.5/],
    ['i32 overflow', (w) => w.set('a', i32(2 ** 31)), /for i32, got 2147483648/],
    ['u64 from a number', (w) => w.set('a', { type: 'u64', value: 1 as unknown as bigint }), /expected a bigint/],
    ['mixed array', (w) => w.set('a', arr('u32', [1, 'x'])), /a\[1\]: expected an integer/],
    ['empty key', (w) => w.set('', u32(1)), /non-empty string/],
    ['truncated raw', (w) => w.set('a', raw(new Uint8Array(2))), /must hold a type id and a value/],
    ['long tensor name', (w) => w.addTensor({ name: 'x'.repeat(64), type: GGMLType.F32, shape: [1] }), /is 64 bytes, must be < 64/],
    [
      'duplicate tensor',
      (w) => w.addTensor({ name: 't', type: 0, shape: [1] }).addTensor({ name: 't', type: 0, shape: [1] }),
      /'t' is already added/,
    ],
    [
      'row not a block multiple',
      (w) => w.addTensor({ name: 't', type: GGMLType.Q8_0, shape: [48, 2] }),
      /row length 48 is not a multiple of the Q8_0 block size 32/,
    ],
    ['unknown type', (w) => w.addTensor({ name: 't', type: 4, shape: [1] }), /unknown ggml type 4/],
    ['5-D shape', (w) => w.addTensor({ name: 't', type: 0, shape: [1, 1, 1, 1, 1] }), /1\.\.4 dimensions/],
    ['zero dimension', (w) => w.addTensor({ name: 't', type: 0, shape: [4, 0] }), /dimension 1 must be a positive integer/],
  ];
  for (const [name, act, message] of cases) {
    test(`rejects ${name}`, () => assert.throws(() => act(new GGUFWriter()), message));
  }
  test('rejects a non-power-of-2 alignment', () => assert.throws(() => new GGUFWriter({ alignment: 48 }), /power of 2/));

  test('a source yielding the wrong byte count fails and leaves no file behind', async () => {
    const w = new GGUFWriter().addTensor({ name: 't', type: GGMLType.F32, shape: [4] });
    const path = join(DIR, 'short.gguf');
    await assert.rejects(
      w.write(path, () => [new Uint8Array(12)]),
      /tensor 't': source produced 12 bytes, expected 16/,
    );
    await assert.rejects(
      w.write(path, () => [new Uint8Array(20)]),
      /tensor 't': source produced more than its 16 bytes/,
    );
    const left = (await readdir(DIR)).filter((n) => n.startsWith('short.gguf'));
    assert.deepEqual(left, []);
  });
});

describe('GGUF reader errors', () => {
  let file: Buffer;
  let headerBytes: number;
  before(async () => {
    const w = new GGUFWriter().set('general.architecture', str('x')).set('tokens', arr('string', ['a', 'bb', 'ccc']));
    w.addTensor({ name: 'w', type: GGMLType.F32, shape: [8] });
    const path = join(DIR, 'errors.gguf');
    await w.write(path, () => [new Uint8Array(32)]);
    file = await readFile(path);
    headerBytes = w.plan().headerBytes;
  });

  test('bad magic', async () => {
    const bad = Buffer.from(file);
    bad.write('GGUG', 0, 'latin1');
    await assert.rejects(readGGUF(new BufferReadable(bad)), /not a GGUF file: magic is "GGUG".*offset 0/);
  });

  test('unsupported version names the offset of the version field', async () => {
    const bad = Buffer.from(file);
    bad.writeUInt32LE(9, 4);
    await assert.rejects(readGGUF(new BufferReadable(bad)), (err: unknown) => {
      assert.ok(err instanceof GGUFFormatError);
      assert.match(err.message, /unsupported GGUF version 9/);
      assert.equal(err.offset, 4);
      return true;
    });
  });

  test('truncation anywhere in the header is reported with the offset and what was being read', async () => {
    const f = await readGGUF(new BufferReadable(file));
    const tokensKv = f.kv('tokens')!;
    // Cut inside the string array: key, type, array header, element 0 ('a'), element 1's length, 1 of its 2 bytes.
    const cut = tokensKv.offset + 8 + 'tokens'.length + 4 + 12 + (8 + 1) + 8 + 1;
    await assert.rejects(readGGUF(new BufferReadable(file.subarray(0, cut))), (err: unknown) => {
      assert.ok(err instanceof GGUFFormatError);
      assert.match(
        err.message,
        new RegExp(`truncated file: KV 'tokens'\\[1\\] needs 2 bytes but the file ends at byte ${cut} \\(at byte offset ${cut - 1}\\)`),
      );
      assert.equal(err.offset, cut - 1);
      return true;
    });
    for (let n = 0; n < f.dataOffset; n += 7) {
      await assert.rejects(readGGUF(new BufferReadable(file.subarray(0, n))), /truncated file: .*\(at byte offset \d+\)$/, `cut at ${n}`);
    }
  });

  test('truncated tensor data names the tensor and where the file ends', async () => {
    const f = await readGGUF(new BufferReadable(file));
    const cut = f.dataOffset + 20;
    await assert.rejects(
      readGGUF(new BufferReadable(file.subarray(0, cut))),
      new RegExp(
        `data of tensor 'w' spans bytes ${f.dataOffset}\\.\\.${f.dataOffset + 32} but the file ends at byte ${cut} \\(at byte offset ${cut}\\)`,
      ),
    );
  });

  test('an offset that breaks the consecutive-offset rule is rejected', async () => {
    const bad = Buffer.from(file);
    // The only tensor's u64 offset field is the last 8 bytes of the (unpadded) header.
    assert.equal(bad.readBigUInt64LE(headerBytes - 8), 0n);
    bad.writeBigUInt64LE(32n, headerBytes - 8);
    await assert.rejects(readGGUF(new BufferReadable(bad)), /tensor 'w' has data offset 32, expected 0/);
  });
});

// ---------------------------------------------------------------------------------------------------------
// Block codecs. The decoders below are written here, from ggml-quants.c, independently of quant.ts.

const halfAt = (b: Uint8Array, o: number) => f16BitsToF32(b[o]! | (b[o + 1]! << 8));
const int8 = (v: number) => (v << 24) >> 24;

function refDecode(type: CodecType, b: Uint8Array, n: number): Float32Array {
  const y = new Float32Array(n);
  const nb = (bs: number) => n / bs;
  switch (type) {
    case GGMLType.F32:
      return new Float32Array(b.slice().buffer, 0, n);
    case GGMLType.F16:
      for (let i = 0; i < n; i++) y[i] = halfAt(b, 2 * i);
      return y;
    case GGMLType.Q8_0:
      for (let i = 0; i < nb(32); i++) for (let j = 0; j < 32; j++) y[i * 32 + j] = int8(b[i * 34 + 2 + j]!) * halfAt(b, i * 34);
      return y;
    case GGMLType.Q4_0:
      for (let i = 0; i < nb(32); i++) {
        for (let j = 0; j < 16; j++) {
          y[i * 32 + j] = ((b[i * 18 + 2 + j]! & 15) - 8) * halfAt(b, i * 18);
          y[i * 32 + 16 + j] = ((b[i * 18 + 2 + j]! >> 4) - 8) * halfAt(b, i * 18);
        }
      }
      return y;
    case GGMLType.Q5_0:
      for (let i = 0; i < nb(32); i++) {
        const o = i * 22;
        const qh = (b[o + 2]! | (b[o + 3]! << 8) | (b[o + 4]! << 16) | (b[o + 5]! << 24)) >>> 0;
        for (let j = 0; j < 16; j++) {
          y[i * 32 + j] = (((b[o + 6 + j]! & 15) | (((qh >>> j) & 1) << 4)) - 16) * halfAt(b, o);
          y[i * 32 + 16 + j] = (((b[o + 6 + j]! >> 4) | (((qh >>> (j + 16)) & 1) << 4)) - 16) * halfAt(b, o);
        }
      }
      return y;
    case GGMLType.Q4_K:
      for (let i = 0; i < nb(256); i++) {
        const o = i * 144;
        const s = b.subarray(o + 4, o + 16);
        const scMin = (j: number) =>
          j < 4 ? [s[j]! & 63, s[j + 4]! & 63] : [(s[j + 4]! & 15) | ((s[j - 4]! >> 6) << 4), (s[j + 4]! >> 4) | ((s[j]! >> 6) << 4)];
        for (let e = 0; e < 256; e++) {
          const chunk = e >> 6,
            hi = (e >> 5) & 1,
            l = e & 31;
          const [sc, m] = scMin(2 * chunk + hi);
          const q = hi ? b[o + 16 + chunk * 32 + l]! >> 4 : b[o + 16 + chunk * 32 + l]! & 15;
          y[i * 256 + e] = halfAt(b, o) * sc! * q - halfAt(b, o + 2) * m!;
        }
      }
      return y;
    case GGMLType.Q6_K:
      for (let i = 0; i < nb(256); i++) {
        const o = i * 210;
        for (let e = 0; e < 256; e++) {
          const half = e >> 7,
            r = e & 127,
            quarter = r >> 5,
            l = r & 31;
          const ql = b[o + half * 64 + l + (quarter & 1) * 32]!;
          const low = quarter < 2 ? ql & 15 : ql >> 4;
          const high = (b[o + 128 + half * 32 + l]! >> (2 * quarter)) & 3;
          y[i * 256 + e] = halfAt(b, o + 208) * int8(b[o + 192 + (e >> 4)]!) * ((low | (high << 4)) - 32);
        }
      }
      return y;
  }
  throw new Error(`no reference decoder for ${type}`);
}

describe('f16 conversion', () => {
  const cases: [number, number][] = [
    [0, 0x0000],
    [-0, 0x8000],
    [1, 0x3c00],
    [-2, 0xc000],
    [65504, 0x7bff],
    [65520, 0x7c00],
    [1e9, 0x7c00],
    [2 ** -24, 0x0001],
    [2 ** -25, 0x0000],
    [3 * 2 ** -25, 0x0002],
    [2 ** -14, 0x0400],
    [0.1, 0x2e66],
    [1 + 2 ** -11, 0x3c00],
    [1 + 3 * 2 ** -11, 0x3c02],
    [NaN, 0x7e00],
    [-Infinity, 0xfc00],
  ];
  for (const [v, bits] of cases) {
    test(`${v} → 0x${bits.toString(16)}`, () => assert.equal(f32ToF16Bits(v), bits));
  }
  test('every finite half survives half → float → half', () => {
    for (let h = 0; h < 0x10000; h++) {
      if ((h & 0x7c00) === 0x7c00) continue;
      assert.equal(f32ToF16Bits(f16BitsToF32(h)), h, `0x${h.toString(16)}`);
    }
  });
});

describe('block quantization of a known vector', () => {
  // 1024 values: a smooth signal plus a ramp and some outliers, std ≈ 0.03.
  const x = Float32Array.from(
    { length: 1024 },
    (_, i) => 0.04 * Math.sin(i * 0.37) + 0.01 * Math.cos(i * 1.3) + (i % 97 === 0 ? 0.12 : 0) - (i % 211 === 0 ? 0.1 : 0),
  );
  const rms = (a: Float32Array, b: Float32Array) => Math.sqrt(a.reduce((s, v, i) => s + (v - b[i]!) ** 2, 0) / a.length);
  const std = Math.sqrt(x.reduce((s, v) => s + v * v, 0) / x.length);
  // [type, bytes per 1024 values, max relative rms error (vs signal std), max abs error]
  const formats: [CodecType, number, number, number][] = [
    [GGMLType.F32, 4096, 0, 0],
    [GGMLType.F16, 2048, 0.001, 0.0001],
    [GGMLType.Q8_0, 32 * 34, 0.01, 0.15 / 127],
    [GGMLType.Q6_K, 4 * 210, 0.03, 0.15 / 31],
    [GGMLType.Q5_0, 32 * 22, 0.06, 0.15 / 16],
    [GGMLType.Q4_K, 4 * 144, 0.12, 0.25 / 15],
    [GGMLType.Q4_0, 32 * 18, 0.12, 0.15 / 8],
  ];
  for (const [type, bytes, relRms, maxAbs] of formats) {
    test(`type ${type}: block size, reference decode within the format's error, both decoders agree`, () => {
      const q = quantize(type, x);
      assert.equal(q.length, bytes);
      const ref = refDecode(type, q, x.length);
      const err = rms(ref, x) / std;
      assert.ok(err <= relRms, `relative rms error ${err} > ${relRms}`);
      const worst = ref.reduce((m, v, i) => Math.max(m, Math.abs(v - x[i]!)), 0);
      assert.ok(worst <= maxAbs, `max abs error ${worst} > ${maxAbs}`);
      assert.deepEqual(dequantize(type, q, x.length), ref);
    });
  }
  test('quantize rejects a partial block', () => {
    assert.throws(() => quantize(GGMLType.Q4_K, new Float32Array(300)), /300 values is not a multiple of the Q4_K block size 256/);
  });
});

describe('random blocks', () => {
  const types: [CodecType, number][] = [
    [GGMLType.F32, 1],
    [GGMLType.F16, 1],
    [GGMLType.Q8_0, 32],
    [GGMLType.Q4_0, 32],
    [GGMLType.Q5_0, 32],
    [GGMLType.Q4_K, 256],
    [GGMLType.Q6_K, 256],
  ];
  for (const [type, bs] of types) {
    test(`type ${type}: std ≈ ${WEIGHT_STD}, mean ≈ 0, finite, finite nonzero scales, chunking-independent`, () => {
      const nBlocks = Math.ceil(65536 / bs);
      const b = randomBlocks(type, nBlocks, new KeystreamRng(`t${type}`));
      const y = refDecode(type, b, nBlocks * bs);
      assert.ok(y.every(Number.isFinite));
      const mean = y.reduce((s, v) => s + v, 0) / y.length;
      const sd = Math.sqrt(y.reduce((s, v) => s + (v - mean) ** 2, 0) / y.length);
      assert.ok(Math.abs(sd - WEIGHT_STD) < 0.1 * WEIGHT_STD, `std ${sd}`);
      assert.ok(Math.abs(mean) < 0.05 * WEIGHT_STD, `mean ${mean}`);
      const scaleOffsets: Record<number, number[]> = { 8: [0], 2: [0], 6: [0], 12: [0, 2], 14: [208] };
      const size = b.length / nBlocks;
      for (const at of scaleOffsets[type] ?? []) {
        for (let i = 0; i < nBlocks; i++) {
          const d = halfAt(b, i * size + at);
          assert.ok(Number.isFinite(d) && d !== 0, `block ${i} scale ${d}`);
        }
      }
      const rng = new KeystreamRng(`t${type}`);
      const pieces = Buffer.concat([randomBlocks(type, 3, rng), randomBlocks(type, nBlocks - 3, rng)]);
      assert.equal(createHash('sha256').update(pieces).digest('hex'), createHash('sha256').update(b).digest('hex'));
    });
  }
  test('different labels give different data', () => {
    assert.notDeepEqual(randomBlocks(GGMLType.Q8_0, 4, new KeystreamRng('a')), randomBlocks(GGMLType.Q8_0, 4, new KeystreamRng('b')));
  });
});

describe("independent decoder: llama.cpp's own gguf-py", () => {
  const ggufPy = join(import.meta.dirname, '../..', 'build', 'llama.cpp', 'gguf-py');
  const available = (() => {
    try {
      execFileSync('python3', ['-c', 'import numpy, gguf'], { stdio: 'ignore', env: { ...process.env, PYTHONPATH: ggufPy } });
      return true;
    } catch {
      return false;
    }
  })();
  test(
    'reads our file and decodes our blocks: random ones to std ≈ 0.02, quantized ones back to the source',
    {
      skip: available ? false : 'python3 with numpy and build/llama.cpp/gguf-py not available',
    },
    async () => {
      const x = Float32Array.from({ length: 4096 }, (_, i) => 0.05 * Math.sin(i * 0.11) * Math.cos(i * 0.013));
      const types: [string, CodecType][] = [
        ['F16', GGMLType.F16],
        ['Q8_0', GGMLType.Q8_0],
        ['Q4_0', GGMLType.Q4_0],
        ['Q5_0', GGMLType.Q5_0],
        ['Q4_K', GGMLType.Q4_K],
        ['Q6_K', GGMLType.Q6_K],
      ];
      const w = new GGUFWriter().set('general.architecture', str('test'));
      const data: Uint8Array[] = [quantize(GGMLType.F32, x)];
      w.addTensor({ name: 'x', type: GGMLType.F32, shape: [4096] });
      for (const [name, type] of types) {
        w.addTensor({ name: `rand.${name}`, type, shape: [1024, 64] });
        data.push(
          randomBlocks(
            type,
            type === GGMLType.F16 ? 65536 : 65536 / (type === GGMLType.Q4_K || type === GGMLType.Q6_K ? 256 : 32),
            new KeystreamRng(name),
          ),
        );
        w.addTensor({ name: `known.${name}`, type, shape: [4096] });
        data.push(quantize(type, x));
      }
      const path = join(DIR, 'gguf-py.gguf');
      await w.write(path, (_t, i) => [data[i]!]);
      const script = [
        'import sys, json, numpy as np',
        'from gguf import GGUFReader',
        'from gguf.quants import dequantize',
        'r = GGUFReader(sys.argv[1])',
        't = {x.name: x for x in r.tensors}',
        'x = np.asarray(t["x"].data, dtype=np.float32).reshape(-1)',
        'out = {}',
        'for name in t:',
        '    if name == "x": continue',
        '    v = dequantize(t[name].data, t[name].tensor_type).reshape(-1)',
        '    out[name] = float(np.std(v)) if name.startswith("rand.") else float(np.max(np.abs(v - x)))',
        'print(json.dumps(out))',
      ].join('\n');
      const { stdout } = await promisify(execFile)('python3', ['-c', script, path], { env: { ...process.env, PYTHONPATH: ggufPy } });
      const result = JSON.parse(stdout) as Record<string, number>;
      const maxErr: Record<string, number> = {
        F16: 1e-4,
        Q8_0: 0.05 / 127,
        Q4_0: 0.05 / 8,
        Q5_0: 0.05 / 16,
        Q4_K: 0.1 / 15,
        Q6_K: 0.05 / 31,
      };
      for (const [name] of types) {
        assert.ok(Math.abs(result[`rand.${name}`]! - WEIGHT_STD) < 0.1 * WEIGHT_STD, `rand.${name}: std ${result[`rand.${name}`]}`);
        assert.ok(result[`known.${name}`]! <= maxErr[name]!, `known.${name}: max error ${result[`known.${name}`]}`);
      }
    },
  );
});
