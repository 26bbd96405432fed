// JSON Schema → finite GBNF: the language of every number rule is checked string by string against
// exact decimal arithmetic, with llama.cpp's grammar deciding what the GBNF admits; schemas that no
// value satisfies are refused naming where.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LlamaModel } from '../../native/llama.ts';
import { jsonSchemaToGbnf, SchemaGrammarError, type GbnfOptions } from '../../native/schema-grammar.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

// llama.cpp parses every GBNF against a vocabulary: a tokenizer-only load is enough.
let vocab: LlamaModel;
before(async () => {
  vocab = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { vocabOnly: true });
});
after(async () => {
  await vocab.dispose();
});

interface Admits {
  (text: string): boolean;
}
/** The schema's grammar as a membership test (no index: the text is matched character by character). */
async function grammarOf(schema: object, options?: GbnfOptions): Promise<Admits> {
  const g = await vocab.grammar(jsonSchemaToGbnf(schema, options), 'root', { maxStates: 1 });
  return (text) => g.admits(text);
}

const ACTION_SCHEMA = JSON.parse(readFileSync(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;

/** A schema with one required property x. */
const one = (x: object): object => ({ type: 'object', properties: { x }, required: ['x'], additionalProperties: false });

/** A seeded generator (LCG) of floats in [0, 1). */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

// Exact decimals: value × 10^12 as a bigint.
const SCALE = 12;
function exact(text: string): bigint {
  const neg = text.startsWith('-');
  const [ip = '0', fp = ''] = text.replace('-', '').split('.');
  const v = BigInt(ip + fp.padEnd(SCALE, '0'));
  return neg ? -v : v;
}
/** A JS number's exact decimal (its shortest representation, exponent included) × 10^12. */
function exactNum(x: number): bigint {
  const [mant = '0', exp = '0'] = String(x).toLowerCase().split('e');
  const v = exact(mant);
  const e = Number(exp);
  return e >= 0 ? v * 10n ** BigInt(e) : v / 10n ** BigInt(-e);
}

interface NumberSpec {
  readonly type: 'number' | 'integer';
  readonly minimum?: number;
  readonly maximum?: number;
  readonly exclusiveMinimum?: number;
  readonly exclusiveMaximum?: number;
  readonly multipleOf?: number;
}

/** What the grammar must admit: a plain JSON number (no exponent, no "-0"), at most `decimals` fraction digits, in range. */
function admissible(text: string, spec: NumberSpec, decimals: number): boolean {
  const m = /^-?(0|[1-9][0-9]*)(\.([0-9]+))?$/.exec(text);
  if (!m) return false;
  const d = spec.type === 'integer' ? 0 : decimals;
  if ((m[3]?.length ?? 0) > d || (m[2] !== undefined && d === 0)) return false;
  const v = exact(text);
  if (text.startsWith('-') && v === 0n) return false;
  if (spec.minimum !== undefined && v < exactNum(spec.minimum)) return false;
  if (spec.maximum !== undefined && v > exactNum(spec.maximum)) return false;
  if (spec.exclusiveMinimum !== undefined && v <= exactNum(spec.exclusiveMinimum)) return false;
  if (spec.exclusiveMaximum !== undefined && v >= exactNum(spec.exclusiveMaximum)) return false;
  return true;
}

/** Candidate texts around the spec's bounds: in range, out of range, too many digits, malformed. */
function candidates(spec: NumberSpec, next: () => number): string[] {
  const bounds = [spec.minimum, spec.maximum, spec.exclusiveMinimum, spec.exclusiveMaximum].filter((b): b is number => b !== undefined);
  const out = new Set<string>(['0', '-0', '1', '-1', '0.0', '00', '01', '1.', '.5', '1e2', '+1', '-', '0.00001']);
  for (const b of bounds) {
    for (const delta of [0, 1e-4, -1e-4, 1e-3, -1e-3, 0.5, -0.5, 1, -1, 1e-5]) {
      for (const digits of [0, 1, 2, 4, 5]) out.add((b + delta).toFixed(digits));
    }
  }
  const lo = Math.min(...bounds, -10);
  const hi = Math.max(...bounds, 10);
  for (let i = 0; i < 40; i++) {
    const x = lo - 1 + next() * (hi - lo + 2);
    out.add(x.toFixed(Math.floor(next() * 6)));
  }
  return [...out];
}

describe('jsonSchemaToGbnf: numbers bounded in value and digits', () => {
  const next = rng(42);
  const specs: NumberSpec[] = [
    { type: 'number', minimum: 0, maximum: 1 },
    { type: 'number', minimum: 0, maximum: 2 },
    { type: 'integer', minimum: -180, maximum: 180 },
    { type: 'number', minimum: -2.5, maximum: 3.75 },
    { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1 },
    { type: 'number', minimum: 0.001, maximum: 0.0025 },
    { type: 'number', minimum: -1000, maximum: -999.5 },
    { type: 'integer', minimum: 12, maximum: 12 },
    { type: 'integer', minimum: 7, maximum: 1234 },
    { type: 'number', minimum: 0.5, maximum: 0.5 },
    { type: 'integer', exclusiveMinimum: -3.5, maximum: 99 },
  ];
  for (let i = 0; i < 12; i++) {
    const a = Math.round((next() * 400 - 200) * 10 ** Math.floor(next() * 4)) / 10 ** Math.floor(next() * 4);
    const b = Number((a + Math.round(next() * 3000) / 100).toFixed(3));
    specs.push({ type: next() < 0.3 ? 'integer' : 'number', minimum: a, maximum: b });
  }

  for (const spec of specs) {
    test(`${JSON.stringify(spec)}: admits exactly the in-range texts`, async () => {
      const admits = await grammarOf(one(spec));
      const wrong: string[] = [];
      for (const text of candidates(spec, next)) {
        const want = admissible(text, spec, 4);
        if (admits(`{"x":${text}}`) !== want) wrong.push(`${text} (expected ${want ? 'admitted' : 'refused'})`);
      }
      assert.deepEqual(wrong, []);
    });
  }

  test('multipleOf: a power of ten sets the fraction digits, another lists the multiples', async () => {
    const cents = await grammarOf(one({ type: 'number', minimum: 0, maximum: 10, multipleOf: 0.01 }));
    for (const [text, want] of [
      ['9.99', true],
      ['0.5', true],
      ['0.123', false],
      ['10', true],
      ['10.01', false],
    ] as const) {
      assert.equal(cents(`{"x":${text}}`), want, text);
    }
    const quarters = await grammarOf(one({ type: 'number', minimum: -0.5, maximum: 1, multipleOf: 0.25 }));
    for (const [text, want] of [
      ['-0.5', true],
      ['-0.25', true],
      ['0', true],
      ['0.75', true],
      ['1', true],
      ['0.5', true],
      ['0.1', false],
      ['1.25', false],
      ['0.50', false],
    ] as const) {
      assert.equal(quarters(`{"x":${text}}`), want, text);
    }
    const fives = await grammarOf(one({ type: 'integer', minimum: 0, maximum: 20, multipleOf: 5 }));
    for (const [text, want] of [
      ['0', true],
      ['15', true],
      ['20', true],
      ['12', false],
      ['25', false],
    ] as const) {
      assert.equal(fives(`{"x":${text}}`), want, text);
    }
  });

  test('missing bounds: |v| < 10^integerDigits, fraction digits from options.decimals', async () => {
    const g = await grammarOf(one({ type: 'number' }), { integerDigits: 3, decimals: 2 });
    for (const [text, want] of [
      ['999.99', true],
      ['-999.99', true],
      ['1000', false],
      ['0.123', false],
      ['-0.01', true],
    ] as const) {
      assert.equal(g(`{"x":${text}}`), want, text);
    }
    const big = await grammarOf(one({ type: 'integer', minimum: 5000000 }), { integerDigits: 2 });
    assert.equal(big('{"x":5000050}'), true);
    assert.equal(big('{"x":4999999}'), false);
  });
});

describe('jsonSchemaToGbnf: the action grammar', () => {
  // Schema order: the target (optional) comes before the action.
  const valid =
    '{"target":{"label":"cup","bbox":[0.1,0.2,0.3,0.4]},"action":"move","confidence":0.5,"speed":1.25,"heading_deg":-90,"hazards":["edge"]}';

  test('compact separators, bounded numbers and arrays, every property in schema order', async () => {
    const gbnf = jsonSchemaToGbnf(ACTION_SCHEMA);
    assert.match(gbnf, /^space ::= ""$/m);
    const g = await grammarOf(ACTION_SCHEMA);
    assert.equal(g(valid), true);
    assert.equal(g('{"action":"stop","confidence":1}'), true);
    assert.equal(g('{"target":{"label":"person"},"action":"stop","confidence":1}'), true);
    for (const bad of [
      valid.replace('"move",', '"move", '), // whitespace
      valid.replace('0.5', '1.5'), // above maximum
      valid.replace('0.5', '0.12345'), // five decimals
      valid.replace('0.5', '5e-1'), // exponent
      valid.replace('-90', '-181'),
      valid.replace('[0.1,0.2,0.3,0.4]', '[0.1,0.2,0.3]'), // minItems 4
      valid.replace('["edge"]', '["edge","edge","edge","edge"]'), // maxItems 3
      valid.replace('"speed":1.25,"heading_deg":-90', '"heading_deg":-90,"speed":1.25'), // schema order
      // The old order (llama.cpp's: required first), the target after the action.
      '{"action":"move","confidence":0.5,"speed":1.25,"heading_deg":-90,"target":{"label":"cup","bbox":[0.1,0.2,0.3,0.4]},"hazards":["edge"]}',
      '{"action":"stop","confidence":1,"target":{"label":"person"}}',
      '{"confidence":0.5}', // required action
      '{"target":{"label":"cup"}}', // required action and confidence
    ]) {
      assert.equal(g(bad), false, bad);
    }
    assert.match(jsonSchemaToGbnf(ACTION_SCHEMA, { compact: false }), /^space ::= \| " " \| "\\n"/m);
  });

  test('free strings are bounded printable ASCII; arrays get a default maxItems', async () => {
    const g = await grammarOf(
      {
        type: 'object',
        properties: { s: { type: 'string' }, a: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 9 } } },
        required: ['s', 'a'],
      },
      { maxStringLength: 4, maxItems: 3 },
    );
    for (const [text, want] of [
      ['{"s":"ab c","a":[1,2,3]}', true],
      ['{"s":"abcde","a":[]}', false],
      ['{"s":"é","a":[]}', false],
      ['{"s":"a\\"","a":[]}', false],
      ['{"s":"","a":[1,2,3,4]}', false],
    ] as const) {
      assert.equal(g(text), want, text);
    }
  });

  test('options are checked', () => {
    assert.throws(() => jsonSchemaToGbnf(ACTION_SCHEMA, { decimals: -1 }), /options\.decimals/);
    assert.throws(() => jsonSchemaToGbnf('{not json'), /not valid JSON/);
  });
});

