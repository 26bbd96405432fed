// `percept generate`: one prompt through a model, optionally schema-constrained and speculative.
import { LlamaModel, type GenerateResult, type StopReason, type Timings } from '../native/llama.ts';
import { jsonSchemaToGbnf } from '../native/schema-grammar.ts';
import { loadActionSchema } from '../nodes/action-schema.ts';
import { SAMPLING, attachSpeculation, type SpeculationFlags } from '../nodes/decoder.ts';
import { resolveModel } from '../models/resolve.ts';

/** The CLI's speculation flags with `synth:` specifiers resolved to files. */
export async function resolveSpeculation(flags: SpeculationFlags): Promise<SpeculationFlags> {
  return {
    ...flags,
    draft: flags.draft ? await resolveModel(flags.draft, 'decoder') : null,
    draftMtp: flags.draftMtp ? await resolveModel(flags.draftMtp, 'decoder') : null,
  };
}

/** The decoding grammar (GBNF) of an action schema file, through the same loader the pipeline uses. */
export function schemaGbnf(schemaPath: string): string {
  try {
    return jsonSchemaToGbnf(loadActionSchema(schemaPath).schema);
  } catch (err) {
    throw new Error(`--schema ${schemaPath}: ${(err as Error).message}`, { cause: err });
  }
}
export interface GenerateCommandOptions extends SpeculationFlags {
  readonly model: string;
  readonly prompt: string;
  readonly schema?: string;
  /** Absent: the schema's worst case with --schema, else DEFAULT_MAX_TOKENS. */
  readonly maxTokens?: number;
  readonly seed: number;
  readonly temperature: number;
  readonly gpuLayers: number;
  /** Streams decoded text pieces (CLI prints them). */
  readonly onToken?: ((piece: string) => void) | undefined;
}

export interface GenerateCommandResult {
  readonly text: string;
  readonly tokens: readonly number[];
  readonly stopReason: StopReason;
  readonly promptTokens: number;
  readonly drafted: number;
  readonly accepted: number;
  readonly forced: number;
  readonly timings: Timings;
}

/** New tokens of a generation without a schema when --max-tokens is absent. */
const DEFAULT_MAX_TOKENS = 128;

/** `percept generate`: one prompt through the model, optionally schema-constrained and speculative. */
export async function generate(opts: GenerateCommandOptions): Promise<GenerateCommandResult> {
  if (typeof opts.prompt !== 'string') throw new TypeError('--prompt is required');
  const { gpuLayers } = opts;
  const model = await LlamaModel.load(await resolveModel(opts.model, 'decoder'), { gpuLayers });
  let draft: LlamaModel | undefined;
  try {
    const grammar = opts.schema ? await model.grammar(schemaGbnf(opts.schema)) : undefined;
    // A schema's worst case is the default budget, so no output is cut.
    const maxTokens = opts.maxTokens ?? grammar?.worstCaseTokens ?? DEFAULT_MAX_TOKENS;
    const promptTokens = model.tokenize(opts.prompt, { addSpecial: true }).length;
    const ctx = await model.createContext({ nCtx: Math.max(256, promptTokens + maxTokens + 16), nBatch: Math.max(512, promptTokens) });
    draft = await attachSpeculation(ctx, await resolveSpeculation(opts), gpuLayers);
    const onToken = opts.onToken;
    const r: GenerateResult = await ctx.generate([{ text: opts.prompt, addSpecial: true }], {
      maxTokens,
      seed: opts.seed,
      temperature: opts.temperature,
      ...(opts.temperature > 0 ? SAMPLING : {}),
      ...(grammar ? { grammar, jumpForward: true } : {}),
      ...(onToken ? { onTokens: (t: Int32Array) => onToken(model.detokenize(t)) } : {}),
    });
    return {
      text: r.text,
      tokens: r.tokens,
      stopReason: r.stopReason,
      promptTokens: r.promptTokens,
      drafted: r.drafted,
      accepted: r.accepted,
      forced: r.forced,
      timings: r.timings,
    };
  } finally {
    await model.dispose();
    await draft?.dispose();
  }
}
