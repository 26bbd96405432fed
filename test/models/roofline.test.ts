// Decode roofline (models/roofline.ts, `percept calc roofline`): bytes read per token from a GGUF's tensor
// table, counted here by hand for a small table, and the ceiling against known figures.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { GGUFWriter, arr, readGGUF, str, u32 } from '../../models/gguf.ts';
import { GGMLType } from '../../models/quant.ts';
import { roofline, weightReads } from '../../models/roofline.ts';
import { describeModel } from '../../models/resolve.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

const run = promisify(execFile);

/**
 * A small Gemma-4-like tensor table with an MoE tensor (metadata only: the skeleton's data reads as zeros).
 * Sizes by hand: Q8_0 = 34 bytes per 32 values, F16 = 2 bytes, F32 = 4 bytes.
 *   token_embd            Q8_0 [64, 1000]  = 2·34·1000 = 68000, one row 68
 *   per_layer_token_embd  Q8_0 [32, 1000]  = 1·34·1000 = 34000, one row 34
 *   per_layer_model_proj  F16  [64, 32]    = 4096
 *   blk.0.attn_q          F16  [64, 128]   = 16384
 *   blk.0.ffn_up_exps     Q8_0 [64, 96, 8] = 2·34·96·8 = 52224 (8 experts, 2 used: 13056 a token)
 *   output_norm           F32  [64]        = 256
 */
async function table(options: { untiedOutput?: boolean } = {}) {
  const w = new GGUFWriter();
  w.set('general.architecture', str('gemma4'));
  w.set('gemma4.block_count', u32(2));
  w.set('gemma4.embedding_length', u32(64));
  w.set('gemma4.attention.head_count', u32(2));
  w.set('gemma4.attention.head_count_kv', u32(1));
  w.set('gemma4.attention.key_length', u32(128));
  w.set('gemma4.attention.value_length', u32(128));
  w.set('gemma4.attention.key_length_swa', u32(64));
  w.set('gemma4.attention.value_length_swa', u32(64));
  w.set('gemma4.attention.sliding_window', u32(16));
  w.set('gemma4.attention.sliding_window_pattern', arr('bool', [true, false]));
  w.set('gemma4.expert_count', u32(8));
  w.set('gemma4.expert_used_count', u32(2));
  w.addTensor({ name: 'token_embd.weight', type: GGMLType.Q8_0, shape: [64, 1000] });
  w.addTensor({ name: 'per_layer_token_embd.weight', type: GGMLType.Q8_0, shape: [32, 1000] });
  w.addTensor({ name: 'per_layer_model_proj.weight', type: GGMLType.F16, shape: [64, 32] });
  w.addTensor({ name: 'blk.0.attn_q.weight', type: GGMLType.F16, shape: [64, 128] });
  w.addTensor({ name: 'blk.0.ffn_up_exps.weight', type: GGMLType.Q8_0, shape: [64, 96, 8] });
  w.addTensor({ name: 'output_norm.weight', type: GGMLType.F32, shape: [64] });
  if (options.untiedOutput) w.addTensor({ name: 'output.weight', type: GGMLType.F16, shape: [64, 1000] }); // 128000
  return readGGUF(w.skeleton());
}

describe('weight bytes read per token', () => {
  test('tied embeddings: the table is read in full as the output projection, plus the looked-up row', async () => {
    const r = weightReads(await table());
    assert.equal(r.fileBytes, 68000 + 34000 + 4096 + 16384 + 52224 + 256);
    assert.equal(r.readBytesPerStep, 68000 + 68 + 34 + 4096 + 16384 + 13056 + 256);
    assert.deepEqual(r.byRule, { full: 68000 + 4096 + 16384 + 256, lookup: 68 + 34, experts: 13056 });
    assert.equal(r.tensors.find((t) => t.name === 'per_layer_token_embd.weight')!.rule, 'lookup');
  });

  test('an untied output: the token table is only a lookup; the output projection is read in full', async () => {
    const r = weightReads(await table({ untiedOutput: true }));
    assert.equal(r.readBytesPerStep, 68 + 34 + 4096 + 16384 + 13056 + 256 + 128000);
  });

  test('batch: weights once per step, a row per token, up to min(experts, batch·used) experts', async () => {
    const f = await table();
    assert.equal(weightReads(f, { batch: 2 }).readBytesPerStep, 68000 + 2 * (68 + 34) + 4096 + 16384 + 2 * 13056 + 256);
    assert.equal(weightReads(f, { batch: 8 }).byRule.experts, 52224);
    assert.throws(() => weightReads(f, { batch: 0 }), /batch must be an integer ≥ 1/);
  });

  test('Gemma 4 E2B (Q4_K_M mix): the 35·256-wide per-layer table costs one Q6_K row, 35·256/256·210 bytes', async () => {
    const r = weightReads(await describeModel('synth:gemma4-e2b?wtype=q4_k'));
    const ple = r.tensors.find((t) => t.name === 'per_layer_token_embd.weight')!;
    assert.equal(ple.type, 'Q6_K');
    assert.equal(ple.readBytes, 35 * 210);
    assert.ok(ple.bytes > 1.7 * 2 ** 30, `the table itself is ${ple.bytes} bytes`);
  });
});