describe('jsonSchemaToGbnf: the order of properties', () => {
  const digit = { type: 'integer', minimum: 0, maximum: 9 };
  /** An object of digit properties `keys`, in that order, with `required`. */
  const object = (keys: string[], required: string[], extra: object = {}): object => ({
    type: 'object',
    properties: Object.fromEntries(keys.map((k) => [k, digit])),
    required,
    ...extra,
  });
  /** Every text of every ordering of every subset of `keys`, values 1, 2, … in key order. */
  function texts(keys: string[]): string[][] {
    const out: string[][] = [[]];
    const grow = (prefix: string[]): void => {
      for (const k of keys) {
        if (prefix.includes(k)) continue;
        out.push([...prefix, k]);
        grow([...prefix, k]);
      }
    };
    grow([]);
    return out;
  }
  const text = (ks: string[]): string => `{${ks.map((k) => `"${k}":${'abcde'.indexOf(k) + 1}`).join(',')}}`;
  /** A closed object holding `p` and `q`, both required. */
  const pair = (p: object, q: object): object => ({
    type: 'object',
    properties: { p, q },
    required: ['p', 'q'],
    additionalProperties: false,
  });
  /** The keys are a subsequence of `order` and hold every required one. */
  const inOrder = (ks: string[], order: string[], required: string[]): boolean =>
    required.every((r) => ks.includes(r)) && ks.every((k, i) => i === 0 || order.indexOf(k) > order.indexOf(ks[i - 1]!));

  test('a closed object: every property in schema order, an optional one before the required one', async () => {
    const g = await grammarOf(object(['a', 'b', 'c'], ['b'], { additionalProperties: false }));
    for (const [t, want] of [
      ['{"a":1,"b":2,"c":3}', true],
      ['{"b":2}', true],
      ['{"a":1,"b":2}', true],
      ['{"b":2,"c":3}', true],
      ['{"b":2,"a":1}', false], // llama.cpp's order: required first
      ['{"c":3,"b":2}', false],
      ['{"a":1}', false], // b is required
      ['{"a":1,"c":3}', false],
      ['{}', false],
    ] as const) {
      assert.equal(g(t), want, t);
    }
    const wrong = texts(['a', 'b', 'c']).filter((ks) => g(text(ks)) !== inOrder(ks, ['a', 'b', 'c'], ['b']));
    assert.deepEqual(wrong.map(text), []);
  });

  test('a closed object: optional and required properties interleaved, and nested', async () => {
    const keys = ['a', 'b', 'c', 'd', 'e'];
    const g = await grammarOf(object(keys, ['b', 'd'], { additionalProperties: false }));
    const wrong = texts(keys).filter((ks) => g(text(ks)) !== inOrder(ks, keys, ['b', 'd']));
    assert.deepEqual(wrong.map(text), []);
    assert.equal(g('{"a":1,"b":2,"c":3,"d":4,"e":5}'), true);
    assert.equal(g('{"b":2,"d":4,"a":1,"c":3,"e":5}'), false);
    const nested = await grammarOf(one(object(['a', 'b'], ['b'], { additionalProperties: false })));
    assert.equal(nested('{"x":{"a":1,"b":2}}'), true);
    assert.equal(nested('{"x":{"b":2}}'), true);
    assert.equal(nested('{"x":{"b":2,"a":1}}'), false);
  });

  test('without additionalProperties, listed properties only (as llama.cpp admits them), in schema order', async () => {
    const g = await grammarOf(object(['a', 'b', 'c'], ['b']));
    const wrong = texts(['a', 'b', 'c']).filter((ks) => g(text(ks)) !== inOrder(ks, ['a', 'b', 'c'], ['b']));
    assert.deepEqual(wrong.map(text), []);
    assert.equal(g('{"b":2,"z":0}'), false);
  });

  test("an object that admits extra properties keeps llama.cpp's order: required first, then the optional ones", async () => {
    for (const additionalProperties of [true, digit]) {
      const g = await grammarOf(object(['a', 'b', 'c'], ['b'], { additionalProperties }));
      assert.equal(g('{"b":2,"a":1,"c":3}'), true);
      assert.equal(g('{"b":2,"a":1,"z":0}'), true);
      assert.equal(g('{"a":1,"b":2}'), false);
    }
  });

  test('objects of the same properties at several places: each in schema order; an open one keeps its extras', async () => {
    const closed = object(['a', 'b'], ['b'], { additionalProperties: false });
    const two = await grammarOf(pair(closed, closed));
    assert.equal(two('{"p":{"a":1,"b":2},"q":{"b":2}}'), true);
    assert.equal(two('{"p":{"b":2},"q":{"b":2,"a":1}}'), false);
    const open = object(['a', 'b'], ['b'], { additionalProperties: true });
    const mixed = await grammarOf(pair(closed, open));
    assert.equal(mixed('{"p":{"a":1,"b":2},"q":{"b":2,"a":1,"z":0}}'), true);
    assert.equal(mixed('{"p":{"b":2,"a":1},"q":{"b":2}}'), false);
  });

  test('the same properties in two orders are refused, naming where, also when one is llama.cpp order', () => {
    const llama = object(['a', 'b'], ['a'], { additionalProperties: false });
    const other = object(['b', 'a'], ['a'], { additionalProperties: false });
    assert.throws(
      () => jsonSchemaToGbnf(pair(llama, other)),
      (err: unknown) => err instanceof SchemaGrammarError && /in another order/.test(err.message),
    );

    const p = object(['a', 'b', 'c'], ['c'], { additionalProperties: false });
    const q = object(['b', 'a', 'c'], ['c'], { additionalProperties: false });
    assert.throws(
      () => jsonSchemaToGbnf(pair(p, q)),
      (err: unknown) =>
        err instanceof SchemaGrammarError && err.path === '#/properties/q' && /#\/properties\/p in another order/.test(err.message),
    );
  });
});

