// One diagnosis run for bisect.mjs: test/native/shape-graphs-runs.ts's greedy jump-forward generations
// (gemma4-tiny, all layers on the GPU) with ggml-cuda's own graphs (`plain`) or one graph per step
// shape (`shape`); with PERCEPT_DIAG=1 and diag-logits.diff applied, every llama_decode prints a hash
// of its logits on stderr. Usage: node --import tsx tools/pdl-bisect/diag.ts plain|shape [rounds] [graph slots]
import { shapeGraphRuns } from '../../test/native/shape-graphs-runs.ts';

const result = await shapeGraphRuns(process.argv[2] === 'shape', Number(process.argv[3] ?? 3), Number(process.argv[4] ?? 0));
process.stdout.write(`${JSON.stringify(result)}\n`);
