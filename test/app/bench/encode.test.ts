// bench encode / bench frame: their JSON is well-formed and counts what they ran (their speed belongs
// to the benchmarks).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { benchEncode } from '../../../app/bench/encode.ts';
import { benchFrame, computeMib, decodeFigures, slowest, worstCase, type FrameSample } from '../../../app/bench/frame.ts';

test(
  'bench encode on an mmproj: preprocessing on one libvips thread, load report, phases per call, a batch, the check against clip',
  { timeout: 300_000 },
  async () => {
    const r = await benchEncode({
      encoder: 'synth:gemma4-vision-tiny-mmproj',
      ep: 'cpu',
      imageTokens: 280,
      iterations: 3,
      threads: 1,
      profile: 'phases',
      batch: 2,
      check: true,
    });
    assert.equal(r.runtime, 'mtmd');
    assert.equal(r.preprocess_threads, 1);
    assert.ok(r.preprocess_cpu_ms_p50 > 0 && Number.isFinite(r.load_average));
    assert.equal(r.tokens, 264);
    const clip = r.clip!;
    assert.deepEqual([clip.flash_attention, clip.graph_splits, clip.batchable], [true, 1, true]);
    assert.ok(clip.compute_buffers_mib.CPU! > 0);
    const p = clip.profile!;
    assert.equal(p.mode, 'phases');
    assert.ok(p.setup_ms_p50 > 0 && p.compute_ms_p50 > 0);
    // Medians of the phases against the encode's p99: a share above it, not a fixed slack, covers rounding.
    assert.ok(p.setup_ms_p50 + p.compute_ms_p50 <= r.encode_ms_p99 * 1.01, 'the phases of an encode exceed the encode');
    assert.deepEqual([clip.batch!.images, clip.batch!.batched], [2, true]);
    assert.ok(Math.abs(clip.batch!.per_image_ms_p50 * 2 - clip.batch!.encode_ms_p50) < 0.01);
    // percept's graph by default: its phases on every call; the warm-up call built and laid it out
    assert.deepEqual([clip.path, clip.graph_fallback], ['percept', null]);
    const ph = clip.phases!;
    assert.ok(ph.first.build_ms > 0 && ph.first.alloc_ms > 0);
    assert.deepEqual([ph.build_ms.p99, ph.alloc_ms.p99], [0, 0], 'a timed encode rebuilt or laid out the graph again');
    assert.ok(ph.upload_ms.p50 > 0 && ph.graph_compute_ms.p50 > 0);
    assert.deepEqual([clip.check!.against, clip.check!.tokens], ['clip', 264]);
    assert.ok(clip.check!.worst_token_cosine >= 0.9999, `worst per-token cosine against clip ${clip.check!.worst_token_cosine}`);
    // the baseline: this path again on the nudged input; a tiny tower barely moves, but it moves
    const nudged = clip.check!.nudged_worst_token_cosine;
    assert.ok(nudged >= 0.999 && nudged < 1, `worst per-token cosine of the nudged input ${nudged}`);
    assert.deepEqual([clip.flash_attention_head, clip.head_size], [16, 16]);
    // --flash-attention padded: heads of 40 run at 64; --check compares with clip's unpadded attention
    const padded = await benchEncode({
      encoder: 'synth:gemma4-vision-tiny-h40-mmproj',
      ep: 'cpu',
      imageTokens: 70,
      iterations: 1,
      threads: 1,
      flashAttention: 'padded',
      check: true,
    });
    assert.deepEqual([padded.clip!.flash_attention_head, padded.clip!.head_size], [64, 40]);
    assert.ok(padded.clip!.check!.worst_token_cosine >= 0.9999, `padded vs clip: ${padded.clip!.check!.worst_token_cosine}`);
    assert.ok(padded.clip!.copied_weights_mib > 0, 'gemma4v: q and k reordered for one RoPE op');
    // SigLIP (no per-head norm or RoPE): heads of 72 run at 80 from weights padded once at load
    const siglip = await benchEncode({
      encoder: 'synth:siglip-tiny-h72-mmproj',
      ep: 'cpu',
      imageTokens: 280,
      iterations: 1,
      threads: 1,
      flashAttention: 'padded',
      check: true,
    });
    assert.deepEqual([siglip.clip!.flash_attention_head, siglip.clip!.head_size], [80, 72]);
    assert.ok(siglip.clip!.copied_weights_mib > 0, `copied weights ${siglip.clip!.copied_weights_mib} MiB`);
    assert.ok(siglip.clip!.check!.worst_token_cosine >= 0.9999, `padded weights vs clip: ${siglip.clip!.check!.worst_token_cosine}`);
    const viaClip = await benchEncode({
      encoder: 'synth:gemma4-vision-tiny-mmproj',
      ep: 'cpu',
      imageTokens: 70,
      iterations: 1,
      path: 'clip',
    });
    assert.equal(viaClip.clip!.path, 'clip');
    assert.equal(viaClip.clip!.phases, undefined, 'clip reports no phases without --profile');
    await assert.rejects(
      benchEncode({ encoder: 'synth:gemma4-vision-tiny', ep: 'cpu', imageTokens: 280, iterations: 1, profile: 'ops' }),
      /--profile, --flash-attention, --batch, --path and --check are for the llama\.cpp clip encoder/,
    );
  },
);

