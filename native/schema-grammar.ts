// JSON Schema → GBNF for schema-constrained decoding.
// llama.cpp's converter (common/json-schema-to-grammar) writes the structure: objects, arrays, enums, $ref, anyOf.
// Objects without extra properties keep every property in schema order, required or not, as llguidance does
// (llama.cpp's converter puts required ones first; inSchemaOrder rewrites that): the schema says what comes first.
// Before it runs, the schema is checked: a schema no value satisfies is refused, naming where.
// The schema is also made finite. Numbers and integers become rules bounded in value and digits.
// Free strings and arrays get length bounds.
// Those number and string rules are written here and spliced into llama.cpp's output.
// So the result is one GBNF that llama.cpp parses, and every text it admits is a value the schema accepts.
import { loadAddon } from './binding.ts';

export interface GbnfOptions {
  /** No whitespace between JSON tokens (default true). false: llama.cpp's optional whitespace. */
  readonly compact?: boolean;
  /** Fraction digits of a number whose schema has no multipleOf (default 4). */
  readonly decimals?: number;
  /** Bound for a number or integer without minimum or maximum: |v| < 10^integerDigits (default 6). */
  readonly integerDigits?: number;
  /** maxLength of a free string without one (default 32). Free strings are printable ASCII without escapes. */
  readonly maxStringLength?: number;
  /** maxItems of an array without one (default 8). */
  readonly maxItems?: number;
}

/** A schema (or a part of it) that no JSON value satisfies, or that the grammar cannot express. */
export class SchemaGrammarError extends Error {
  readonly code = 'ESCHEMA';
  /** JSON pointer into the schema, e.g. `#/properties/speed`. */
  readonly path: string;
  constructor(path: string, message: string) {
    super(`schema ${path}: ${message}`);
    this.name = 'SchemaGrammarError';
    this.path = path;
  }
}

type Node = Record<string, unknown>;
interface Resolved {
  readonly compact: boolean;
  readonly decimals: number;
  readonly integerDigits: number;
  readonly maxStringLength: number;
  readonly maxItems: number;
}

const intOption = (name: string, v: unknown, def: number, min: number, max: number): number => {
  if (v === undefined) return def;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new TypeError(`Expected an integer between ${min} and ${max} for options.${name} but received ${String(v)}`);
  }
  return v;
};

/**
 * Turns a JSON Schema (object or JSON text) into llama.cpp GBNF whose language is finite wherever
 * the schema is not recursive. Throws SchemaGrammarError for a schema no value satisfies.
 */
export function jsonSchemaToGbnf(schema: object | string, options: GbnfOptions = {}): string {
  if (typeof schema !== 'string' && (typeof schema !== 'object' || schema === null)) {
    throw new TypeError(`Expected an object or JSON text for schema but received ${String(schema)}`);
  }
  const opts: Resolved = {
    compact: options.compact ?? true,
    decimals: intOption('decimals', options.decimals, 4, 0, 12),
    integerDigits: intOption('integerDigits', options.integerDigits, 6, 1, 15),
    maxStringLength: intOption('maxStringLength', options.maxStringLength, 32, 0, 4096),
    maxItems: intOption('maxItems', options.maxItems, 8, 0, 4096),
  };
  let parsed: unknown;
  try {
    parsed = typeof schema === 'string' ? JSON.parse(schema) : structuredClone(schema);
  } catch (err) {
    throw new TypeError(`jsonSchemaToGbnf: schema is not valid JSON: ${(err as Error).message}`, { cause: err });
  }
  const rules: string[] = [];
  const objects: OrderedObject[] = [];
  const prepared = prepare(parsed, '#', opts, rules, objects);
  let gbnf = inSchemaOrder(loadAddon().jsonSchemaToGrammar(JSON.stringify(prepared)), objects);
  rules.forEach((rule, i) => {
    const literal = `"\\"${placeholder(i)}\\""`;
    gbnf = gbnf.split(literal).join(`percept-${i}`) + `percept-${i} ::= ${rule}\n`;
  });
  if (gbnf.includes('@@percept-')) throw new Error('jsonSchemaToGbnf: a bounded rule was not spliced into the grammar');
  gbnf = gbnf.replace(/^space ::= .*$/m, opts.compact ? 'space ::= ""' : '$&');
  return gbnf;
}

