// The binding's argument validators (native/args.ts) and the same message shape from the typed API
// and from C++'s second line of checks: tables of bad values, each asserting the exact message.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  bool,
  coded,
  describe as describeValue,
  graft,
  intIn,
  invalid,
  knownKeys,
  nonEmptyString,
  numIn,
  oneOf,
  plainObject,
} from '../../native/args.ts';
import { loadAddon } from '../../native/binding.ts';
import { LlamaModel } from '../../native/llama.ts';
import { layoutPixels } from '../../native/pixels.ts';
import { LlamaVision } from '../../native/vision.ts';

/** Runs `fn` and returns the message of what it throws (or rejects with). */
async function messageOf(fn: () => unknown): Promise<string> {
  try {
    await fn();
  } catch (err) {
    return (err as Error).message;
  }
  assert.fail('expected a throw');
}

test('describe shows a value the same way for every type', () => {
  const table: [unknown, string][] = [
    [5, '5 of type number'],
    [1.5, '1.5 of type number'],
    [NaN, 'NaN of type number'],
    ['x', 'x of type string'],
    [true, 'true of type boolean'],
    [undefined, 'undefined of type undefined'],
    [null, 'null'],
    [[1, 2], 'array'],
    [{ a: 1 }, '[object Object] of type object'],
    [7n, '7n'],
    [Symbol('s'), 'a symbol'],
    [() => 1, 'a function'],
  ];
  for (const [v, want] of table) assert.equal(describeValue(v), want);
});

test('validators: bad values give "Expected X for Y but received Z"', () => {
  const table: [() => unknown, string][] = [
    [() => intIn('n', 1.5, 0, 9), 'Expected an integer between 0 and 9 for n but received 1.5 of type number'],
    [() => intIn('n', 10, 0, 9), 'Expected an integer between 0 and 9 for n but received 10 of type number'],
    [() => intIn('n', '3', 0, 9), 'Expected an integer between 0 and 9 for n but received 3 of type string'],
    [() => numIn('p', Infinity, 0, 1), 'Expected a number between 0 and 1 for p but received Infinity of type number'],
    [() => numIn('p', -0.5, 0, 1), 'Expected a number between 0 and 1 for p but received -0.5 of type number'],
    [() => bool('b', 1), 'Expected a boolean for b but received 1 of type number'],
    [() => nonEmptyString('path', ''), 'Expected a non-empty string for path but received  of type string'],
    [() => nonEmptyString('path', null), 'Expected a non-empty string for path but received null'],
    [() => oneOf('kv', 'q4', ['f16', 'q8_0']), "Expected 'f16' or 'q8_0' for kv but received q4 of type string"],
    [() => oneOf('fa', 'yes', [true, false, 'auto']), "Expected true, false or 'auto' for fa but received yes of type string"],
    [() => plainObject('options', [1]), 'Expected an object for options but received array'],
    [() => plainObject('options', null), 'Expected an object for options but received null'],
    [
      () => knownKeys('options', { nCtx: 1, bogus: 2 }, ['nCtx', 'nBatch']),
      'Expected undefined (options takes only nCtx and nBatch) for options.bogus but received 2 of type number',
    ],
  ];
  for (const [fn, want] of table) {
    assert.throws(fn, (e: unknown) => e instanceof TypeError && e.message === want, want);
  }
});

test('validators return the checked value', () => {
  assert.equal(intIn('n', 9, 0, 9), 9);
  assert.equal(numIn('p', 0.25, 0, 1), 0.25);
  assert.equal(bool('b', false), false);
  assert.equal(oneOf('fa', 'auto', [true, false, 'auto']), 'auto');
  assert.doesNotThrow(() => knownKeys('options', { nCtx: 1 }, ['nCtx']));
  assert.equal(invalid('x', 'y', 1).message, 'Expected y for x but received 1 of type number');
});

test('graft keeps the native message and code, with the caller stack', () => {
  const stack = new Error('caller');
  const native = coded('EBUSY', 'busy');
  const out = graft(native, stack);
  assert.equal(out.message, 'busy');
  assert.equal((out as Error & { code?: string }).code, 'EBUSY');
  assert.match(out.stack ?? '', /^Error: busy\n/);
  assert.equal(out.stack?.split('\n')[1], stack.stack?.split('\n')[1]);
  assert.equal(graft('plain', stack).message, 'plain');
});