test('bench frame reports the first frame apart from the rest, with and without the warm-up', { timeout: 600_000 }, async () => {
  for (const warmup of [true, false]) {
    const r = await benchFrame({
      model: 'synth:gemma4-tiny',
      encoder: 'projection',
      imageTokens: 280,
      frames: 3,
      fps: 4,
      gpuLayers: 0,
      warmup,
    });
    assert.equal(r.warmup, warmup);
    // No layer offloaded: the per-layer embedding table stays in host memory.
    assert.equal(r.per_layer_embeddings_on_gpu, false);
    assert.ok(r.first_frame_ms !== null && r.first_frame_ms > 0);
    assert.ok(r.first_over_median !== null && r.first_over_median > 0);
    for (const stage of ['preprocess', 'encode', 'decode']) {
      assert.ok(r.stages_first_ms[stage]! > 0, `${stage} first frame time`);
      assert.ok(r.stages_first_over_median[stage]! > 0, `${stage} ratio`);
    }
    const d = r.first_frame_decode!;
    assert.ok(d.prefill_ms! > 0 && d.decode_ms_per_token! > 0 && d.new_tokens! > 0 && d.other_ms !== null && d.decode_calls! > 0);
    assert.equal(d.prompt_tokens, r.prompt_tokens_median);
    // After the warm-up the first frame finds the cache as every later frame does: the text before
    // the image reused, its own image prefilled (not the warm-up's image, nor an empty cache).
    assert.equal(d.reused_tokens, warmup ? r.reused_tokens_median : 0, `reused tokens of the first frame, warm-up ${warmup}`);
    assert.ok(r.reused_tokens_median! > 0 && r.reused_tokens_median! < r.prompt_tokens_median!);
    // The tiny preset reads images both ways: its image is decoded alone, then the text after it.
    assert.equal(r.prefill_decode_calls_median, 2);
    // The slowest frame is one of the three, no faster than the first, with its note.
    const slow = r.slowest_frame!;
    assert.ok(Number.isInteger(slow.index) && slow.index >= 0 && slow.index < 3, `index ${slow.index}`);
    assert.ok(slow.ms >= r.first_frame_ms!, `${slow.ms} ms, the first ${r.first_frame_ms} ms`);
    if (slow.index === 0) assert.equal(slow.ms, r.first_frame_ms);
    assert.ok(slow.stages_ms.decode! > 0 && slow.stages_ms.decode! <= slow.ms);
    assert.ok(slow.decode!.decode_calls! > 0 && slow.decode!.new_tokens! > 0 && slow.decode!.prefill_ms! > 0);
    // The schema's slowest action bounds every frame's calls; its time is those calls at the run's
    // mean call time.
    assert.ok(r.worst_case_decode_calls! >= slow.decode!.decode_calls!, `worst case ${r.worst_case_decode_calls} calls`);
    assert.ok(r.worst_case_decode_ms! > 0);
    // The decoder's compute buffers as it closed: on this CPU build, the CPU's, non-zero.
    assert.ok(r.decoder_compute_mib !== null && r.decoder_compute_mib.CPU! > 0, JSON.stringify(r.decoder_compute_mib));
  }
});

