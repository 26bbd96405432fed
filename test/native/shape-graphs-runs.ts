// The generations test/native/shape-graphs.test.ts compares across processes: four prompts of different
// lengths, in turn, three times each (on CUDA with graphs on: each step shape runs directly, is then
// captured, then replayed), greedy under the action grammar with jump-forward, so the steps
// alternate between one token and a token with its forced run. Each run starts from an empty cache:
// on a GPU a prompt prefilled in one batch or partly reused from another run need not give the
// same logits (other kernels for other batch sizes), which is not what this compares.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_GRAPH_SLOTS, LlamaModel } from '../../native/llama.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

export interface ShapeGraphRuns {
  readonly shapeGraphBackends: number;
  readonly shapeGraphShapes: number;
  /** The context holds buffers on a CUDA device (its memory breakdown), whatever shapeGraphs did. */
  readonly onCuda: boolean;
  readonly runs: readonly { readonly prompt: number; readonly tokens: readonly number[]; readonly decodeCalls: number }[];
}

const PROMPTS = [
  'Describe the scene as one robot action in JSON:',
  'The robot sees a red box on the left of the table and a person waving. Answer with one action in JSON:',
  'Camera 2, dock area: a pallet blocks the path. Next action as JSON:',
  'Action:',
];

/** graphSlots: the context's built graphs kept per step shape (ContextOptions.graphSlots; default: the
 * binding's, as the decoder runs). */
export async function shapeGraphRuns(shapeGraphs: boolean, rounds = 3, graphSlots = DEFAULT_GRAPH_SLOTS): Promise<ShapeGraphRuns> {
  const schema = JSON.parse(await readFile(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'), 'utf8')) as object;
  const model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'), { gpuLayers: 99 });
  try {
    const ctx = await model.createContext({ nCtx: 1024, threads: 2, shapeGraphs, graphSlots });
    const grammar = await model.grammarFromJsonSchema(schema);
    const runs = [];
    for (let round = 0; round < rounds; round++) {
      for (const [prompt, text] of PROMPTS.entries()) {
        ctx.clearCache();
        const r = await ctx.generate([{ text, addSpecial: true }], { maxTokens: grammar.worstCaseTokens!, grammar, jumpForward: true });
        runs.push({ prompt, tokens: [...r.tokens], decodeCalls: r.timings.decodeCalls });
      }
    }
    return {
      shapeGraphBackends: ctx.info.shapeGraphBackends,
      onCuda: ctx.memoryBreakdown().byBufferType.some((b) => b.bufferType.startsWith('CUDA') && b.context + b.compute > 0),
      shapeGraphShapes: ctx.shapeGraphShapes,
      runs,
    };
  } finally {
    await model.dispose();
  }
}
