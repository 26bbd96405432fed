// GGUF v3 reader and writer (ggml/include/gguf.h, ggml/src/gguf.cpp in build/llama.cpp).
// The reader keeps every KV's raw bytes and loads tensor data only when asked. The writer types KVs strictly and streams tensor data.
// Details: models/README.md#gguf
import { open, rename, unlink, type FileHandle } from 'node:fs/promises';
import { blockSize, ggmlTypeName, isKnownGgmlType, tensorBytes } from './quant.ts';

export const GGUF_MAGIC = 'GGUF';
export const GGUF_VERSION = 3;
export const GGUF_DEFAULT_ALIGNMENT = 32;
/** GGML_MAX_NAME: tensor names must be shorter than this (gguf.cpp rejects ≥ 64). */
export const GGML_MAX_NAME = 64;
/** GGML_MAX_DIMS. */
export const GGML_MAX_DIMS = 4;

/** Wire ids of GGUF value types (gguf.h `enum gguf_type`). */
export const GGUFValueType = {
  u8: 0,
  i8: 1,
  u16: 2,
  i16: 3,
  u32: 4,
  i32: 5,
  f32: 6,
  bool: 7,
  string: 8,
  array: 9,
  u64: 10,
  i64: 11,
  f64: 12,
} as const;
export type GGUFTypeName = keyof typeof GGUFValueType;
export type GGUFScalarTypeName = Exclude<GGUFTypeName, 'array'>;
const TYPE_BY_ID: readonly GGUFTypeName[] = ['u8', 'i8', 'u16', 'i16', 'u32', 'i32', 'f32', 'bool', 'string', 'array', 'u64', 'i64', 'f64'];
const FIXED_SIZE: Readonly<Partial<Record<GGUFTypeName, number>>> = {
  u8: 1,
  i8: 1,
  u16: 2,
  i16: 2,
  u32: 4,
  i32: 4,
  f32: 4,
  bool: 1,
  u64: 8,
  i64: 8,
  f64: 8,
};

export type GGUFScalar = number | bigint | boolean | string;
/** A decoded KV value. Arrays of arrays decode to nested arrays. */
export type GGUFDecoded = GGUFScalar | GGUFDecoded[];

/** A value to write, with its exact wire type. Build them with the helpers below (u32(…), arr('i32', …)). */
export type GGUFValue =
  | { readonly type: 'u8' | 'i8' | 'u16' | 'i16' | 'u32' | 'i32' | 'f32' | 'f64'; readonly value: number }
  | { readonly type: 'u64' | 'i64'; readonly value: bigint }
  | { readonly type: 'bool'; readonly value: boolean }
  | { readonly type: 'string'; readonly value: string }
  | { readonly type: 'array'; readonly itemType: GGUFScalarTypeName; readonly value: readonly GGUFScalar[] }
  /** Already-encoded bytes (u32 type id + value), e.g. GGUFKV.raw from another file: copied verbatim. */
  | { readonly type: 'raw'; readonly raw: Uint8Array };

export const u8 = (value: number): GGUFValue => ({ type: 'u8', value });
export const i8 = (value: number): GGUFValue => ({ type: 'i8', value });
export const u16 = (value: number): GGUFValue => ({ type: 'u16', value });
export const i16 = (value: number): GGUFValue => ({ type: 'i16', value });
export const u32 = (value: number): GGUFValue => ({ type: 'u32', value });
export const i32 = (value: number): GGUFValue => ({ type: 'i32', value });
export const f32 = (value: number): GGUFValue => ({ type: 'f32', value });
export const f64 = (value: number): GGUFValue => ({ type: 'f64', value });
export const u64 = (value: bigint | number): GGUFValue => ({ type: 'u64', value: BigInt(value) });
export const i64 = (value: bigint | number): GGUFValue => ({ type: 'i64', value: BigInt(value) });
export const bool = (value: boolean): GGUFValue => ({ type: 'bool', value });
export const str = (value: string): GGUFValue => ({ type: 'string', value });
export const arr = (itemType: GGUFScalarTypeName, value: readonly GGUFScalar[]): GGUFValue => ({ type: 'array', itemType, value });
export const raw = (bytes: Uint8Array): GGUFValue => ({ type: 'raw', raw: bytes });

/** Thrown for malformed or truncated GGUF input; `offset` is the byte offset in the file where it went wrong. */
export class GGUFFormatError extends Error {
  readonly offset: number;
  constructor(message: string, offset: number, source?: string) {
    super(`${source ? `${source}: ` : ''}${message} (at byte offset ${offset})`);
    this.name = 'GGUFFormatError';
    this.offset = offset;
  }
}