const placeholder = (i: number): string => `@@percept-${i}@@`;

// ---------------------------------------------------------------------------------------------
// The schema walk: checks satisfiability, bounds what is unbounded, swaps numbers and free strings
// for placeholders whose rules are written below.

const SCHEMA_MAPS = ['properties', '$defs', 'definitions', 'patternProperties', 'dependentSchemas'] as const;
const SCHEMA_LISTS = ['allOf', 'prefixItems'] as const;

function prepare(node: unknown, path: string, opts: Resolved, rules: string[], objects: OrderedObject[]): unknown {
  if (node === false) throw new SchemaGrammarError(path, 'the schema `false` admits no value');
  if (typeof node !== 'object' || node === null || Array.isArray(node)) return node;
  const n = { ...(node as Node) };

  if (Array.isArray(n.type)) {
    if (n.type.length === 0) throw new SchemaGrammarError(`${path}/type`, 'an empty type list admits no value');
    if (n.type.length > 1) {
      const { type, ...rest } = n;
      return prepare({ anyOf: (type as unknown[]).map((t) => ({ ...rest, type: t })) }, path, opts, rules, objects);
    }
    n.type = n.type[0];
  }

  for (const key of SCHEMA_MAPS) {
    const m = n[key];
    if (typeof m === 'object' && m !== null && !Array.isArray(m)) {
      n[key] = Object.fromEntries(
        Object.entries(m).map(([k, v]) => [k, prepare(v, `${path}/${key}/${escapePointer(k)}`, opts, rules, objects)]),
      );
    }
  }
  for (const key of SCHEMA_LISTS) {
    const l = n[key];
    if (Array.isArray(l)) n[key] = l.map((v, i) => prepare(v, `${path}/${key}/${i}`, opts, rules, objects));
  }
  for (const key of ['anyOf', 'oneOf'] as const) {
    const l = n[key];
    if (!Array.isArray(l)) continue;
    const kept: unknown[] = [];
    let firstError: SchemaGrammarError | undefined;
    l.forEach((v, i) => {
      try {
        kept.push(prepare(v, `${path}/${key}/${i}`, opts, rules, objects));
      } catch (err) {
        if (!(err instanceof SchemaGrammarError)) throw err;
        firstError ??= err;
      }
    });
    if (kept.length === 0) throw firstError ?? new SchemaGrammarError(`${path}/${key}`, 'an empty list of alternatives admits no value');
    n[key] = kept;
  }
  if (Array.isArray(n.items)) n.items = n.items.map((v, i) => prepare(v, `${path}/items/${i}`, opts, rules, objects));
  else if (n.items !== undefined) n.items = prepare(n.items, `${path}/items`, opts, rules, objects);
  if (typeof n.additionalProperties === 'object' && n.additionalProperties !== null) {
    n.additionalProperties = prepare(n.additionalProperties, `${path}/additionalProperties`, opts, rules, objects);
  }

  if (n.enum !== undefined || n.const !== undefined) return prepareValues(n, path);

  switch (n.type) {
    case 'number':
    case 'integer':
      rules.push(numberRule(n, path, opts));
      return { const: placeholder(rules.length - 1) };
    case 'string':
      if (n.pattern !== undefined || n.format !== undefined) return n;
      rules.push(stringRule(n, path, opts));
      return { const: placeholder(rules.length - 1) };
    case 'array':
      return prepareArray(n, path, opts);
    case 'object':
      checkObject(n, path);
      noteOrder(n, path, objects);
      return n;
    default:
      return n;
  }
}

