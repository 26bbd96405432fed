// actions: the decoder's text → one validated action. Parses the text as JSON and checks it against
// the action schema (configs/actions/*.schema.json through nodes/action-schema.ts). Anything that
// does not pass is dropped with DropFrame and a message that says why and shows the text.
// Concurrency: pure and synchronous per frame; safe under any edge policy.
import { formatAjvErrors, type ActionSchema } from './action-schema.ts';
import type { ActionMessage, Generation, StopReason } from './payloads.ts';
import { DropFrame } from '../pipeline/types.ts';
import type { DropReason, Stage, StageContext } from '../pipeline/types.ts';

/** Characters of the decoder's text a drop message quotes: enough to see what went wrong. */
const SNIPPET_CHARS = 160;

export interface ActionsStageOptions {
  /** The action schema, loaded once with loadActionSchema (the decoder's grammar comes from the same one). */
  readonly schema: ActionSchema;
  /** Characters of the decoder text quoted in drop messages (default SNIPPET_CHARS). */
  readonly snippetChars?: number;
}

export interface ActionsStage extends Stage<Generation, ActionMessage> {
  readonly schema: ActionSchema;
}

// A generation that stopped for one of these reasons may be cut short.
// When its text is not a valid action, the drop reason says it was cut, not that the model produced garbage.
const CUT_SHORT: Partial<Record<StopReason, DropReason>> = { deadline: 'stale', cancelled: 'shutdown' };

export function createActionsStage(options: ActionsStageOptions): ActionsStage {
  if (options === null || typeof options !== 'object') {
    throw new TypeError('createActionsStage: expected an options object { schema }');
  }
  const { schema } = options;
  if (!schema || typeof schema.validate !== 'function' || typeof schema.wireSchemaId !== 'string') {
    throw new TypeError('createActionsStage: options.schema must be the result of loadActionSchema()');
  }
  const snippetChars = options.snippetChars ?? SNIPPET_CHARS;
  if (!Number.isInteger(snippetChars) || snippetChars < 8) {
    throw new RangeError(`createActionsStage: expected integer >= 8 for snippetChars but received ${snippetChars}`);
  }

  return {
    name: 'actions',
    schema,
    async process(generation: Generation, ctx: StageContext): Promise<ActionMessage> {
      const action = parseAction(generation, schema, snippetChars);
      return {
        schemaId: schema.wireSchemaId,
        frameId: ctx.frame.frameId,
        sourceId: ctx.frame.sourceId,
        captureWallMs: ctx.frame.captureWallMs,
        action,
      };
    },
  };
}

/** Parses and validates one generation's text; throws DropFrame when it is not a valid action.
 * Exported for tools (eval) that check texts outside a running graph. */
export function parseAction(generation: Generation, schema: ActionSchema, snippetChars = SNIPPET_CHARS): unknown {
  if (generation === null || typeof generation !== 'object' || typeof generation.text !== 'string') {
    throw new TypeError('actions: expected a Generation with a string `text`');
  }
  const cutReason = CUT_SHORT[generation.stopReason];
  const text = stripFence(generation.text);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    const why = `${(err as Error).message} in ${quote(generation.text, snippetChars)}`;
    if (cutReason) {
      throw new DropFrame(cutReason, `actions: generation stopped by ${generation.stopReason} before the JSON was complete: ${why}`);
    }
    const cut = generation.stopReason === 'max_tokens' ? ' (stopped at max_tokens: raise maxNewTokens?)' : '';
    throw new DropFrame('invalid', `actions: decoder output is not JSON${cut}: ${why}`);
  }
  if (!schema.validate(value)) {
    throw new DropFrame(
      'invalid',
      `actions: output fails ${schema.id}: ${formatAjvErrors(schema.validate.errors)} in ${quote(generation.text, snippetChars)}`,
    );
  }
  return value;
}

// Unconstrained models like to wrap JSON in a Markdown code fence; a grammar-constrained decode never
// does. Accept exactly one fence around the whole text, nothing looser.
const FENCE = /^\s*```(?:json)?[ \t]*\r?\n([\s\S]*?)\r?\n?```\s*$/;
function stripFence(text: string): string {
  const m = FENCE.exec(text);
  return m ? m[1] : text;
}

function quote(text: string, max: number): string {
  const shown = text.length > max ? `${text.slice(0, max)}…(${text.length} chars)` : text;
  return JSON.stringify(shown);
}
