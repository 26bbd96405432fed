// Child process for test/native/shape-graphs.test.ts: the same greedy jump-forward generations as the
// test, in a process of its own (GGML_CUDA_DISABLE_GRAPHS is read once per process), printed as
// one JSON line: each run's tokens and the context's shape-graph counts.
import { shapeGraphRuns } from './shape-graphs-runs.ts';

const shapeGraphs = process.argv[2] === 'shape-graphs';
process.stdout.write(`${JSON.stringify(await shapeGraphRuns(shapeGraphs))}\n`);
