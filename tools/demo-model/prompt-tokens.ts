// The token ids of the demo model's training examples, made with percept's own binding so that the
// Python trainer (tools/demo-model/train.py) needs no tokenizer and sees exactly what percept feeds:
//   - the prompt as nodes/decoder.ts builds it: model.chatPrompt([system, user "<marker>\n<instruction>"],
//     …, { imageMarker }) with the GGUF's own chat template, split at the image into the tokens before
//     it, <|image> N image rows <image|> (the markers native/src/prompt.cc puts around an image), and
//     the tokens after it;
//   - each action as percept's grammar-constrained decoder emits it: the canonical JSON text (the key
//     order, compact spacing and number format of native/schema-grammar.ts's grammar) walked through
//     the grammar's token index the way native/src/generate.cc decodes with jump-forward: where the
//     grammar forces a run, its forced tokens; where the model chooses, the admitted token that
//     spells the next bytes (the tokenizer's first token of the rest when admitted, else the
//     longest), then the end-of-turn token.
//
//   node --import tsx tools/demo-model/prompt-tokens.ts --out FILE.json[.gz]
//        [--scenes DIR/scenes.jsonl]... [--split train|val|test --count N [--start K]]...
//        [--config configs/default.json] [--model SPEC]
//
// --scenes reads the actions of a make-scenes dataset; --split computes the actions of a split's seeds
// with tools/make-scenes.ts's own rules (makeScene + actionOf), without drawing them. Both may repeat.
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { relative, resolve } from 'node:path';
import { gzipSync } from 'node:zlib';
import { parseArgs } from 'node:util';
import { LlamaModel, type LlamaGrammar } from '../../native/llama.ts';
import { resolveModel } from '../../models/resolve.ts';
import { loadConfig } from '../../pipeline/config.ts';
import { actionOf, makeScene, seedOf, SPLIT_NAMES, type Split } from '../make-scenes.ts';

/** The marker nodes/decoder.ts puts in the user message where the image goes. */
const IMAGE_MARKER = '<__percept_image__>';
/** Fraction digits the grammar admits for a number without multipleOf (schema-grammar's default). */
const DECIMALS = 4;

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type SchemaNode = Record<string, unknown>;

/** The JSON text the grammar admits for `value`: keys in schema order (native/schema-grammar.ts keeps
 * it for closed objects), no whitespace, numbers rounded to the grammar's digits and written as
 * JSON.stringify writes them. */
