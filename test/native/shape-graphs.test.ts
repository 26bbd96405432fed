// CUDA graphs per step shape (ShapeGraphs, native/src/llama-internal.h): where the context has a
// CUDA backend, greedy jump-forward generations whose steps each ran directly, were captured and were
// replayed give token for token what a process without CUDA graphs gives; without one, asking for
// them changes nothing.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { describe, test } from 'node:test';
import { promisify } from 'node:util';
import { LlamaModel } from '../../native/llama.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';
import { shapeGraphRuns, type ShapeGraphRuns } from './shape-graphs-runs.ts';

const run = promisify(execFile);

/** The same runs in a child process; `env` on top of this one's. */
async function childRuns(mode: 'shape-graphs' | 'plain', env: Record<string, string>): Promise<ShapeGraphRuns> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', 'test/native/shape-graphs-child.ts', mode], {
    cwd: REPO_ROOT,
    env: { ...process.env, ...env },
    maxBuffer: 16 << 20,
  });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as ShapeGraphRuns;
}

// With programmatic dependent launch (PDL) on, as the decoder runs: on the H200 this test failed with
// ggml-cuda's flash-attention kernels launched with PDL inside captured graphs, which percept's build
// patch (native/patches/ggml-cuda-fattn-no-pdl.diff) takes out of PDL during a capture.
const here = await shapeGraphRuns(true);
// Decided apart from what is tested: whether the context has buffers on a CUDA device.
const cuda = here.onCuda;

describe('CUDA graphs per step shape', () => {
  test('every prompt gives the same tokens in each of its three runs, with steps of both shapes', () => {
    assert.equal(here.runs.length, 12);
    for (const r of here.runs) {
      const first = here.runs.find((x) => x.prompt === r.prompt)!;
      assert.deepEqual(r.tokens, first.tokens, `prompt ${r.prompt}`);
      assert.ok(r.tokens.length > r.decodeCalls, 'forced runs rode along: fewer calls than tokens');
    }
  });

  test('the option is validated, and off by default', async () => {
    const model = await LlamaModel.load(await ensureSynthModel('gemma4-tiny'));
    try {
      await assert.rejects(model.createContext({ shapeGraphs: 'yes' as never }), /options\.shapeGraphs/);
      const ctx = await model.createContext({ nCtx: 256, threads: 1 });
      assert.equal(ctx.info.shapeGraphBackends, 0);
      assert.equal(ctx.shapeGraphShapes, 0);
    } finally {
      await model.dispose();
    }
  });

  test('without a CUDA backend nothing is installed', { skip: cuda ? 'this context has a CUDA backend' : false }, () => {
    assert.equal(here.shapeGraphBackends, 0);
    assert.equal(here.shapeGraphShapes, 0);
  });

  test(
    'on CUDA: token for token what a process without CUDA graphs gives, each shape keyed once',
    {
      skip: !cuda
        ? 'this build or machine has no CUDA backend'
        : process.env.GGML_CUDA_DISABLE_GRAPHS !== undefined
          ? 'GGML_CUDA_DISABLE_GRAPHS is set: ggml-cuda captures nothing'
          : false,
    },
    async () => {
      assert.ok(here.shapeGraphBackends > 0, 'installed on the CUDA backend');
      const plain = await childRuns('plain', { GGML_CUDA_DISABLE_GRAPHS: '1' });
      assert.equal(plain.shapeGraphBackends, 0);
      assert.deepEqual(
        here.runs.map((r) => r.tokens),
        plain.runs.map((r) => r.tokens),
      );
      // Prefills and steps of several sizes, each given a key when first seen (there are fewer keys
      // than shapes only if one was evicted, which 32 keys for these few shapes never need).
      const distinctCalls = new Set(here.runs.map((r) => r.decodeCalls)).size;
      assert.ok(here.shapeGraphShapes >= 3, `${here.shapeGraphShapes} shapes keyed (${distinctCalls} call counts)`);
      // And a second process with graphs gives the same again (captures are not carried over).
      const again = await childRuns('shape-graphs', {});
      assert.deepEqual(
        again.runs.map((r) => r.tokens),
        plain.runs.map((r) => r.tokens),
      );
      assert.equal(again.shapeGraphShapes, here.shapeGraphShapes, 'the same calls key the same shapes');
    },
  );
});
