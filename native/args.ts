// Argument validators of the binding's typed API (llama.ts, vision.ts), in the shape of sharp's lib/is.js.
// Each checks one argument and returns it typed, or throws.
// Every bad argument gets one message shape: "Expected <what> for <name> but received <value>".
// native/src/util.cc writes the same shape for the fields C++ checks again.

/** A value as the messages show it: `5 of type number`, `null`, `array`. */
export function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'bigint') return `${v}n`;
  if (typeof v === 'symbol') return 'a symbol';
  if (typeof v === 'function') return 'a function';
  return `${String(v)} of type ${typeof v}`;
}

/** The error of a bad argument `name`: a TypeError with the one message shape. */
export function invalid(name: string, expected: string, actual: unknown): TypeError {
  return new TypeError(`Expected ${expected} for ${name} but received ${describe(actual)}`);
}

export function intIn(name: string, v: unknown, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw invalid(name, `an integer between ${min} and ${max}`, v);
  return v;
}

export function numIn(name: string, v: unknown, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) throw invalid(name, `a number between ${min} and ${max}`, v);
  return v;
}

export function bool(name: string, v: unknown): boolean {
  if (typeof v !== 'boolean') throw invalid(name, 'a boolean', v);
  return v;
}

export function nonEmptyString(name: string, v: unknown): string {
  if (typeof v !== 'string' || v.length === 0) throw invalid(name, 'a non-empty string', v);
  return v;
}

/** One of `choices` (strings or booleans), named in the message as `'a', 'b' or true`. */
export function oneOf<const T extends string | boolean>(name: string, v: unknown, choices: readonly T[]): T {
  if (!choices.includes(v as T))
    throw invalid(
      name,
      listOf(
        choices.map((c) => (typeof c === 'string' ? `'${c}'` : String(c))),
        'or',
      ),
      v,
    );
  return v as T;
}

export function plainObject(name: string, v: unknown): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw invalid(name, 'an object', v);
  return v as Record<string, unknown>;
}

/** Refuses keys of `o` outside `keys` (a misspelt option would otherwise be ignored silently). */
export function knownKeys(name: string, o: Record<string, unknown>, keys: readonly string[]): void {
  for (const k of Object.keys(o))
    if (!keys.includes(k)) throw invalid(`${name}.${k}`, `undefined (${name} takes only ${listOf(keys, 'and')})`, o[k]);
}

/** An Error with a `code` (EBUSY, EDISPOSED, ENOENT…), like Node's system errors. */
export function coded(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/**
 * A native error re-thrown with the stack of the JS call that started the work (`stack`, taken
 * before the await), keeping its `code` (sharp's nativeError).
 */
export function graft(err: unknown, stack: Error): Error {
  if (!(err instanceof Error)) return new Error(String(err));
  const out = Object.assign(new Error(err.message), err as Error & { code?: string });
  out.stack = `${err.constructor.name}: ${err.message}\n${stack.stack?.split('\n').slice(1).join('\n') ?? ''}`;
  return out;
}

/** `a, b or c` (`and`). */
function listOf(items: readonly string[], conjunction: 'or' | 'and'): string {
  return items.length <= 1 ? (items[0] ?? '') : `${items.slice(0, -1).join(', ')} ${conjunction} ${items[items.length - 1]!}`;
}
