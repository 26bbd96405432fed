// benchBatch on the tiny decoder: B sequences at once, its rows well-formed, and its per-step parts (llama_decode with
// its synchronize, and the sampling of every row on the host) fitting in the run's time; by default the argmax is taken
// in llama.cpp's graph. No speed is asserted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { benchBatch } from '../../../app/bench/batch.ts';

test('benchBatch reports, per sequence count, tok/s, the steps and what a step spent in llama_decode and in sampling', async () => {
  const r = await benchBatch({
    model: 'synth:gemma4-tiny',
    sequences: [3, 1],
    promptTokens: 16,
    genTokens: 6,
    gpuLayers: 0,
    kvUnified: true,
    perLayerEmbeddingsOnGpu: 'off',
    backendSampling: 'off',
  });
  assert.equal(r.kv_unified, true);
  assert.equal(r.backend_sampling, false, 'greedy on the host, as asked');
  assert.equal(r.per_layer_embeddings_on_gpu, false, 'asked off, in host memory');
  assert.deepEqual(
    r.rows.map((row) => row.sequences),
    [1, 3],
    'rows in ascending sequence counts',
  );
  for (const row of r.rows) {
    const what = JSON.stringify(row);
    assert.ok(row.tg_tok_per_s > 0 && row.total_tok_per_s > 0, what);
    assert.ok(row.steps >= 6 - 1, `a sequence of 6 new tokens takes at least 5 steps after its first: ${what}`);
    assert.ok(row.decode_ms_per_step > 0 && row.sample_ms_per_step > 0, what);
    // The parts fit in the whole: 5 generation decodes each (the first token comes from the prompt), in the run's time.
    const runMs = (1000 * row.sequences * (16 + 6)) / row.total_tok_per_s;
    assert.ok((row.decode_ms_per_step + row.sample_ms_per_step) * (6 - 1) <= runMs * 1.01, `${what}: a run of ${runMs} ms`);
    assert.equal(row.peer_tg_tok_per_s, undefined, 'no peer unless asked');
  }
  // By default every row's argmax is taken in llama.cpp's graph: no logits reach the host.
  const graph = await benchBatch({ model: 'synth:gemma4-tiny', sequences: [2], promptTokens: 16, genTokens: 6, gpuLayers: 0 });
  assert.equal(graph.backend_sampling, true);
  assert.ok(graph.rows[0]!.tg_tok_per_s > 0 && graph.rows[0]!.decode_ms_per_step > 0, JSON.stringify(graph.rows));
  await assert.rejects(
    benchBatch({ model: 'synth:gemma4-tiny', sequences: [0], promptTokens: 16, genTokens: 6, gpuLayers: 0 }),
    /--sequences must be integers in \[1, 256\], got 0/,
  );
});