test('the typed API refuses bad options with the same shape (no model needed)', async () => {
  const table: [() => unknown, string][] = [
    [() => LlamaModel.load(''), 'Expected a non-empty string for path but received  of type string'],
    [
      () => LlamaModel.load('m.gguf', { gpuLayers: 1.5 }),
      'Expected an integer between -1 and 100000 for options.gpuLayers but received 1.5 of type number',
    ],
    [() => LlamaModel.load('m.gguf', { mmap: 'yes' as never }), 'Expected a boolean for options.mmap but received yes of type string'],
    [
      () => LlamaModel.load('m.gguf', { bogus: 1 } as never),
      'Expected undefined (options takes only gpuLayers, mmap, vocabOnly and perLayerEmbeddingsOnGpu) for options.bogus but received 1 of type number',
    ],
    [
      () => LlamaModel.load('m.gguf', { perLayerEmbeddingsOnGpu: 'on' as never }),
      'Expected a boolean for options.perLayerEmbeddingsOnGpu but received on of type string',
    ],
    [
      () => LlamaVision.load('v.gguf', { threads: 0 }),
      'Expected an integer between 1 and 1024 for options.threads but received 0 of type number',
    ],
    [
      () => LlamaVision.load('v.gguf', { flashAttention: 'yes' as never }),
      "Expected 'auto', 'on', 'off', 'padded' or 'percept' for options.flashAttention but received yes of type string",
    ],
    [() => LlamaVision.load('v.gguf', { warmup: 1 as never }), 'Expected a boolean for options.warmup but received 1 of type number'],
    [
      () => LlamaVision.load('v.gguf', { gpu: true } as never),
      'Expected undefined (options takes only useGpu, threads, flashAttention, warmup, profile and graph) for options.gpu but received true of type boolean',
    ],
    [
      () => LlamaVision.load('v.gguf', { profile: 'ops' as never }),
      'Expected a boolean for options.profile but received ops of type string',
    ],
    [
      () => layoutPixels(new Uint8Array(12), new Float32Array(12), { width: 2, height: 2, channels: 5 as never, layout: 'chw' }),
      'Expected an integer between 1 and 4 for options.channels but received 5 of type number',
    ],
    [
      () => layoutPixels(new Uint8Array(12), new Float32Array(12), { width: 2, height: 2, channels: 3, rows: 1, layout: 'chw' }),
      'Expected an integer between 2 and 65536 for options.rows but received 1 of type number',
    ],
    [
      () => layoutPixels(new Uint8Array(12), new Float32Array(12), { width: 2, height: 2, channels: 3, layout: 'hwc' as never }),
      "Expected 'chw' or 'patches' for options.layout but received hwc of type string",
    ],
    [
      () => layoutPixels(new Uint8Array(12), new Float32Array(12), { width: 2, height: 2, channels: 3, layout: 'chw', scale: 0 }),
      'Expected a finite non-zero number for options.scale but received 0 of type number',
    ],
  ];
  for (const [fn, want] of table) assert.equal(await messageOf(fn), want);
});

test('C++ checks every field again, required, with the same message shape', async () => {
  const addon = loadAddon();
  const load = { gpuLayers: 0, mmap: true, vocabOnly: false, perLayerEmbeddingsOnGpu: null, perLayerEmbeddingsPattern: '^token_embd' };
  const vision = { useGpu: false, threads: 1, flashAttention: 'auto' as const, warmup: false, profile: false, graph: 'percept' as const };
  const layout = {
    width: 2,
    height: 2,
    channels: 3,
    stride: 6,
    rows: 2,
    kernel: 'linear' as const,
    orientation: 1,
    bgr: false,
    layout: 'chw' as const,
    patch: 16,
    scale: 1,
    offset: 0,
  };
  const px = (options: object) => addon.layoutPixels(new Uint8Array(12), new Float32Array(12), options as typeof layout);
  const table: [() => unknown, string][] = [
    [
      () => addon.Model.load('m.gguf', { ...load, gpuLayers: 1.5 }),
      'Expected an integer between -1 and 100000 for Model.load options.gpuLayers but received 1.5 of type number',
    ],
    [
      () => addon.Model.load('m.gguf', { gpuLayers: 0, mmap: true } as never),
      'Expected a boolean for Model.load options.vocabOnly but received undefined of type undefined',
    ],
    [() => addon.Model.load('m.gguf', null as never), 'Expected an object for Model.load options but received null'],
    [
      () => addon.Model.load('m.gguf', { ...load, perLayerEmbeddingsOnGpu: 'on' as never }),
      'Expected a boolean for Model.load options.perLayerEmbeddingsOnGpu but received on of type string',
    ],
    [
      () => addon.Model.load('m.gguf', { ...load, perLayerEmbeddingsPattern: undefined as never }),
      'Expected a string for Model.load options.perLayerEmbeddingsPattern but received undefined of type undefined',
    ],
    [
      () => addon.Vision.load('v.gguf', { ...vision, threads: 0 }),
      'Expected an integer between 1 and 1024 for Vision.load options.threads but received 0 of type number',
    ],
    [
      () => addon.Vision.load('v.gguf', { ...vision, flashAttention: 'yes' as never }),
      "Expected 'auto', 'on', 'off', 'padded' or 'percept' for Vision.load options.flashAttention but received yes of type string",
    ],
    [
      () => addon.Vision.load('v.gguf', { useGpu: false, threads: 1, flashAttention: 'auto', warmup: false } as never),
      'Expected a boolean for Vision.load options.profile but received undefined of type undefined',
    ],
    [
      () => addon.Vision.load('v.gguf', { ...vision, graph: 'ggml' as never }),
      "Expected 'percept' or 'clip' for Vision.load options.graph but received ggml of type string",
    ],
    [
      () => px({ ...layout, stride: 5 }),
      'Expected an integer between 6 and 1099511627776 for layoutPixels options.stride but received 5 of type number',
    ],
    [
      () => px({ ...layout, kernel: undefined }),
      "Expected 'linear' or 'cubic' for layoutPixels options.kernel but received undefined of type undefined",
    ],
    [() => px({ ...layout, scale: 0 }), 'Expected a non-zero number for layoutPixels options.scale but received 0 of type number'],
  ];
  for (const [fn, want] of table) assert.equal(await messageOf(fn), want);
});