describe('jsonSchemaToGbnf: a schema no value satisfies is refused, naming where', () => {
  const cases: [string, object, string, RegExp][] = [
    [
      'minimum above maximum',
      { properties: { speed: { type: 'number', minimum: 5, maximum: 1 } } },
      '#/properties/speed',
      /minimum 5, maximum 1/,
    ],
    ['an empty enum', { properties: { a: { enum: [] } } }, '#/properties/a/enum', /empty enum/],
    [
      'minItems above maxItems',
      { properties: { b: { type: 'array', minItems: 5, maxItems: 2 } } },
      '#/properties/b',
      /minItems 5 > maxItems 2/,
    ],
    [
      'minLength above maxLength',
      { properties: { s: { type: 'string', minLength: 3, maxLength: 2 } } },
      '#/properties/s',
      /minLength 3 > maxLength 2/,
    ],
    [
      'a required property that cannot exist',
      { type: 'object', required: ['z'], properties: {}, additionalProperties: false },
      '#/required',
      /"z"/,
    ],
    ['enum values of the wrong type', { properties: { t: { type: 'string', enum: [1, 2] } } }, '#/properties/t/enum', /not of type string/],
    ['no integer in range', { properties: { i: { type: 'integer', minimum: 0.2, maximum: 0.8 } } }, '#/properties/i', /no integer/],
    [
      'no multiple in range',
      { properties: { m: { type: 'number', minimum: 0.1, maximum: 0.2, multipleOf: 0.25 } } },
      '#/properties/m',
      /no multiple of 0.25/,
    ],
    ['the schema false', { properties: { f: false } }, '#/properties/f', /admits no value/],
    [
      'array items nothing satisfies',
      { properties: { n: { type: 'array', items: { type: 'number', minimum: 1, maximum: 0 } } } },
      '#/properties/n/items',
      /minimum 1/,
    ],
    [
      'a definition',
      { $defs: { bad: { type: 'integer', minimum: 1, maximum: 0 } }, properties: { r: { $ref: '#/$defs/bad' } } },
      '#/$defs/bad',
      /no integer/,
    ],
    ['a const of the wrong type', { properties: { c: { const: 'x', type: 'number' } } }, '#/properties/c/const', /not of type number/],
    [
      'anyOf with no satisfiable branch',
      { properties: { u: { anyOf: [{ type: 'number', minimum: 3, maximum: 2 }, { enum: [] }] } } },
      '#/properties/u/anyOf/0',
      /minimum 3/,
    ],
  ];
  for (const [name, schema, path, message] of cases) {
    test(name, () => {
      assert.throws(
        () => jsonSchemaToGbnf({ type: 'object', ...schema }),
        (err: unknown) =>
          err instanceof SchemaGrammarError && err.path === path && message.test(err.message) && err.message.startsWith(`schema ${path}:`),
      );
    });
  }

  test('an unsatisfiable anyOf branch is dropped when another remains', async () => {
    const g = await grammarOf(one({ anyOf: [{ type: 'integer', minimum: 3, maximum: 2 }, { type: 'boolean' }] }));
    assert.equal(g('{"x":true}'), true);
    assert.equal(g('{"x":3}'), false);
  });
});