// ---------------------------------------------------------------------------------------------------------
// I/O behind two tiny interfaces (as @mcap/core does), so parsing is testable on in-memory bytes.

export interface IReadable {
  size(): Promise<number>;
  /** Reads up to `length` bytes at `offset`; fewer only at end of file. */
  read(offset: number, length: number): Promise<Uint8Array>;
}

export class FileReadable implements IReadable {
  readonly #fh: FileHandle;
  readonly path: string;

  private constructor(fh: FileHandle, path: string) {
    this.#fh = fh;
    this.path = path;
  }

  static async open(path: string): Promise<FileReadable> {
    return new FileReadable(await open(path, 'r'), path);
  }

  async size(): Promise<number> {
    return (await this.#fh.stat()).size;
  }

  async read(offset: number, length: number): Promise<Uint8Array> {
    const buf = Buffer.allocUnsafe(length);
    let got = 0;
    while (got < length) {
      const { bytesRead } = await this.#fh.read(buf, got, length - got, offset + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return buf.subarray(0, got);
  }

  async close(): Promise<void> {
    await this.#fh.close();
  }
}

export class BufferReadable implements IReadable {
  readonly #bytes: Uint8Array;
  constructor(bytes: Uint8Array) {
    this.#bytes = bytes;
  }
  async size(): Promise<number> {
    return this.#bytes.length;
  }
  async read(offset: number, length: number): Promise<Uint8Array> {
    return this.#bytes.subarray(offset, Math.min(this.#bytes.length, offset + length));
  }
}

/** A header followed by `size - header.length` zero bytes (see GGUFWriter.skeleton). */
class ZeroDataReadable implements IReadable {
  readonly #header: Uint8Array;
  readonly #size: number;
  constructor(header: Uint8Array, size: number) {
    this.#header = header;
    this.#size = size;
  }
  async size(): Promise<number> {
    return this.#size;
  }
  async read(offset: number, length: number): Promise<Uint8Array> {
    const out = new Uint8Array(Math.max(0, Math.min(this.#size, offset + length) - offset));
    if (offset < this.#header.length) out.set(this.#header.subarray(offset, Math.min(this.#header.length, offset + out.length)));
    return out;
  }
}

/**
 * Sequential reader over the header region. It keeps everything read so far in one growing buffer.
 * So a KV's raw bytes are a zero-copy subarray. A Gemma file's header is megabytes, mostly the tokenizer.
 */
class HeaderCursor {
  #buf = new Uint8Array(0);
  #view = new DataView(this.#buf.buffer);
  #loaded = 0;
  pos = 0;
  readonly #src: IReadable;
  readonly #fileSize: number;
  readonly #label: string | undefined;

  constructor(src: IReadable, fileSize: number, label?: string) {
    this.#src = src;
    this.#fileSize = fileSize;
    this.#label = label;
  }

  fail(message: string, at = this.pos): never {
    throw new GGUFFormatError(message, at, this.#label);
  }

  /** Makes [pos, pos+n) available, or throws naming what was being read. */
  async need(n: number, what: string): Promise<void> {
    const end = this.pos + n;
    if (end <= this.#loaded) return;
    if (end > this.#fileSize) {
      this.fail(`truncated file: ${what} needs ${n} bytes but the file ends at byte ${this.#fileSize}`);
    }
    // Read ahead in growing steps (1 → 8 MiB), so a tokenizer of megabytes takes a few reads, not thousands.
    const want = Math.min(this.#fileSize, Math.max(end, this.#loaded + Math.min(8 << 20, Math.max(1 << 20, this.#loaded))));
    if (want > this.#buf.length) {
      const grown = new Uint8Array(Math.min(this.#fileSize, Math.max(want, this.#buf.length * 2)));
      grown.set(this.#buf.subarray(0, this.#loaded));
      this.#buf = grown;
      this.#view = new DataView(grown.buffer);
    }
    while (this.#loaded < want) {
      const chunk = await this.#src.read(this.#loaded, want - this.#loaded);
      if (chunk.length === 0) this.fail(`truncated file: ${what} needs ${n} bytes, read returned nothing at byte ${this.#loaded}`);
      this.#buf.set(chunk, this.#loaded);
      this.#loaded += chunk.length;
    }
  }

  bytes(start: number, end: number): Uint8Array {
    return this.#buf.subarray(start, end);
  }

  u32(): number {
    const v = this.#view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }

  u64(what: string): number {
    const v = this.#view.getBigUint64(this.pos, true);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) this.fail(`${what} ${v} is too large`);
    this.pos += 8;
    return Number(v);
  }

  i64(): bigint {
    const v = this.#view.getBigInt64(this.pos, true);
    this.pos += 8;
    return v;
  }

  async string(what: string): Promise<string> {
    await this.need(8, `length of ${what}`);
    const len = this.u64(`length of ${what}`);
    await this.need(len, what);
    const s = Buffer.from(this.#buf.buffer, this.#buf.byteOffset + this.pos, len).toString('utf8');
    this.pos += len;
    return s;
  }

  /** Skips one value of `type` (for arrays: their whole payload), validating lengths as it goes. */
  async skipValue(type: number, what: string): Promise<void> {
    const name = TYPE_BY_ID[type];
    if (name === undefined) this.fail(`${what} has unknown value type ${type}`, this.pos - 4);
    if (name === 'string') {
      await this.need(8, `length of ${what}`);
      const len = this.u64(`length of ${what}`);
      await this.need(len, what);
      this.pos += len;
      return;
    }
    if (name === 'array') {
      await this.need(12, `array header of ${what}`);
      const itemType = this.u32();
      const count = this.u64(`element count of ${what}`);
      const itemName = TYPE_BY_ID[itemType];
      if (itemName === undefined) this.fail(`${what} is an array of unknown value type ${itemType}`, this.pos - 12);
      const fixed = FIXED_SIZE[itemName];
      if (fixed !== undefined) {
        await this.need(fixed * count, `${count} × ${itemName} of ${what}`);
        this.pos += fixed * count;
      } else if (itemName === 'string') {
        // Token lists hold ~800k strings: skip the ones already loaded synchronously, await only refills.
        for (let i = 0; i < count; i++) {
          if (this.pos + 8 <= this.#loaded) {
            const len = this.#view.getBigUint64(this.pos, true);
            if (this.pos + 8 + Number(len) <= this.#loaded) {
              this.pos += 8 + Number(len);
              continue;
            }
          }
          await this.skipValue(itemType, `${what}[${i}]`);
        }
      } else {
        for (let i = 0; i < count; i++) await this.skipValue(itemType, `${what}[${i}]`);
      }
      return;
    }
    const size = FIXED_SIZE[name]!;
    await this.need(size, what);
    this.pos += size;
  }
}

/** Decodes an encoded value (u32 type id followed by the value) as produced by the GGUF KV section. */
function decodeValue(rawBytes: Uint8Array): GGUFDecoded {
  const view = new DataView(rawBytes.buffer, rawBytes.byteOffset, rawBytes.byteLength);
  let pos = 0;
  const read = (type: number): GGUFDecoded => {
    switch (TYPE_BY_ID[type]) {
      case 'u8':
        return view.getUint8(pos++);
      case 'i8':
        return view.getInt8(pos++);
      case 'u16':
        pos += 2;
        return view.getUint16(pos - 2, true);
      case 'i16':
        pos += 2;
        return view.getInt16(pos - 2, true);
      case 'u32':
        pos += 4;
        return view.getUint32(pos - 4, true);
      case 'i32':
        pos += 4;
        return view.getInt32(pos - 4, true);
      case 'f32':
        pos += 4;
        return view.getFloat32(pos - 4, true);
      case 'f64':
        pos += 8;
        return view.getFloat64(pos - 8, true);
      case 'u64':
        pos += 8;
        return view.getBigUint64(pos - 8, true);
      case 'i64':
        pos += 8;
        return view.getBigInt64(pos - 8, true);
      case 'bool':
        return view.getUint8(pos++) !== 0;
      case 'string': {
        const len = Number(view.getBigUint64(pos, true));
        pos += 8;
        const s = Buffer.from(rawBytes.buffer, rawBytes.byteOffset + pos, len).toString('utf8');
        pos += len;
        return s;
      }
      case 'array': {
        const itemType = view.getUint32(pos, true);
        const count = Number(view.getBigUint64(pos + 4, true));
        pos += 12;
        const out: GGUFDecoded[] = new Array(count);
        for (let i = 0; i < count; i++) out[i] = read(itemType);
        return out;
      }
      default:
        throw new RangeError(`unknown GGUF value type ${type}`);
    }
  };
  const type = view.getUint32(0, true);
  pos = 4;
  return read(type);
}

/** One KV as stored: its wire type, and the raw encoded bytes (type id + value) for verbatim copies. */
export class GGUFKV {
  readonly key: string;
  readonly type: GGUFTypeName;
  /** Element type for arrays. */
  readonly itemType: GGUFTypeName | undefined;
  /** Element count for arrays. */
  readonly count: number | undefined;
  /** u32 type id followed by the encoded value, exactly as in the file. */
  readonly raw: Uint8Array;
  /** File offset of the KV (its key length field). */
  readonly offset: number;

  constructor(init: { key: string; type: GGUFTypeName; itemType?: GGUFTypeName; count?: number; raw: Uint8Array; offset: number }) {
    this.key = init.key;
    this.type = init.type;
    this.itemType = init.itemType;
    this.count = init.count;
    this.raw = init.raw;
    this.offset = init.offset;
  }

  /** Decodes the value (on every call: token lists are large, so nothing is cached). */
  get value(): GGUFDecoded {
    return decodeValue(this.raw);
  }

  /** This KV as a value to write into another file, byte for byte. */
  asValue(): GGUFValue {
    return raw(this.raw);
  }
}

export interface GGUFTensorInfo {
  readonly name: string;
  /** ne, ne0 (row length) first, as in GGUF. */
  readonly shape: readonly number[];
  readonly type: number;
  /** Offset relative to the start of the data section. */
  readonly offset: number;
  readonly byteLength: number;
}

export interface GGUFFile {
  readonly version: number;
  readonly alignment: number;
  readonly kvs: readonly GGUFKV[];
  readonly tensors: readonly GGUFTensorInfo[];
  /** Absolute file offset of the data section (tensor offsets are relative to it). */
  readonly dataOffset: number;
  /** Size of the data section, last tensor's padding included (as gguf.cpp counts it). */
  readonly dataBytes: number;
  readonly fileSize: number;
  kv(key: string): GGUFKV | undefined;
  /** Decoded value of `key`, or undefined if absent. */
  get(key: string): GGUFDecoded | undefined;
  tensor(name: string): GGUFTensorInfo | undefined;
}

const padTo = (n: number, alignment: number) => Math.ceil(n / alignment) * alignment;

/** Parses a GGUF header from a path or an IReadable. Validates what gguf.cpp validates. */
export async function readGGUF(source: string | IReadable): Promise<GGUFFile> {
  if (typeof source === 'string') {
    const file = await FileReadable.open(source);
    try {
      return await parseGGUF(file, source);
    } finally {
      await file.close();
    }
  }
  return parseGGUF(source);
}

async function parseGGUF(src: IReadable, label?: string): Promise<GGUFFile> {
  const fileSize = await src.size();
  const c = new HeaderCursor(src, fileSize, label);

  await c.need(24, 'GGUF header (magic, version, tensor count, KV count)');
  const magic = Buffer.from(c.bytes(0, 4)).toString('latin1');
  if (magic !== GGUF_MAGIC) c.fail(`not a GGUF file: magic is ${JSON.stringify(magic)}, expected "GGUF"`, 0);
  c.pos = 4;
  const version = c.u32();
  if (version !== 2 && version !== 3) c.fail(`unsupported GGUF version ${version} (expected 3)`, 4);
  const nTensors = c.u64('tensor count');
  const nKv = c.u64('KV count');

  const kvs: GGUFKV[] = [];
  const byKey = new Map<string, GGUFKV>();
  for (let i = 0; i < nKv; i++) {
    const at = c.pos;
    const key = await c.string(`key of KV #${i}`);
    if (byKey.has(key)) c.fail(`duplicate key '${key}'`, at);
    const rawStart = c.pos;
    await c.need(4, `type of KV '${key}'`);
    const typeId = c.u32();
    const type = TYPE_BY_ID[typeId];
    if (type === undefined) c.fail(`KV '${key}' has unknown value type ${typeId}`, rawStart);
    let itemType: GGUFTypeName | undefined;
    let count: number | undefined;
    if (type === 'array') {
      await c.need(12, `array header of KV '${key}'`);
      const view = new DataView(c.bytes(c.pos, c.pos + 12).slice().buffer);
      itemType = TYPE_BY_ID[view.getUint32(0, true)];
      count = Number(view.getBigUint64(4, true));
    }
    await c.skipValue(typeId, `KV '${key}'`);
    const kv = new GGUFKV({ key, type, itemType, count, raw: c.bytes(rawStart, c.pos), offset: at });
    kvs.push(kv);
    byKey.set(key, kv);
  }

  let alignment = GGUF_DEFAULT_ALIGNMENT;
  const alignKv = byKey.get('general.alignment');
  if (alignKv) {
    if (alignKv.type !== 'u32') c.fail(`general.alignment must be u32, found ${alignKv.type}`, alignKv.offset);
    alignment = alignKv.value as number;
    if (alignment === 0 || (alignment & (alignment - 1)) !== 0)
      c.fail(`general.alignment ${alignment} is not a power of 2`, alignKv.offset);
  }

  const tensors: GGUFTensorInfo[] = [];
  const byName = new Map<string, GGUFTensorInfo>();
  let expectedOffset = 0;
  for (let i = 0; i < nTensors; i++) {
    const at = c.pos;
    const name = await c.string(`name of tensor #${i}`);
    if (Buffer.byteLength(name) >= GGML_MAX_NAME)
      c.fail(`tensor name '${name}' is ${Buffer.byteLength(name)} bytes, must be < ${GGML_MAX_NAME}`, at);
    if (byName.has(name)) c.fail(`duplicate tensor name '${name}'`, at);
    await c.need(4, `dimension count of tensor '${name}'`);
    const nDims = c.u32();
    if (nDims > GGML_MAX_DIMS) c.fail(`tensor '${name}' has ${nDims} dimensions (max ${GGML_MAX_DIMS})`, c.pos - 4);
    await c.need(8 * nDims + 4 + 8, `shape/type/offset of tensor '${name}'`);
    const shape: number[] = [];
    for (let d = 0; d < nDims; d++) {
      const ne = c.i64();
      if (ne < 0n || ne > BigInt(Number.MAX_SAFE_INTEGER)) c.fail(`tensor '${name}' dimension ${d} is ${ne}`, c.pos - 8);
      shape.push(Number(ne));
    }
    const type = c.u32();
    if (!isKnownGgmlType(type)) c.fail(`tensor '${name}' has unknown ggml type ${type}`, c.pos - 4);
    if ((shape[0] ?? 1) % blockSize(type) !== 0) {
      c.fail(`tensor '${name}' row length ${shape[0]} is not a multiple of the ${ggmlTypeName(type)} block size ${blockSize(type)}`, at);
    }
    const offset = c.u64(`offset of tensor '${name}'`);
    if (offset !== expectedOffset) {
      c.fail(
        `tensor '${name}' has data offset ${offset}, expected ${expectedOffset} (offsets must be consecutive, each padded to ${alignment})`,
        c.pos - 8,
      );
    }
    const byteLength = Number(tensorBytes(type, shape));
    expectedOffset = padTo(offset + byteLength, alignment);
    const info: GGUFTensorInfo = { name, shape, type, offset, byteLength };
    tensors.push(info);
    byName.set(name, info);
  }

  const dataOffset = nTensors > 0 ? padTo(c.pos, alignment) : c.pos;
  const last = tensors[tensors.length - 1];
  if (last && dataOffset + last.offset + last.byteLength > fileSize) {
    const missingAt = tensors.find((t) => dataOffset + t.offset + t.byteLength > fileSize)!;
    c.fail(
      `truncated file: data of tensor '${missingAt.name}' spans bytes ${dataOffset + missingAt.offset}..${dataOffset + missingAt.offset + missingAt.byteLength} ` +
        `but the file ends at byte ${fileSize}`,
      fileSize,
    );
  }

  return {
    version,
    alignment,
    kvs,
    tensors,
    dataOffset,
    dataBytes: expectedOffset,
    fileSize,
    kv: (key) => byKey.get(key),
    get: (key) => byKey.get(key)?.value,
    tensor: (name) => byName.get(name),
  };
}

/** Reads one tensor's data (for tests and small tensors; large ones should be read in ranges). */
export async function readTensorData(
  source: string | IReadable,
  file: GGUFFile,
  name: string,
  range?: { start: number; length: number },
): Promise<Uint8Array> {
  const t = file.tensor(name);
  if (!t) throw new RangeError(`no tensor named '${name}'`);
  const start = range?.start ?? 0;
  const length = range?.length ?? t.byteLength - start;
  if (start < 0 || length < 0 || start + length > t.byteLength)
    throw new RangeError(`range ${start}+${length} is outside tensor '${name}' (${t.byteLength} bytes)`);
  const src = typeof source === 'string' ? await FileReadable.open(source) : source;
  try {
    const bytes = await src.read(file.dataOffset + t.offset + start, length);
    if (bytes.length !== length)
      throw new GGUFFormatError(`truncated file: tensor '${name}' data is short`, file.dataOffset + t.offset + start + bytes.length);
    return bytes;
  } finally {
    if (typeof source === 'string') await (src as FileReadable).close();
  }
}

// ---------------------------------------------------------------------------------------------------------
// Writer

export interface TensorSpec {
  readonly name: string;
  readonly type: number;
  /** ne, ne0 (row length) first. */
  readonly shape: readonly number[];
}

export interface PlannedTensor extends TensorSpec {
  readonly offset: number;
  readonly byteLength: number;
}

/**
 * Supplies a tensor's bytes in order, in chunks of any size; the total must equal its byteLength. A chunk
 * may still be in flight to disk while the next one is produced, so never reuse a yielded buffer.
 */
export type TensorDataSource = (tensor: PlannedTensor, index: number) => Iterable<Uint8Array> | AsyncIterable<Uint8Array>;

export interface GGUFWriteOptions {
  /** Called after each chunk lands on disk. */
  onProgress?: (bytesWritten: number, totalBytes: number) => void;
}

const INT_RANGES: Record<'u8' | 'i8' | 'u16' | 'i16' | 'u32' | 'i32', [number, number]> = {
  u8: [0, 0xff],
  i8: [-0x80, 0x7f],
  u16: [0, 0xffff],
  i16: [-0x8000, 0x7fff],
  u32: [0, 0xffffffff],
  i32: [-0x80000000, 0x7fffffff],
};

function checkScalar(type: GGUFScalarTypeName, v: unknown, where: string): void {
  switch (type) {
    case 'u8':
    case 'i8':
    case 'u16':
    case 'i16':
    case 'u32':
    case 'i32': {
      const [lo, hi] = INT_RANGES[type];
      if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) {
        throw new TypeError(`${where}: expected an integer in [${lo}, ${hi}] for ${type}, got ${String(v)}`);
      }
      return;
    }
    case 'f32':
    case 'f64':
      if (typeof v !== 'number') throw new TypeError(`${where}: expected a number for ${type}, got ${typeof v}`);
      return;
    case 'u64':
      if (typeof v !== 'bigint' || v < 0n || v >= 1n << 64n)
        throw new TypeError(`${where}: expected a bigint in [0, 2^64) for u64, got ${String(v)}`);
      return;
    case 'i64':
      if (typeof v !== 'bigint' || v < -(1n << 63n) || v >= 1n << 63n)
        throw new TypeError(`${where}: expected a bigint in [-2^63, 2^63) for i64, got ${String(v)}`);
      return;
    case 'bool':
      if (typeof v !== 'boolean') throw new TypeError(`${where}: expected a boolean, got ${typeof v}`);
      return;
    case 'string':
      if (typeof v !== 'string') throw new TypeError(`${where}: expected a string, got ${typeof v}`);
      return;
    default:
      throw new TypeError(`${where}: unknown GGUF type '${String(type)}'`);
  }
}

/** Growable little-endian byte builder for the header. */
class ByteBuilder {
  #chunks: Uint8Array[] = [];
  #scratch = Buffer.alloc(8);
  length = 0;

  push(bytes: Uint8Array): void {
    this.#chunks.push(bytes);
    this.length += bytes.length;
  }
  #num(write: (b: Buffer) => void, n: number): void {
    write(this.#scratch);
    this.push(Buffer.from(this.#scratch.subarray(0, n)));
  }
  u32(v: number): void {
    this.#num((b) => b.writeUInt32LE(v), 4);
  }
  u64(v: number | bigint): void {
    this.#num((b) => b.writeBigUInt64LE(BigInt(v)), 8);
  }
  i64(v: number | bigint): void {
    this.#num((b) => b.writeBigInt64LE(BigInt(v)), 8);
  }
  string(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  scalar(type: GGUFScalarTypeName, v: GGUFScalar): void {
    switch (type) {
      case 'u8':
        this.#num((b) => b.writeUInt8(v as number), 1);
        break;
      case 'i8':
        this.#num((b) => b.writeInt8(v as number), 1);
        break;
      case 'u16':
        this.#num((b) => b.writeUInt16LE(v as number), 2);
        break;
      case 'i16':
        this.#num((b) => b.writeInt16LE(v as number), 2);
        break;
      case 'u32':
        this.#num((b) => b.writeUInt32LE(v as number), 4);
        break;
      case 'i32':
        this.#num((b) => b.writeInt32LE(v as number), 4);
        break;
      case 'f32':
        this.#num((b) => b.writeFloatLE(v as number), 4);
        break;
      case 'f64':
        this.#num((b) => b.writeDoubleLE(v as number), 8);
        break;
      case 'u64':
        this.#num((b) => b.writeBigUInt64LE(v as bigint), 8);
        break;
      case 'i64':
        this.#num((b) => b.writeBigInt64LE(v as bigint), 8);
        break;
      case 'bool':
        this.#num((b) => b.writeUInt8(v ? 1 : 0), 1);
        break;
      case 'string':
        this.string(v as string);
        break;
    }
  }
  zeros(n: number): void {
    if (n > 0) this.push(Buffer.alloc(n));
  }
  toBuffer(): Buffer {
    return Buffer.concat(this.#chunks, this.length);
  }
}

/**
 * Builds a GGUF file. Set KVs and add tensor infos, which both keep insertion order.
 * Then `write()` streams the header, and the tensor data from a source.
 * Validation happens at set/add time, so a bad key or shape is reported before any byte is written.
 */
export class GGUFWriter {
  readonly alignment: number;
  readonly #kvs = new Map<string, GGUFValue>();
  readonly #tensors: TensorSpec[] = [];
  readonly #tensorNames = new Set<string>();

  constructor(options: { alignment?: number } = {}) {
    const alignment = options.alignment ?? GGUF_DEFAULT_ALIGNMENT;
    if (!Number.isInteger(alignment) || alignment <= 0 || (alignment & (alignment - 1)) !== 0) {
      throw new RangeError(`alignment must be a power of 2, got ${alignment}`);
    }
    this.alignment = alignment;
    if (alignment !== GGUF_DEFAULT_ALIGNMENT) this.#kvs.set('general.alignment', u32(alignment));
  }

  /** Adds a KV; keys are unique (llama.cpp rejects duplicates), types are checked against their values. */
  set(key: string, value: GGUFValue): this {
    if (typeof key !== 'string' || key.length === 0) throw new TypeError(`GGUF key must be a non-empty string, got ${JSON.stringify(key)}`);
    if (this.#kvs.has(key)) throw new Error(`GGUF key '${key}' is already set`);
    if (key === 'general.alignment') throw new Error(`set general.alignment through the GGUFWriter constructor's alignment option`);
    if (value.type === 'raw') {
      if (!(value.raw instanceof Uint8Array) || value.raw.length < 5)
        throw new TypeError(`raw value of '${key}' must hold a type id and a value`);
      const t = new DataView(value.raw.buffer, value.raw.byteOffset, value.raw.byteLength).getUint32(0, true);
      if (TYPE_BY_ID[t] === undefined) throw new TypeError(`raw value of '${key}' has unknown type id ${t}`);
    } else if (value.type === 'array') {
      if (!(value.itemType in GGUFValueType) || value.itemType === ('array' as string)) {
        throw new TypeError(`array '${key}': unsupported item type '${String(value.itemType)}'`);
      }
      if (!Array.isArray(value.value)) throw new TypeError(`array '${key}': value must be an array`);
      value.value.forEach((v, i) => checkScalar(value.itemType, v, `${key}[${i}]`));
    } else {
      checkScalar(value.type, value.value, key);
    }
    this.#kvs.set(key, value);
    return this;
  }

  addTensor(spec: TensorSpec): this {
    const { name, type, shape } = spec;
    if (typeof name !== 'string' || name.length === 0) throw new TypeError(`tensor name must be a non-empty string`);
    if (Buffer.byteLength(name) >= GGML_MAX_NAME)
      throw new RangeError(`tensor name '${name}' is ${Buffer.byteLength(name)} bytes, must be < ${GGML_MAX_NAME}`);
    if (this.#tensorNames.has(name)) throw new Error(`tensor '${name}' is already added`);
    if (!isKnownGgmlType(type)) throw new RangeError(`tensor '${name}': unknown ggml type ${type}`);
    if (!Array.isArray(shape) || shape.length < 1 || shape.length > GGML_MAX_DIMS) {
      throw new RangeError(`tensor '${name}': shape must have 1..${GGML_MAX_DIMS} dimensions, got ${JSON.stringify(shape)}`);
    }
    shape.forEach((ne, d) => {
      if (!Number.isSafeInteger(ne) || ne < 1)
        throw new RangeError(`tensor '${name}': dimension ${d} must be a positive integer, got ${ne}`);
    });
    if (shape[0]! % blockSize(type) !== 0) {
      throw new RangeError(
        `tensor '${name}': row length ${shape[0]} is not a multiple of the ${ggmlTypeName(type)} block size ${blockSize(type)}`,
      );
    }
    this.#tensors.push({ name, type, shape: [...shape] });
    this.#tensorNames.add(name);
    return this;
  }

  /** Offsets and sizes exactly as they will be written. */
  plan(): { headerBytes: number; dataOffset: number; tensors: PlannedTensor[]; totalBytes: number } {
    const header = this.#encodeHeader();
    return {
      headerBytes: header.unpadded,
      dataOffset: header.bytes.length,
      tensors: header.tensors,
      totalBytes: header.bytes.length + header.dataBytes,
    };
  }

  /**
   * The file `write()` would produce, as an IReadable with the real header and tensor data that reads as zeros.
   * Metadata consumers (readGGUF, the calculators) get a multi-GB checkpoint's exact header and tensor table.
   * No byte of it is generated or written.
   */
  skeleton(): IReadable {
    const header = this.#encodeHeader();
    return new ZeroDataReadable(header.bytes, header.bytes.length + header.dataBytes);
  }

  #encodeHeader(): { bytes: Buffer; unpadded: number; tensors: PlannedTensor[]; dataBytes: number } {
    const b = new ByteBuilder();
    b.push(Buffer.from(GGUF_MAGIC, 'latin1'));
    b.u32(GGUF_VERSION);
    b.u64(this.#tensors.length);
    b.u64(this.#kvs.size);
    for (const [key, value] of this.#kvs) {
      b.string(key);
      if (value.type === 'raw') {
        b.push(value.raw);
      } else if (value.type === 'array') {
        b.u32(GGUFValueType.array);
        b.u32(GGUFValueType[value.itemType]);
        b.u64(value.value.length);
        for (const v of value.value) b.scalar(value.itemType, v);
      } else {
        b.u32(GGUFValueType[value.type]);
        b.scalar(value.type, value.value);
      }
    }
    const tensors: PlannedTensor[] = [];
    let offset = 0;
    for (const t of this.#tensors) {
      const byteLength = Number(tensorBytes(t.type, t.shape));
      b.string(t.name);
      b.u32(t.shape.length);
      for (const ne of t.shape) b.i64(ne);
      b.u32(t.type);
      b.u64(offset);
      tensors.push({ ...t, offset, byteLength });
      offset = padTo(offset + byteLength, this.alignment);
    }
    const unpadded = b.length;
    if (tensors.length > 0) b.zeros(padTo(unpadded, this.alignment) - unpadded);
    return { bytes: b.toBuffer(), unpadded, tensors, dataBytes: offset };
  }

  /**
   * Writes the file: header, then each tensor's data pulled from `source` and padded to the alignment.
   * It goes to `${path}.tmp-…` first, and is renamed into place only when complete.
   * So readers never see a partial file, and concurrent writers of the same path cannot interleave.
   */
  async write(path: string, source: TensorDataSource, options: GGUFWriteOptions = {}): Promise<{ path: string; bytes: number }> {
    const header = this.#encodeHeader();
    const total = header.bytes.length + header.dataBytes;
    const tmp = `${path}.tmp-${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
    const fh = await open(tmp, 'w');
    let pos = 0;
    let inFlight: Promise<unknown> = Promise.resolve();
    // Keep one write in flight while the next chunk is generated: generation is CPU, writing is the threadpool.
    // Overlapping them is what makes multi-GB files take seconds, not minutes.
    const put = async (chunk: Uint8Array) => {
      const at = pos;
      pos += chunk.length;
      await inFlight;
      inFlight = writeAll(fh, chunk, at).then(() => options.onProgress?.(at + chunk.length, total));
      // Mark handled now; a failure surfaces at the next `await inFlight`.
      // Otherwise a write error that lands while the next chunk is being generated would be an unhandled rejection.
      inFlight.catch(() => undefined);
    };
    try {
      await put(header.bytes);
      for (let i = 0; i < header.tensors.length; i++) {
        const t = header.tensors[i]!;
        const start = pos;
        for await (const chunk of source(t, i)) {
          if (pos - start + chunk.length > t.byteLength) {
            throw new Error(`tensor '${t.name}': source produced more than its ${t.byteLength} bytes`);
          }
          await put(chunk);
        }
        if (pos - start !== t.byteLength)
          throw new Error(`tensor '${t.name}': source produced ${pos - start} bytes, expected ${t.byteLength}`);
        const pad = padTo(pos - header.bytes.length, this.alignment) + header.bytes.length - pos;
        if (pad > 0) await put(Buffer.alloc(pad));
      }
      await inFlight;
      if (pos !== total) throw new Error(`internal: wrote ${pos} bytes, planned ${total}`);
      await fh.close();
      await rename(tmp, path);
    } catch (err) {
      await inFlight.catch(() => undefined);
      await fh.close().catch(() => undefined);
      await unlink(tmp).catch(() => undefined);
      throw err;
    }
    return { path, bytes: total };
  }
}

async function writeAll(fh: FileHandle, chunk: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < chunk.length) {
    const { bytesWritten } = await fh.write(chunk, done, chunk.length - done, position + done);
    done += bytesWritten;
  }
}
