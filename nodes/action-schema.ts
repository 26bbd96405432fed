// One file, configs/actions/<name>.schema.json, is the single source of truth for actions. Everything
// percept needs from it is derived here, from the file's bytes: the ajv validator, the wire
// header's schema_id and the MCAP channel schema. (The native binding compiles the same text into
// a decoding grammar.) Change the file and everything follows; nothing here repeats its content.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Ajv } from 'ajv';
import type { ErrorObject, ValidateFunction } from 'ajv';

/** The MCAP Schema record for channels that carry actions (McapWriter.registerSchema input). */
export interface McapActionSchema {
  readonly name: string;
  readonly encoding: 'jsonschema';
  readonly data: Uint8Array;
}

export interface ActionSchema {
  /** The file it was loaded from. */
  readonly path: string;
  /** The schema's `$id`, e.g. "percept/robot-action/v1". */
  readonly id: string;
  /** The parsed schema (frozen). */
  readonly schema: Readonly<Record<string, unknown>>;
  /** The exact text of the file: what the grammar compiler and the MCAP schema record receive. */
  readonly text: string;
  /** sha256 of the file bytes, hex: tells two builds apart that share an `$id` but not a schema. */
  readonly sha256: string;
  /** ajv (strict) compiled validator. After a failed call, `validate.errors` holds the reasons. */
  readonly validate: ValidateFunction;
  /** What the wire header's `schema_id` carries (the `$id`). */
  readonly wireSchemaId: string;
  readonly mcapSchema: McapActionSchema;
}

/** Reads, parses and compiles an action schema. Throws an error naming the file for a missing
 * file, bad JSON, a missing `$id`, or a schema ajv rejects in strict mode. */
export function loadActionSchema(path: string): ActionSchema {
  if (typeof path !== 'string' || path.length === 0) {
    throw new TypeError(`loadActionSchema: expected a non-empty path string but received ${describe(path)}`);
  }
  let bytes: Buffer;
  try {
    bytes = readFileSync(path);
  } catch (err) {
    throw new Error(`loadActionSchema: cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
  const text = bytes.toString('utf8');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new Error(`loadActionSchema: ${path} is not valid JSON: ${(err as Error).message}`, { cause: err });
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new Error(`loadActionSchema: ${path} must contain a JSON object (a JSON Schema), found ${describe(parsed)}`);
  }
  const schema = deepFreeze(parsed as Record<string, unknown>);
  const id = schema.$id;
  if (typeof id !== 'string' || id.length === 0) {
    throw new Error(`loadActionSchema: ${path} has no "$id": the $id is the wire schema_id and must be a non-empty string`);
  }
  // A fresh Ajv per schema: no module-level state, and a schema file can be reloaded after an edit.
  const ajv = new Ajv({ strict: true, allErrors: true });
  let validate: ValidateFunction;
  try {
    validate = ajv.compile(schema);
  } catch (err) {
    throw new Error(`loadActionSchema: ${path} is not a valid strict JSON Schema: ${(err as Error).message}`, { cause: err });
  }
  return Object.freeze({
    path,
    id,
    schema,
    text,
    sha256: createHash('sha256').update(bytes).digest('hex'),
    validate,
    wireSchemaId: id,
    mcapSchema: Object.freeze({ name: id, encoding: 'jsonschema' as const, data: new Uint8Array(bytes) }),
  });
}

/** One line per ajv error: `<JSON pointer or "(root)"> <message> <params>`, e.g.
 * `/speed must be <= 2 {"comparison":"<=","limit":2}`. */
export function formatAjvErrors(errors: readonly ErrorObject[] | null | undefined): string {
  if (!errors || errors.length === 0) return 'no error details';
  return errors
    .map((e) => `${e.instancePath === '' ? '(root)' : e.instancePath} ${e.message ?? e.keyword} ${JSON.stringify(e.params)}`)
    .join('; ');
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value as object)) deepFreeze(child);
  }
  return value;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `${JSON.stringify(value)?.slice(0, 40) ?? String(value)} of type ${typeof value}`;
}

/** How many new tokens an action may take: the run's budget, and a frame's under the ladder's knob.
 * The one owner of that rule; the local decoder, the remote one and `percept tune` all use it. */
export interface DecodeBudget {
  /** New tokens per action at most for the run. Infinity: no bound (a remote server's own grammar). */
  readonly maxNewTokens: number;
  /** The grammar's worst case for a complete action; null when unbounded or not known here. */
  readonly worstCaseTokens: number | null;
  /** A frame's new tokens under the ladder's maxNewTokens knob, never below a complete action. */
  atKnob(knob: number): number;
}

/**
 * The decode budget from `decoder.maxNewTokens` (null: the grammar's worst case) and the grammar's
 * worst case. Refuses a configured value below that worst case, or none where the grammar is unbounded.
 * `grammar` null: the grammar runs elsewhere (a remote server), so only the configured value bounds.
 */
export function decodeBudget(
  configured: number | null,
  grammar: { readonly worstCaseTokens: number | null; readonly fallback: string | null } | null,
  schemaPath: string,
): DecodeBudget {
  if (configured !== null && (!Number.isInteger(configured) || configured < 1))
    throw new RangeError(`decoder.maxNewTokens must be an integer ≥ 1 or null, got ${configured}`);
  const worstCaseTokens = grammar?.worstCaseTokens ?? null;
  let maxNewTokens: number;
  if (grammar === null) {
    maxNewTokens = configured ?? Infinity;
  } else if (worstCaseTokens === null) {
    if (configured === null) {
      const why = grammar.fallback ?? 'it admits outputs of unbounded length';
      throw new RangeError(`decoder.maxNewTokens must be set: the action schema ${schemaPath} has no worst-case length (${why})`);
    }
    maxNewTokens = configured;
  } else if (configured !== null && configured < worstCaseTokens) {
    throw new RangeError(
      `decoder.maxNewTokens ${configured} is below the ${worstCaseTokens} tokens a complete action under ${schemaPath} can take; ` +
        `raise it to at least ${worstCaseTokens} or leave it unset`,
    );
  } else {
    maxNewTokens = configured ?? worstCaseTokens;
  }
  return { maxNewTokens, worstCaseTokens, atKnob: (knob) => Math.max(worstCaseTokens ?? 1, Math.min(maxNewTokens, knob)) };
}