export function canonicalJson(value: Json, schema: SchemaNode, path = '#'): string {
  if (value === null || typeof value === 'boolean' || typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number') {
    const v = schema.type === 'integer' ? Math.round(value) : Math.round(value * 10 ** DECIMALS) / 10 ** DECIMALS;
    if (!Number.isFinite(v)) throw new RangeError(`${path}: ${value} is not a finite number`);
    return JSON.stringify(Object.is(v, -0) ? 0 : v);
  }
  if (Array.isArray(value)) {
    const items = (schema.items ?? {}) as SchemaNode;
    return `[${value.map((v, i) => canonicalJson(v, items, `${path}/${i}`)).join(',')}]`;
  }
  const props = (schema.properties ?? {}) as Record<string, SchemaNode>;
  const names = Object.keys(props);
  for (const k of Object.keys(value)) if (!names.includes(k)) throw new RangeError(`${path}: property ${k} is not in the schema`);
  const parts = names
    .filter((k) => value[k] !== undefined)
    .map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k]!, props[k]!, `${path}/${k}`)}`);
  return `{${parts.join(',')}}`;
}

interface Walked {
  readonly tokens: number[];
  /** '1' where the grammar forced the token (jump-forward appends it), '0' where the model picks it. */
  readonly forced: string;
}

/** The tokens percept's decoder produces for `text` under `grammar` (see the file comment). */
export async function walkGrammar(model: LlamaModel, grammar: LlamaGrammar, text: string, endToken: number): Promise<Walked> {
  const pieceOf = (t: number): string => model.detokenize([t], { special: true });
  const tokens: number[] = [];
  let forced = '';
  let pos = 0;
  while (pos < text.length) {
    const run = grammar.forcedTokens(tokens);
    if (run.length > 0) {
      for (const t of run) {
        const piece = pieceOf(t);
        if (!text.startsWith(piece, pos))
          throw new Error(`forced token ${t} ${JSON.stringify(piece)} does not spell ${JSON.stringify(text.slice(pos))}`);
        tokens.push(t);
        forced += '1';
        pos += piece.length;
      }
      continue;
    }
    const rest = text.slice(pos);
    const allowed = await grammar.allowedTokens(tokens);
    const fits = [...allowed].filter((t) => {
      const piece = pieceOf(t);
      return piece.length > 0 && rest.startsWith(piece);
    });
    if (fits.length === 0)
      throw new Error(`the grammar admits no token spelling ${JSON.stringify(rest)} after ${JSON.stringify(text.slice(0, pos))}`);
    const first = model.tokenize(rest, { addSpecial: false, parseSpecial: false })[0];
    const pick =
      first !== undefined && fits.includes(first) ? first : fits.reduce((a, b) => (pieceOf(b).length > pieceOf(a).length ? b : a));
    tokens.push(pick);
    forced += '0';
    pos += pieceOf(pick).length;
  }
  if (model.detokenize(tokens) !== text) throw new Error(`tokens do not spell ${text}`);
  // Complete: nothing forced, and only end-of-generation tokens admitted (the decoder stops here
  // without sampling one; the trainer still teaches the end of turn).
  const after = grammar.forcedTokens(tokens);
  const left = [...(await grammar.allowedTokens(tokens))];
  if (after.length > 0 || !left.includes(endToken) || left.some((t) => model.detokenize([t]).length > 0))
    throw new Error(
      `the grammar is not complete after ${text}: forced [${[...after]}] allowed [${left.map((t) => `${t}=${model.tokenText(t)}`)}]`,
    );
  tokens.push(endToken);
  forced += '0';
  return { tokens, forced };
}

interface Item {
  readonly seed: number;
  readonly split: string;
  readonly action: Json;
}

function scenesItems(file: string): Item[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim().length > 0)
    .map((l) => {
      const o = JSON.parse(l) as { seed: number; split: string; action: Json };
      return { seed: o.seed, split: o.split, action: o.action };
    });
}

function splitItems(split: Split, count: number, start: number): Item[] {
  return Array.from({ length: count }, (_, k) => {
    const seed = seedOf(split, start + k);
    return { seed, split, action: actionOf(makeScene(seed)) as unknown as Json };
  });
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      out: { type: 'string' },
      scenes: { type: 'string', multiple: true, default: [] },
      split: { type: 'string', multiple: true, default: [] },
      count: { type: 'string', multiple: true, default: [] },
      start: { type: 'string', multiple: true, default: [] },
      config: { type: 'string', default: 'configs/default.json' },
      model: { type: 'string' },
    },
    strict: true,
  });
  if (!values.out) throw new Error('--out FILE is required');
  if (values.split.length !== values.count.length) throw new Error('each --split needs its --count');
  const config = loadConfig(values.config);
  const spec = values.model ?? config.decoder.model;
  const path = await resolveModel(spec, 'decoder');
  const schemaPath = config.actions.schema;
  const schemaText = readFileSync(schemaPath, 'utf8');
  const schema = JSON.parse(schemaText) as SchemaNode;

  const items: Item[] = [];
  for (const f of values.scenes) items.push(...scenesItems(f));
  values.split.forEach((s, i) => {
    if (!(SPLIT_NAMES as string[]).includes(s)) throw new Error(`--split must be one of ${SPLIT_NAMES.join(', ')}`);
    items.push(...splitItems(s as Split, Number(values.count[i]), Number(values.start[i] ?? 0)));
  });

  const model = await LlamaModel.load(path, { vocabOnly: true });
  try {
    const info = model.info;
    if (info.imageStartToken === null || info.imageEndToken === null) throw new Error(`${path} has no image markers`);
    // The prompt exactly as nodes/decoder.ts renders it.
    const messages = [
      { role: 'system' as const, content: config.decoder.systemPrompt },
      { role: 'user' as const, content: `${IMAGE_MARKER}\n${config.decoder.instruction}` },
    ];
    const segments = model.chatPrompt(messages, [{ data: new Float32Array(0), nTokens: 0 }], { imageMarker: IMAGE_MARKER });
    const imageAt = segments.findIndex((s) => 'image' in s);
    if (imageAt < 0 || segments.filter((s) => 'image' in s).length !== 1) throw new Error('expected one image segment');
    const tokensOf = (segs: typeof segments): number[] =>
      segs.flatMap((s) => ('text' in s ? [...model.tokenize(s.text, { addSpecial: s.addSpecial ?? false, parseSpecial: true })] : []));
    const textOf = (segs: typeof segments): string => segs.map((s) => ('text' in s ? s.text : '')).join('');
    const before = tokensOf(segments.slice(0, imageAt));
    const after = tokensOf(segments.slice(imageAt + 1));
    const endToken = model.tokenize('<turn|>', { addSpecial: false, parseSpecial: true });
    if (endToken.length !== 1) throw new Error('the vocabulary has no single <turn|> token');

    const grammar = await model.grammarFromJsonSchema(schema);
    const textIndex = new Map<string, number>();
    const texts: string[] = [];
    const tokens: number[][] = [];
    const forced: string[] = [];
    const pieces: Record<string, string> = {};
    const out: [number, number][] = [];
    const t0 = performance.now();
    for (const item of items) {
      const text = canonicalJson(item.action, schema);
      let k = textIndex.get(text);
      if (k === undefined) {
        if (!grammar.admits(text)) throw new Error(`the grammar does not admit ${text} (seed ${item.seed})`);
        const walked = await walkGrammar(model, grammar, text, endToken[0]!);
        k = texts.length;
        textIndex.set(text, k);
        texts.push(text);
        tokens.push(walked.tokens);
        forced.push(walked.forced);
        for (const t of walked.tokens) pieces[t] ??= model.detokenize([t], { special: true });
      }
      out.push([item.seed, k]);
    }
    for (const t of [...before, ...after, info.imageStartToken, info.imageEndToken]) pieces[t] ??= model.tokenText(t);
    const lengths = tokens.map((t) => t.length);
    const doc = {
      format: 'percept-demo-tokens/1',
      generator: 'tools/demo-model/prompt-tokens.ts',
      model: { spec, path: relative(process.cwd(), path), arch: info.arch, nVocab: info.nVocab, imageAttention: info.imageAttention },
      config: values.config,
      schema: relative(process.cwd(), resolve(schemaPath)),
      schemaSha256: createHash('sha256').update(schemaText).digest('hex'),
      systemPrompt: config.decoder.systemPrompt,
      instruction: config.decoder.instruction,
      imageMarker: IMAGE_MARKER,
      rendered: textOf(segments.slice(0, imageAt)) + IMAGE_MARKER + textOf(segments.slice(imageAt + 1)),
      prompt: {
        before,
        imageStart: info.imageStartToken,
        imageEnd: info.imageEndToken,
        after,
        beforeText: textOf(segments.slice(0, imageAt)),
        afterText: textOf(segments.slice(imageAt + 1)),
      },
      special: {
        bos: info.bos,
        eos: info.eos,
        pad: 0,
        endOfTurn: endToken[0],
        imageSoftToken: model.tokenize('<|image|>', { parseSpecial: true })[0],
      },
      endToken: endToken[0],
      grammar: { worstCaseTokens: grammar.worstCaseTokens, maxChoices: grammar.maxChoices, decimals: DECIMALS, compact: true },
      actionTokens: { min: Math.min(...lengths), max: Math.max(...lengths) },
      pieces,
      texts,
      tokens,
      forced,
      items: out,
    };
    const json = JSON.stringify(doc);
    writeFileSync(values.out, values.out.endsWith('.gz') ? gzipSync(json, { level: 9 }) : json);
    const secs = (performance.now() - t0) / 1000;
    console.log(
      `wrote ${values.out}: ${items.length} items, ${texts.length} distinct actions (${doc.actionTokens.min}–${doc.actionTokens.max} tokens with the end token), ` +
        `prompt ${before.length} + image + ${after.length} tokens, ${Object.keys(pieces).length} token ids; ${secs.toFixed(1)} s`,
    );
  } finally {
    await model.dispose();
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.stack : err);
  process.exit(1);
});
