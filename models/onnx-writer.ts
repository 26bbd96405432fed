// A small ONNX graph builder over onnx-proto, for synthetic test and benchmark models.
// Opset 20 / IR 9 by default: Gelu needs opset 20, and ReduceMean/ReduceSum take their axes as an input from opset 18.
// Initializers are written as rawData, little-endian bytes.
// Big ones go to an external, 64-byte aligned data file (`<model>.data`), produced lazily one tensor at a time.
// So a model of gigabytes never sits in memory whole.
import { closeSync, openSync, writeFileSync, writeSync } from 'node:fs';
import { basename } from 'node:path';
import onnxProto from 'onnx-proto';

const { onnx } = onnxProto;

/** ONNX TensorProto.DataType codes used here. */
export const OnnxType = { float: 1, uint8: 2, int32: 6, int64: 7, bool: 9, float16: 10 } as const;
export type OnnxElemType = keyof typeof OnnxType;

export type TensorData = Float32Array | BigInt64Array | Int32Array | Uint8Array | Uint16Array;
/** Dimensions of a graph input/output: numbers are fixed, strings are symbolic (dim_param). */
export type SymbolicDims = readonly (number | string)[];
export type AttrValue = number | string | readonly number[] | { readonly float: number } | { readonly floats: readonly number[] };

interface PendingInitializer {
  readonly name: string;
  readonly elemType: OnnxElemType;
  readonly dims: readonly number[];
  readonly byteLength: number;
  readonly produce: () => TensorData;
  /** Counted in `params` (constants such as shapes and scalars are not). */
  readonly isWeight: boolean;
}

const elemBytes: Record<OnnxElemType, number> = { float: 4, uint8: 1, int32: 4, int64: 8, bool: 1, float16: 2 };
const EXTERNAL_ALIGN = 64;

export interface OnnxModelInfo {
  readonly path: string;
  /** Present when weights went to an external file. */
  readonly dataPath?: string;
  readonly nodes: number;
  readonly initializers: number;
  /** Number of scalar weights (initializers added with weight()). */
  readonly params: number;
  readonly bytes: number;
}

export interface OnnxGraphOptions {
  readonly name: string;
  readonly opset?: number;
  readonly irVersion?: number;
  readonly producer?: string;
  readonly docString?: string;
}

export interface OnnxWriteOptions {
  /** Write weights to `<path>.data` when their total exceeds this many bytes (default 512 MiB). */
  readonly externalDataThreshold?: number;
  readonly metadata?: Readonly<Record<string, string>>;
  /** External data file (default `<path>.data`); must sit in the model's folder (it is named by base name). */
  readonly dataPath?: string;
  /** Called after each initializer with bytes written so far and the total. */
  readonly onProgress?: (doneBytes: number, totalBytes: number) => void;
}

function tensorBytes(data: TensorData): Uint8Array {
  return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
}

function valueInfo(name: string, elemType: OnnxElemType, dims: SymbolicDims): InstanceType<typeof onnx.ValueInfoProto> {
  return onnx.ValueInfoProto.create({
    name,
    type: {
      tensorType: {
        elemType: OnnxType[elemType],
        shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) },
      },
    },
  });
}

function attribute(name: string, value: AttrValue): InstanceType<typeof onnx.AttributeProto> {
  const T = onnx.AttributeProto.AttributeType;
  if (typeof value === 'number') {
    if (!Number.isInteger(value)) throw new TypeError(`attribute ${name}: ${value} is not an integer (wrap floats as {float})`);
    return onnx.AttributeProto.create({ name, type: T.INT, i: value });
  }
  if (typeof value === 'string') return onnx.AttributeProto.create({ name, type: T.STRING, s: new TextEncoder().encode(value) });
  if (Array.isArray(value)) return onnx.AttributeProto.create({ name, type: T.INTS, ints: [...(value as number[])] });
  if ('float' in value) return onnx.AttributeProto.create({ name, type: T.FLOAT, f: value.float });
  return onnx.AttributeProto.create({ name, type: T.FLOATS, floats: [...(value as { readonly floats: readonly number[] }).floats] });
}