test('slowest: the frame with the longest time, its stages and its decode note', () => {
  const sample = (decodeCalls: number): FrameSample => ({
    totalMs: 0,
    promptTokens: 300,
    reusedTokens: 20,
    newTokens: 2 * decodeCalls,
    prefillMs: 40,
    decodeMs: 5 * decodeCalls,
    decodeCalls,
    prefillDecodeCalls: 2,
    singleDecodeCalls: decodeCalls,
    singleDecodeMs: 5 * decodeCalls,
    llamaDecodeMs: 5 * decodeCalls,
    graphReuses: 0,
    paddedSteps: 0,
    drafted: null,
    accepted: null,
    httpMs: null,
    decodeStageMs: 50 + 5 * decodeCalls,
  });
  const frames = [
    { total: 100, stages: { decode: 80 }, note: {} },
    { total: 250.12345, stages: { decode: 230.5 }, note: {} },
    { total: 120, stages: { decode: 90 } },
  ];
  const samples = [sample(8), sample(30), sample(9)];
  const s = slowest(frames, samples)!;
  assert.equal(s.index, 1);
  assert.equal(s.ms, 250.123);
  assert.deepEqual(s.stages_ms, { decode: 230.5 });
  assert.equal(s.decode!.decode_calls, 30);
  assert.equal(s.decode!.new_tokens, 60);
  assert.equal(s.decode!.decode_ms_per_token, 2.5);
  assert.equal(s.decode!.other_ms, 50 + 150 - 40 - 150);
  // A frame without a decode note (dropped before the decoder spoke) has no decode figures.
  assert.equal(slowest([frames[2]!], [samples[2]!])!.decode, null);
  assert.equal(slowest([], []), null);
});

test('worstCase: the bound in calls, and in ms at the frames’ mean call time', () => {
  const frame = (decodeCalls: number | null, llamaDecodeMs: number | null): FrameSample => ({
    totalMs: 0,
    promptTokens: null,
    reusedTokens: null,
    newTokens: null,
    prefillMs: null,
    decodeMs: null,
    decodeCalls,
    prefillDecodeCalls: 2,
    singleDecodeCalls: null,
    singleDecodeMs: null,
    llamaDecodeMs,
    graphReuses: null,
    paddedSteps: null,
    drafted: null,
    accepted: null,
    httpMs: null,
    decodeStageMs: null,
  });
  // 10 calls in 70 ms: 7 ms a call; a frame without a decode note does not count.
  assert.deepEqual(worstCase(64, [frame(4, 24), frame(6, 46), frame(null, null)]), {
    worst_case_decode_calls: 64,
    worst_case_decode_ms: 448,
  });
  assert.deepEqual(worstCase(null, [frame(4, 24)]), { worst_case_decode_calls: null, worst_case_decode_ms: null });
  assert.deepEqual(worstCase(64, []), { worst_case_decode_calls: 64, worst_case_decode_ms: null });
});

test('computeMib: compute bytes by buffer type in MiB', () => {
  const entry = (bufferType: string, compute: number) => ({ bufferType, model: 7, context: 9, compute });
  const memory = {
    model: 14,
    context: 18,
    compute: 3 * 2 ** 20 + 2 ** 19 + 1,
    byBufferType: [entry('CUDA0', 3 * 2 ** 20), entry('CUDA_Host', 2 ** 19 + 1)],
  };
  assert.deepEqual(computeMib(memory), { CUDA0: 3, CUDA_Host: 0.5 });
  assert.equal(computeMib(null), null);
});

test("decodeFigures: acceptance and tokens per decode (the prompt's decode counted), summed over the frames; null without a draft", () => {
  const frame = (newTokens: number, decodeCalls: number, drafted: number | null, accepted: number | null): FrameSample => ({
    totalMs: 0,
    promptTokens: 100,
    reusedTokens: 0,
    newTokens,
    prefillMs: 10,
    decodeMs: 20,
    decodeCalls,
    prefillDecodeCalls: 2,
    singleDecodeCalls: 0,
    singleDecodeMs: 0,
    llamaDecodeMs: 20,
    graphReuses: 0,
    paddedSteps: 0,
    drafted,
    accepted,
    httpMs: null,
    decodeStageMs: 30,
  });
  const f = decodeFigures([frame(11, 4, 6, 3), frame(21, 6, 10, 2)]);
  assert.deepEqual([f.drafted, f.accepted, f.acceptance, f.tokens_per_decode], [16, 5, 0.313, 2.667]);
  const none = decodeFigures([frame(11, 10, null, null)]);
  assert.deepEqual([none.drafted, none.accepted, none.acceptance, none.tokens_per_decode], [null, null, null, 1]);
});