describe('ceiling', () => {
  test('bandwidth ÷ bytes per token; KV reads of the attended positions on top; measured as a fraction', async () => {
    const f = await table();
    const weights = 68000 + 68 + 34 + 4096 + 16384 + 13056 + 256;
    const r = roofline(f, { bandwidthGBs: 1, measuredTokS: 1000 });
    assert.equal(r.bytesPerToken, weights);
    assert.equal(r.ceilingTokS, 1e9 / weights);
    assert.equal(r.fractionOfCeiling, 1000 / (1e9 / weights));
    // ctx 100, f16: the sliding layer reads its 16-position window of K and V rows of 64 values, the full
    // layer 100 positions of 128.
    const kv = 16 * (64 + 64) * 2 + 100 * (128 + 128) * 2;
    const withKv = roofline(f, { bandwidthGBs: 1, ctx: 100 });
    assert.equal(withKv.kvBytesPerToken, kv);
    assert.equal(withKv.ceilingTokS, 1e9 / (weights + kv));
    // batch 4: per token, the weights are shared and the KV is not.
    const batched = roofline(f, { bandwidthGBs: 1, ctx: 100, batch: 4 });
    assert.equal(batched.bytesPerToken, (68000 + 4 * 102 + 4096 + 16384 + 4 * 13056 + 256) / 4 + kv);
    assert.throws(() => roofline(f, { bandwidthGBs: 0 }), /bandwidth must be a number > 0/);
    assert.throws(() => roofline(f, { bandwidthGBs: 1, measuredTokS: -1 }), /measured tok\/s must be > 0/);
  });

  test("the anchors' figure: a Gemma-3-4B-shaped Q4_K_M reads 2.48 GB a token (within 1 %)", async () => {
    const r = roofline(await describeModel('synth:gemma3-4b?wtype=q4_k'), { bandwidthGBs: 4300 });
    assert.ok(Math.abs(r.bytesPerToken / 2.48e9 - 1) < 0.01, `${r.bytesPerToken} bytes`);
  });
});

describe('percept calc roofline', () => {
  const cli = (...args: string[]) =>
    run(process.execPath, ['--import', 'tsx', 'app/cli.ts', 'calc', 'roofline', ...args], { cwd: REPO_ROOT, timeout: 60_000 });

  test('--device h200 --measured-tok-s: ceiling and percent in the JSON', { timeout: 60_000 }, async () => {
    const { stdout } = await cli(
      '-m',
      'synth:gemma4-e4b?wtype=q4_k',
      '--device',
      'h200',
      '--measured-tok-s',
      '230',
      '--ctx',
      '4096',
      '--json',
    );
    const r = JSON.parse(stdout);
    assert.equal(r.bandwidth_gbs, 4800);
    assert.equal(r.bytes_per_token, r.weight_bytes_per_token + r.kv_bytes_per_token);
    assert.ok(r.lookup_bytes_not_read > 2 * 2 ** 30, "E4B's per-layer table is looked up, not streamed");
    assert.ok(Math.abs(r.ceiling_tok_s - 4800e9 / r.bytes_per_token) < 0.1);
    assert.ok(Math.abs(r.percent_of_ceiling - (100 * 230) / r.ceiling_tok_s) < 0.01);
  });

  test('bandwidth: exactly one of --bandwidth-gbs and --device; unknown devices are named', { timeout: 60_000 }, async () => {
    await assert.rejects(cli('-m', 'synth:gemma3-1b', '--device', 'h200', '--bandwidth-gbs', '100'), /cannot be used with/);
    await assert.rejects(cli('-m', 'synth:gemma3-1b'), /give one of --bandwidth-gbs or --device/);
    await assert.rejects(
      cli('-m', 'synth:gemma3-1b', '--device', 'a100'),
      /unknown --device 'a100'; expected one of: jetson-orin-nano-8gb/,
    );
  });
});