/** Builds one ONNX graph. Node outputs get unique generated names unless given. */
export class OnnxGraphBuilder {
  readonly #opts: Required<Omit<OnnxGraphOptions, 'docString'>> & { docString: string };
  readonly #nodes: InstanceType<typeof onnx.NodeProto>[] = [];
  readonly #inputs: InstanceType<typeof onnx.ValueInfoProto>[] = [];
  readonly #outputs: InstanceType<typeof onnx.ValueInfoProto>[] = [];
  readonly #initializers: PendingInitializer[] = [];
  readonly #names = new Set<string>();
  #counter = 0;

  constructor(opts: OnnxGraphOptions) {
    this.#opts = {
      name: opts.name,
      opset: opts.opset ?? 20,
      irVersion: opts.irVersion ?? 9,
      producer: opts.producer ?? 'percept',
      docString: opts.docString ?? '',
    };
  }

  #claim(name: string): string {
    if (this.#names.has(name)) throw new Error(`OnnxGraphBuilder: duplicate tensor name '${name}'`);
    this.#names.add(name);
    return name;
  }

  #fresh(prefix: string): string {
    let name: string;
    do name = `${prefix}_${this.#counter++}`;
    while (this.#names.has(name));
    return name;
  }

  input(name: string, elemType: OnnxElemType, dims: SymbolicDims): string {
    this.#inputs.push(valueInfo(this.#claim(name), elemType, dims));
    return name;
  }

  /** Declares a graph output; `source` is renamed to `name` through an Identity node when they differ. */
  output(name: string, elemType: OnnxElemType, dims: SymbolicDims, source?: string): string {
    if (source !== undefined && source !== name) this.node('Identity', [source], {}, name);
    this.#outputs.push(valueInfo(name, elemType, dims));
    return name;
  }

  /** A weight whose data is produced when the model is written (lazily, for big models). */
  weight(name: string, dims: readonly number[], produce: () => Float32Array): string {
    return this.#addInitializer(name, 'float', dims, produce, true);
  }

  /** A constant tensor (shape, index, scalar): not counted as a parameter. */
  initializer(name: string, elemType: OnnxElemType, dims: readonly number[], data: TensorData | (() => TensorData)): string {
    return this.#addInitializer(name, elemType, dims, data, false);
  }

  #addInitializer(
    name: string,
    elemType: OnnxElemType,
    dims: readonly number[],
    data: TensorData | (() => TensorData),
    isWeight: boolean,
  ): string {
    const count = dims.reduce((a, b) => a * b, 1);
    const produce = typeof data === 'function' ? data : () => data;
    if (typeof data !== 'function' && data.length !== count) {
      throw new RangeError(`initializer ${name}: ${data.length} elements for dims [${dims.join(',')}] (${count})`);
    }
    this.#initializers.push({
      name: this.#claim(name),
      elemType,
      dims: [...dims],
      byteLength: count * elemBytes[elemType],
      produce,
      isWeight,
    });
    return name;
  }

  constI64(values: readonly number[], name?: string): string {
    const data = BigInt64Array.from(values, (v) => BigInt(v));
    return this.initializer(name ?? this.#fresh('i64'), 'int64', [values.length], data);
  }

  /** A scalar (rank 0) float constant. */
  scalar(value: number, name?: string): string {
    return this.initializer(name ?? this.#fresh('f32'), 'float', [], Float32Array.of(value));
  }

  /** Adds a node and returns its first output (or the names of `outputs` when a count > 1 is asked). */
  node(opType: string, inputs: readonly string[], attrs: Readonly<Record<string, AttrValue>> = {}, output?: string): string {
    return this.nodeN(opType, inputs, 1, attrs, output === undefined ? undefined : [output])[0]!;
  }

  nodeN(
    opType: string,
    inputs: readonly string[],
    count: number,
    attrs: Readonly<Record<string, AttrValue>> = {},
    outputs?: readonly string[],
  ): string[] {
    const outs = (outputs ?? Array.from({ length: count }, () => this.#fresh(opType.toLowerCase()))).map((o) => this.#claim(o));
    this.#nodes.push(
      onnx.NodeProto.create({
        opType,
        name: `${opType}_${this.#nodes.length}`,
        input: [...inputs],
        output: outs,
        attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)),
      }),
    );
    return outs;
  }

  get nodeCount(): number {
    return this.#nodes.length;
  }

  /** Serializes the model to `path` (and `<path>.data` for external weights). */
  write(path: string, opts: OnnxWriteOptions = {}): OnnxModelInfo {
    const threshold = opts.externalDataThreshold ?? 512 * 1024 * 1024;
    const totalBytes = this.#initializers.reduce((a, t) => a + t.byteLength, 0);
    const external = totalBytes > threshold;
    const dataPath = opts.dataPath ?? `${path}.data`;
    let params = 0;
    let doneBytes = 0;
    const tensors: InstanceType<typeof onnx.TensorProto>[] = [];
    let fd = -1;
    let offset = 0;
    try {
      if (external) fd = openSync(dataPath, 'w');
      for (const init of this.#initializers) {
        const data = init.produce();
        if (data.byteLength !== init.byteLength) {
          throw new RangeError(`initializer ${init.name}: produced ${data.byteLength} bytes, expected ${init.byteLength}`);
        }
        if (init.isWeight) params += data.length;
        const base = { name: init.name, dims: [...init.dims], dataType: OnnxType[init.elemType] };
        // Small tensors (shapes, scalars) stay inline even in external mode: ORT reads them at load.
        if (external && init.byteLength >= 1024) {
          const pad = (EXTERNAL_ALIGN - (offset % EXTERNAL_ALIGN)) % EXTERNAL_ALIGN;
          if (pad) writeSync(fd, new Uint8Array(pad));
          offset += pad;
          writeSync(fd, tensorBytes(data));
          tensors.push(
            onnx.TensorProto.create({
              ...base,
              dataLocation: onnx.TensorProto.DataLocation.EXTERNAL,
              externalData: [
                { key: 'location', value: basename(dataPath) },
                { key: 'offset', value: String(offset) },
                { key: 'length', value: String(data.byteLength) },
              ],
            }),
          );
          offset += data.byteLength;
        } else {
          tensors.push(onnx.TensorProto.create({ ...base, rawData: tensorBytes(data).slice() }));
        }
        doneBytes += init.byteLength;
        opts.onProgress?.(doneBytes, totalBytes);
      }
    } finally {
      if (fd >= 0) closeSync(fd);
    }
    const model = onnx.ModelProto.create({
      irVersion: this.#opts.irVersion,
      producerName: this.#opts.producer,
      opsetImport: [{ domain: '', version: this.#opts.opset }],
      docString: this.#opts.docString,
      metadataProps: Object.entries(opts.metadata ?? {}).map(([key, value]) => ({ key, value })),
      graph: {
        name: this.#opts.name,
        node: this.#nodes,
        input: this.#inputs,
        output: this.#outputs,
        initializer: tensors,
      },
    });
    const bytes = onnx.ModelProto.encode(model).finish();
    writeFileSync(path, bytes);
    return {
      path,
      ...(external ? { dataPath } : {}),
      nodes: this.#nodes.length,
      initializers: tensors.length,
      params,
      bytes: bytes.byteLength + (external ? offset : 0),
    };
  }
}

/** Deterministic weights: xorshift128+ style generator (fast enough for ~10^9 draws), uniform with a
 * given standard deviation. Not cryptographic; the point is byte-identical models for a seed. */
export class SeededRandom {
  #a: number;
  #b: number;
  #c: number;
  #d: number;

  constructor(seed: number) {
    // splitmix32 to spread small seeds over the whole state
    let s = seed >>> 0;
    const next = (): number => {
      s = (s + 0x9e3779b9) | 0;
      let z = s;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.#a = next();
    this.#b = next();
    this.#c = next();
    this.#d = next() | 1;
  }

  /** Uniform in [0, 1). xoshiro128** */
  next(): number {
    const r = Math.imul(this.#rotl(Math.imul(this.#b, 5), 7), 9) >>> 0;
    const t = this.#b << 9;
    this.#c ^= this.#a;
    this.#d ^= this.#b;
    this.#b ^= this.#c;
    this.#a ^= this.#d;
    this.#c ^= t;
    this.#d = this.#rotl(this.#d, 11);
    return r / 4294967296;
  }

  #rotl(x: number, k: number): number {
    return (x << k) | (x >>> (32 - k));
  }

  /** `n` values uniform around `mean` with standard deviation `std`. */
  fill(n: number, std: number, mean = 0): Float32Array {
    const out = new Float32Array(n);
    const half = std * Math.sqrt(3);
    for (let i = 0; i < n; i++) out[i] = mean + (this.next() * 2 - 1) * half;
    return out;
  }
}

/** Stable per-tensor seed from a model seed and a tensor name (FNV-1a).
 * So each weight can be regenerated on its own, as the JS reference forward pass in the tests does. */
export function tensorSeed(seed: number, name: string): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}