function escapePointer(key: string): string {
  return key.replace(/~/g, '~0').replace(/\//g, '~1');
}

function prepareArray(n: Node, path: string, opts: Resolved): Node {
  const minItems = typeof n.minItems === 'number' ? n.minItems : 0;
  const maxItems = typeof n.maxItems === 'number' ? n.maxItems : Math.max(opts.maxItems, minItems);
  if (minItems > maxItems) throw new SchemaGrammarError(path, `minItems ${minItems} > maxItems ${maxItems}: no array satisfies both`);
  if (n.items === false && minItems > 0) throw new SchemaGrammarError(`${path}/items`, `items is false but minItems is ${minItems}`);
  return { ...n, maxItems };
}

function checkObject(n: Node, path: string): void {
  const props = (typeof n.properties === 'object' && n.properties !== null ? n.properties : {}) as Node;
  if (n.additionalProperties === false && Array.isArray(n.required)) {
    for (const r of n.required) {
      if (typeof r === 'string' && !(r in props)) {
        throw new SchemaGrammarError(
          `${path}/required`,
          `property "${r}" is required but not in properties, and additionalProperties is false`,
        );
      }
    }
  }
  const minP = typeof n.minProperties === 'number' ? n.minProperties : 0;
  const maxP = typeof n.maxProperties === 'number' ? n.maxProperties : Infinity;
  if (minP > maxP) throw new SchemaGrammarError(path, `minProperties ${minP} > maxProperties ${maxP}`);
}

// ---------------------------------------------------------------------------------------------
// Objects in schema order

/** An object without extra properties: its keys in schema order; reordered where that is not llama.cpp's. */
interface OrderedObject {
  readonly path: string;
  readonly keys: readonly string[];
  readonly required: ReadonlySet<string>;
  readonly reordered: boolean;
}

function noteOrder(n: Node, path: string, objects: OrderedObject[]): void {
  const keys = Object.keys((n.properties ?? {}) as Node);
  const required = new Set(
    Array.isArray(n.required) ? n.required.filter((r): r is string => typeof r === 'string' && keys.includes(r)) : [],
  );
  // Extra properties ride in llama.cpp's optional group, so such an object keeps its order (required first).
  // With properties listed, llama.cpp admits extras only where additionalProperties says so.
  if ((n.additionalProperties !== undefined && n.additionalProperties !== false) || n.patternProperties !== undefined) return;
  const llamaOrder = [...keys.filter((k) => required.has(k)), ...keys.filter((k) => !required.has(k))];
  // Objects already in llama.cpp's order are noted too: another order of the same keys would share their rule shape.
  objects.push({ path, keys, required, reordered: llamaOrder.some((k, i) => k !== keys[i]) });
}

const RULE_LINE = /^([A-Za-z0-9-]+) ::= (.*)$/;
const KV_KEY = /^"\\"((?:[^"\\]|\\.)*)\\"" space ":" space /;
const RULE_REF = /[A-Za-z][A-Za-z0-9-]*/g;

/**
 * Rewrites each noted object's rule to write its properties in schema order: optional ones before the
 * first required one as `(kv ",")?`, required ones as `kv`, later optional ones as `("," kv)?`.
 * An object's rule names only its `-kv` and `-rest` rules; it is found by their keys and which are required.
 */
function inSchemaOrder(gbnf: string, objects: readonly OrderedObject[]): string {
  if (!objects.some((o) => o.reordered)) return gbnf;
  const lines = gbnf.split('\n');
  const keyOf = new Map<string, string>();
  for (const line of lines) {
    const m = RULE_LINE.exec(line);
    const key = m && m[1]!.endsWith('-kv') ? KV_KEY.exec(m[2]!) : null;
    if (key) keyOf.set(m![1]!, JSON.parse(`"${key[1]!}"`) as string);
  }
  const same = (a: ReadonlySet<string>, b: readonly string[]): boolean => a.size === b.length && b.every((k) => a.has(k));
  const done = new Set<string>();
  const out = lines.map((line) => {
    const m = RULE_LINE.exec(line);
    if (!m || !m[2]!.startsWith('"{" space ')) return line;
    const body = m[2]!.replace(/"(?:[^"\\]|\\.)*"/g, ' ');
    const refs = body.match(RULE_REF) ?? [];
    // An open object's rule also names its extras' rule (`-additional-kv`): it keeps llama.cpp's order.
    if (!refs.every((r) => r === 'space' || keyOf.has(r) || r.endsWith('-rest'))) return line;
    const kvs = new Map(refs.filter((r) => keyOf.has(r)).map((r) => [keyOf.get(r)!, r]));
    // llama.cpp writes the required ones before the first group.
    const required = (body.split(' ( ')[0]!.match(RULE_REF) ?? []).filter((r) => keyOf.has(r)).map((r) => keyOf.get(r)!);
    const matches = objects.filter((o) => same(new Set(o.keys), [...kvs.keys()]) && same(o.required, required));
    if (!matches.some((o) => o.reordered)) return line;
    const object = matches[0]!;
    const other = matches.find((o) => o.keys.some((k, i) => k !== object.keys[i]));
    if (other) {
      throw new SchemaGrammarError(
        other.path,
        `has the properties of ${object.path} in another order; their grammar rules cannot be told apart`,
      );
    }
    for (const o of matches) done.add(o.path);
    const first = object.keys.findIndex((k) => object.required.has(k));
    const parts = object.keys.map((k, i) => {
      const kv = kvs.get(k)!;
      if (i < first) return `( ${kv} "," space )?`;
      if (i === first) return kv;
      return object.required.has(k) ? `"," space ${kv}` : `( "," space ${kv} )?`;
    });
    return `${m[1]} ::= "{" space ${parts.join(' ')} space "}"${m[2]!.endsWith('"}" space') ? ' space' : ''}`;
  });
  const missed = objects.find((o) => o.reordered && !done.has(o.path));
  if (missed) throw new Error(`jsonSchemaToGbnf: the rule of the object at ${missed.path} was not found to put in schema order`);
  return out.join('\n');
}

/** enum / const: keeps only the values the node's other keywords accept. */
function prepareValues(n: Node, path: string): Node {
  if (n.const !== undefined) {
    const why = valueProblem(n.const, n);
    if (why) throw new SchemaGrammarError(`${path}/const`, `the const value ${JSON.stringify(n.const)} ${why}`);
    return n;
  }
  if (!Array.isArray(n.enum) || n.enum.length === 0) throw new SchemaGrammarError(`${path}/enum`, 'an empty enum admits no value');
  const kept = n.enum.filter((v) => valueProblem(v, n) === undefined);
  if (kept.length === 0) {
    throw new SchemaGrammarError(`${path}/enum`, `no enum value satisfies the other keywords (${valueProblem(n.enum[0], n)})`);
  }
  return { ...n, enum: kept };
}

/** Why `v` fails the node's simple keywords (type, bounds, lengths, pattern), or undefined. */
function valueProblem(v: unknown, n: Node): string | undefined {
  const type = typeof n.type === 'string' ? n.type : undefined;
  const jsonType =
    v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v === 'number' ? (Number.isInteger(v) ? 'integer' : 'number') : typeof v;
  if (type && !(type === jsonType || (type === 'number' && jsonType === 'integer'))) return `is not of type ${type}`;
  if (typeof v === 'number') {
    if (typeof n.minimum === 'number' && v < n.minimum) return `is below minimum ${n.minimum}`;
    if (typeof n.maximum === 'number' && v > n.maximum) return `is above maximum ${n.maximum}`;
    if (typeof n.exclusiveMinimum === 'number' && v <= n.exclusiveMinimum) return `is not above exclusiveMinimum ${n.exclusiveMinimum}`;
    if (typeof n.exclusiveMaximum === 'number' && v >= n.exclusiveMaximum) return `is not below exclusiveMaximum ${n.exclusiveMaximum}`;
  }
  if (typeof v === 'string') {
    const len = [...v].length;
    if (typeof n.minLength === 'number' && len < n.minLength) return `is shorter than minLength ${n.minLength}`;
    if (typeof n.maxLength === 'number' && len > n.maxLength) return `is longer than maxLength ${n.maxLength}`;
    if (typeof n.pattern === 'string' && !new RegExp(n.pattern, 'u').test(v)) return `does not match pattern ${n.pattern}`;
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------
// Strings

/** A free string: printable ASCII except `"` and `\` (no escapes), between minLength and maxLength characters. */
function stringRule(n: Node, path: string, opts: Resolved): string {
  const minLength = typeof n.minLength === 'number' ? n.minLength : 0;
  const maxLength = typeof n.maxLength === 'number' ? n.maxLength : Math.max(opts.maxStringLength, minLength);
  if (minLength > maxLength)
    throw new SchemaGrammarError(path, `minLength ${minLength} > maxLength ${maxLength}: no string satisfies both`);
  return `"\\"" [\\x20\\x21\\x23-\\x5B\\x5D-\\x7E]{${minLength},${maxLength}} "\\""`;
}

// ---------------------------------------------------------------------------------------------
// Numbers: exact decimal arithmetic on bigints scaled by 10^d (d = fraction digits).

interface Decimal {
  readonly digits: bigint; // value = digits / 10^scale
  readonly scale: number;
}

function toDecimal(x: number): Decimal {
  const [mant = '0', exp = '0'] = String(x).toLowerCase().split('e');
  const negative = mant.startsWith('-');
  const [ip = '0', fp = ''] = mant.replace('-', '').split('.');
  let digits = BigInt(ip + fp);
  let scale = fp.length - Number(exp);
  if (scale < 0) {
    digits *= 10n ** BigInt(-scale);
    scale = 0;
  }
  return { digits: negative ? -digits : digits, scale };
}

const pow10 = (k: number): bigint => 10n ** BigInt(k);
const floorDiv = (a: bigint, b: bigint): bigint => (a % b === 0n || a >= 0n ? a / b : a / b - 1n);
const ceilDiv = (a: bigint, b: bigint): bigint => -floorDiv(-a, b);

/** x × 10^d, rounded down or up to an integer. */
function scaled(x: number, d: number, round: 'floor' | 'ceil'): bigint {
  const { digits, scale } = toDecimal(x);
  if (scale <= d) return digits * pow10(d - scale);
  return (round === 'floor' ? floorDiv : ceilDiv)(digits, pow10(scale - d));
}

/** Renders n / 10^d as the shortest JSON number. */
function renderScaled(n: bigint, d: number): string {
  const neg = n < 0n;
  const s = (neg ? -n : n).toString().padStart(d + 1, '0');
  const ip = s.slice(0, s.length - d);
  const fp = s.slice(s.length - d).replace(/0+$/, '');
  return `${neg ? '-' : ''}${ip}${fp ? `.${fp}` : ''}`;
}

/**
 * [lo, hi] in units of 10^-d from minimum / maximum and the exclusive bounds (numbers, or draft-4
 * booleans). A missing side gets the default bound, 10^integerDigits away.
 */
function scaledBounds(n: Node, d: number, opts: Resolved): [bigint, bigint] {
  const big = (a: bigint | undefined, b: bigint): bigint => (a === undefined || b > a ? b : a);
  const small = (a: bigint | undefined, b: bigint): bigint => (a === undefined || b < a ? b : a);
  let lo: bigint | undefined;
  let hi: bigint | undefined;
  if (typeof n.minimum === 'number') lo = n.exclusiveMinimum === true ? scaled(n.minimum, d, 'floor') + 1n : scaled(n.minimum, d, 'ceil');
  if (typeof n.exclusiveMinimum === 'number') lo = big(lo, scaled(n.exclusiveMinimum, d, 'floor') + 1n);
  if (typeof n.maximum === 'number') hi = n.exclusiveMaximum === true ? scaled(n.maximum, d, 'ceil') - 1n : scaled(n.maximum, d, 'floor');
  if (typeof n.exclusiveMaximum === 'number') hi = small(hi, scaled(n.exclusiveMaximum, d, 'ceil') - 1n);
  const span = pow10(opts.integerDigits + d) - 1n;
  const from = lo ?? (hi !== undefined && hi - span < -span ? hi - span : -span);
  const to = hi ?? (from + span > span ? from + span : span);
  return [from, to];
}

/** A number or integer rule: bounded value, no exponent, fraction digits from multipleOf or options.decimals. */
function numberRule(n: Node, path: string, opts: Resolved): string {
  const integer = n.type === 'integer';
  const what = describeBounds(n);
  if (n.multipleOf !== undefined) {
    if (typeof n.multipleOf !== 'number' || !(n.multipleOf > 0)) throw new SchemaGrammarError(`${path}/multipleOf`, 'must be a number > 0');
    const m = toDecimal(n.multipleOf);
    const powerOfTen = /^10*$/.test(m.digits.toString());
    if (!powerOfTen || (integer && m.scale > 0) || m.scale === 0) return multiplesRule(n, path, opts, m, integer);
  }
  const d = integer ? 0 : n.multipleOf !== undefined ? toDecimal(n.multipleOf as number).scale : opts.decimals;
  const [lo, hi] = scaledBounds(n, d, opts);
  if (lo > hi) throw new SchemaGrammarError(path, `no ${integer ? 'integer' : `number with at most ${d} decimals`} satisfies ${what}`);
  const alts: string[] = [];
  if (hi >= 0n) alts.push(...nonNegative(lo > 0n ? lo : 0n, hi, d));
  // Negative values: magnitudes from max(-hi, one unit) (no "-0") to -lo.
  if (lo < 0n) {
    const from = -hi > 1n ? -hi : 1n;
    if (from <= -lo) alts.push(`"-" ${group(nonNegative(from, -lo, d))}`);
  }
  return alts.join(' | ');
}

function describeBounds(n: Node): string {
  const parts = ['minimum', 'exclusiveMinimum', 'maximum', 'exclusiveMaximum', 'multipleOf']
    .filter((k) => n[k] !== undefined)
    .map((k) => `${k} ${String(n[k])}`);
  return parts.length ? parts.join(', ') : 'the default bounds';
}

const MAX_ENUMERATED = 256;

/** multipleOf that is not a power of ten (0.25, 5…): the multiples in range, listed. */
function multiplesRule(n: Node, path: string, opts: Resolved, m: Decimal, integer: boolean): string {
  const d = m.scale;
  const unit = m.digits; // multipleOf = unit / 10^d
  const [lo, hi] = scaledBounds(n, d, opts);
  const first = ceilDiv(lo, unit);
  const last = floorDiv(hi, unit);
  if (first > last) throw new SchemaGrammarError(path, `no multiple of ${String(n.multipleOf)} satisfies ${describeBounds(n)}`);
  if (last - first + 1n > BigInt(MAX_ENUMERATED)) {
    throw new SchemaGrammarError(
      `${path}/multipleOf`,
      `multipleOf ${String(n.multipleOf)} leaves ${last - first + 1n} values in range; the decoding grammar lists at most ${MAX_ENUMERATED} (use a power of ten, or narrow minimum/maximum)`,
    );
  }
  const values: string[] = [];
  for (let k = first; k <= last; k++) {
    const text = renderScaled(k * unit, d);
    if (!integer || !text.includes('.')) values.push(`"${text}"`);
  }
  if (values.length === 0)
    throw new SchemaGrammarError(path, `no integer multiple of ${String(n.multipleOf)} satisfies ${describeBounds(n)}`);
  return values.join(' | ');
}

const group = (alts: readonly string[]): string => (alts.length === 1 && !alts[0]!.includes('|') ? alts[0]! : `(${alts.join(' | ')})`);
const charRange = (a: string, b: string): string => (a === b ? `"${a}"` : `[${a}-${b}]`);
const allDigit = (s: string, c: string): boolean => [...s].every((x) => x === c);
const anyDigits = (k: number): string => (k === 0 ? '' : k === 1 ? '[0-9]' : `[0-9]{${k}}`);

/** Digit strings of one length between a and b (same length, a ≤ b), as GBNF alternatives. */
function sameLength(a: string, b: string): string[] {
  if (a === b) return [`"${a}"`];
  const rest = a.length - 1;
  if (rest === 0) return [charRange(a, b)];
  const [a0, b0] = [a[0]!, b[0]!];
  const [ra, rb] = [a.slice(1), b.slice(1)];
  if (a0 === b0) return [`"${a0}" ${group(sameLength(ra, rb))}`];
  const alts: string[] = [];
  let m0 = a0.charCodeAt(0);
  let m1 = b0.charCodeAt(0);
  if (!allDigit(ra, '0')) {
    alts.push(`"${a0}" ${group(sameLength(ra, '9'.repeat(rest)))}`);
    m0++;
  }
  if (!allDigit(rb, '9')) m1--;
  if (m0 <= m1) alts.push(`${charRange(String.fromCharCode(m0), String.fromCharCode(m1))} ${anyDigits(rest)}`);
  if (!allDigit(rb, '9')) alts.push(`"${b0}" ${group(sameLength('0'.repeat(rest), rb))}`);
  return alts;
}

/** Canonical integers (no leading zero) in [lo, hi], 0 ≤ lo ≤ hi. */
function integerRange(lo: bigint, hi: bigint): string[] {
  const alts: string[] = [];
  for (let len = lo.toString().length; len <= hi.toString().length; len++) {
    const from = len === 1 ? 0n : pow10(len - 1);
    const a = lo > from ? lo : from;
    const b = hi < pow10(len) - 1n ? hi : pow10(len) - 1n;
    if (a <= b) alts.push(...sameLength(a.toString(), b.toString()));
  }
  return alts;
}

/**
 * Fraction digit strings F of 1..n digits whose value, padded with zeros to n digits, lies in
 * [a, b] (n-digit strings). Null when there is none.
 */
function fraction(a: string, b: string): string | null {
  const n = a.length;
  if (n === 1) return charRange(a, b);
  const [a0, b0] = [a[0]!, b[0]!];
  const [ra, rb] = [a.slice(1), b.slice(1)];
  // One digit c followed by an optional (or required) tail constrained to [lo, hi].
  const withTail = (c: string, lo: string, hi: string): string | null => {
    const tail = fraction(lo, hi);
    const alone = allDigit(lo, '0'); // c alone pads to c00…, inside [c lo, c hi] iff lo is all zeros
    if (tail === null) return alone ? `"${c}"` : null;
    return alone ? `"${c}" (${tail})?` : `"${c}" (${tail})`;
  };
  if (a0 === b0) return withTail(a0, ra, rb);
  const alts: (string | null)[] = [];
  let m0 = a0.charCodeAt(0);
  let m1 = b0.charCodeAt(0);
  if (!allDigit(ra, '0')) {
    alts.push(withTail(a0, ra, '9'.repeat(n - 1)));
    m0++;
  }
  const highTail = !allDigit(rb, '9');
  if (highTail) m1--;
  if (m0 <= m1) alts.push(`${charRange(String.fromCharCode(m0), String.fromCharCode(m1))} [0-9]{0,${n - 1}}`);
  if (highTail) alts.push(withTail(b0, '0'.repeat(n - 1), rb));
  const kept = alts.filter((x): x is string => x !== null);
  return kept.length ? kept.join(' | ') : null;
}

/** Non-negative decimals in [lo, hi] (units of 10^-d): integer part, then 0..d fraction digits. */
function nonNegative(lo: bigint, hi: bigint, d: number): string[] {
  if (d === 0) return integerRange(lo, hi);
  const unit = pow10(d);
  const [iLo, fLo] = [lo / unit, (lo % unit).toString().padStart(d, '0')];
  const [iHi, fHi] = [hi / unit, (hi % unit).toString().padStart(d, '0')];
  const anyFraction = `("." [0-9]{1,${d}})?`;
  // An integer part followed by a fraction in [a, b]; without a fraction iff a is all zeros.
  const part = (i: bigint, a: string, b: string): string | null => {
    const f = fraction(a, b);
    const optional = allDigit(a, '0');
    if (f === null) return optional ? `"${i}"` : null;
    return optional ? `"${i}" ("." (${f}))?` : `"${i}" "." (${f})`;
  };
  if (iLo === iHi) {
    const only = part(iLo, fLo, fHi);
    return only === null ? [] : [only];
  }
  const alts: string[] = [];
  const lowFree = allDigit(fLo, '0');
  const highFree = allDigit(fHi, '9');
  if (!lowFree) {
    const p = part(iLo, fLo, '9'.repeat(d));
    if (p !== null) alts.push(p);
  }
  const midLo = lowFree ? iLo : iLo + 1n;
  const midHi = highFree ? iHi : iHi - 1n;
  if (midLo <= midHi) alts.push(`${group(integerRange(midLo, midHi))} ${anyFraction}`);
  if (!highFree) {
    const p = part(iHi, '0'.repeat(d), fHi);
    if (p !== null) alts.push(p);
  }
  return alts;
}
