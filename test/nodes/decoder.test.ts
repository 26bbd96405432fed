// The decode stage over the native binding: schema-valid actions from image embeddings, system
// prefix reuse across frames, the knobs, cancel/deadline reporting, the width check, and the camera
// stages' drop of a frame whose deadline cannot be met, and cameras spread over lanes.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { decodeBudget, loadActionSchema } from '../../nodes/action-schema.ts';
import {
  createCameraDecoderStages,
  createDecoderStage,
  decodeCallBound,
  laneCameras,
  sumTimeAccounts,
  type DecoderStage,
} from '../../nodes/decoder.ts';
import type { TimeAccount } from '../../native/llama.ts';
import { RealClock } from '../../pipeline/clock.ts';
import { loadConfig } from '../../pipeline/config.ts';
import type { ImageEmbedding } from '../../nodes/payloads.ts';
import { DropFrame, StageAbort, type Knobs, type StageContext, type StageEvent } from '../../pipeline/types.ts';
import { ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';

const schema = loadActionSchema(join(REPO_ROOT, 'configs/actions/robot-action.schema.json'));

function image(nTokens: number, nEmbd: number, seed: number): ImageEmbedding {
  const data = new Float32Array(nTokens * nEmbd);
  for (let i = 0; i < data.length; i++) data[i] = Math.sin(seed * 7.1 + i * 0.37);
  return { data, nTokens, nEmbd };
}

/** A stage context with no deadline unless `budgetMs` is given: how long a decode takes depends on
 * the machine (and its load), so only the test about deadlines sets one, already in the past. */
function stageContext(
  frameId: number,
  opts: { budgetMs?: number; knobs?: Partial<Knobs>; signal?: AbortSignal } = {},
): StageContext & { events: StageEvent[] } {
  const clock = new RealClock();
  const deadlineNs = opts.budgetMs === undefined ? undefined : clock.nowNs() + BigInt(Math.round(opts.budgetMs * 1e6));
  const events: StageEvent[] = [];
  const ctx = standaloneContext({
    clock,
    frame: { frameId, sourceId: 'test' },
    ...(deadlineNs !== undefined ? { deadlineNs } : {}),
    knobs: { maxNewTokens: 96, draft: true, ...opts.knobs },
    signal: opts.signal,
    report: (e) => events.push(e),
  });
  return { ...ctx, events };
}

describe('decode stage on gemma4-tiny', () => {
  let stage: DecoderStage;
  before(async () => {
    // The decoder section as the schema defaults it (maxNewTokens: the grammar's worst case); the
    // stage has no defaults of its own.
    const { decoder } = loadConfig({
      decoder: { nCtx: 2048, instruction: 'Choose the next action.', temperature: 0, seed: 1, jumpForward: true },
    });
    stage = await createDecoderStage({
      ...decoder,
      model: await ensureSynthModel('gemma4-tiny'),
      draft: await ensureSynthModel('gemma4-tiny'),
      actionSchema: schema,
    });
  });
  after(async () => {
    await stage.close?.();
  });

  test('frames become schema-valid actions; the system prefix is reused', async () => {
    assert.equal(stage.nEmbd, 64);
    assert.equal(stage.contract, 'gemma4');
    const gens = [];
    for (let f = 0; f < 3; f++) {
      const sc = stageContext(f);
      const g = await stage.process(image(16, stage.nEmbd, f), sc);
      assert.equal(g.stopReason, 'eos', g.text);
      assert.ok(schema.validate(JSON.parse(g.text)), `${g.text}: ${JSON.stringify(schema.validate.errors)}`);
      assert.ok(sc.events.some((e) => e.kind === 'note' && e.message === 'decode'));
      gens.push(g);
    }
    assert.equal(gens[0]!.reusedTokens, 0);
    // Frames 2 and 3 reuse everything before the image: the chat-templated system prompt.
    assert.ok(gens[1]!.reusedTokens > 10 && gens[1]!.reusedTokens === gens[2]!.reusedTokens, `${gens[1]!.reusedTokens}`);
    assert.ok(gens[1]!.drafted > 0, 'the draft model drafts');
  });

  test("knobs: maxNewTokens never cuts an action (the grammar's worst case is the floor), draft=false turns drafting off", async () => {
    const g = await stage.process(image(16, stage.nEmbd, 9), stageContext(10, { knobs: { maxNewTokens: 3, draft: false } }));
    assert.equal(g.stopReason, 'eos', g.text);
    assert.ok(g.tokens.length > 3);
    assert.equal(g.drafted, 0);
  });

  test("the token budget follows the schema's worst case; a configured one below it is refused", () => {
    assert.ok(stage.maxNewTokens > 30 && stage.maxNewTokens < 400, `${stage.maxNewTokens}`);
    const bounded = { worstCaseTokens: 113, fallback: null };
    assert.equal(decodeBudget(null, bounded, 's.json').maxNewTokens, 113);
    assert.equal(decodeBudget(200, bounded, 's.json').maxNewTokens, 200);
    assert.throws(
      () => decodeBudget(64, bounded, 's.json'),
      /maxNewTokens 64 is below the 113 tokens a complete action under s\.json can take/,
    );
    const unbounded = { worstCaseTokens: null, fallback: 'a recursive grammar' };
    assert.equal(decodeBudget(64, unbounded, 's.json').maxNewTokens, 64);
    assert.throws(() => decodeBudget(null, unbounded, 's.json'), /must be set: .* \(a recursive grammar\)/);
    assert.throws(() => decodeBudget(0, bounded, 's.json'), /integer ≥ 1 or null, got 0/);
    assert.throws(() => decodeBudget(2.5, null, 's.json'), /integer ≥ 1 or null, got 2.5/);
  });

  test("a frame's budget under the ladder's knob: lowered by it, never below a complete action", () => {
    const budget = decodeBudget(200, { worstCaseTokens: 113, fallback: null }, 's.json');
    assert.equal(budget.atKnob(500), 200);
    assert.equal(budget.atKnob(150), 150);
    assert.equal(budget.atKnob(48), 113);
    // A remote server runs the grammar: the configured value and the knob bound, nothing else.
    assert.equal(decodeBudget(null, null, 's.json').atKnob(48), 48);
    assert.equal(decodeBudget(32, null, 's.json').atKnob(48), 32);
    assert.equal(decodeBudget(null, null, 's.json').maxNewTokens, Infinity);
  });

  test('the decode-call bound: the picks after the first with jump-forward, every token without, none where unbounded', () => {
    // The stage's schema (jump-forward on, no padding) gives its grammar's picks after the first.
    assert.ok(stage.worstCaseDecodeCalls! > 10 && stage.worstCaseDecodeCalls! < stage.maxNewTokens, `${stage.worstCaseDecodeCalls}`);
    const g = { worstCaseTokens: 113, maxChoices: 65 };
    assert.equal(decodeCallBound(g, true, 1, 113), 64);
    assert.equal(decodeCallBound(g, false, 1, 113), 113);
    assert.equal(decodeCallBound(g, false, 1, 200), 113, 'the grammar ends the action before maxNewTokens');
    assert.equal(decodeCallBound(g, true, 4, 113), null, 'padded steps can spill a forced run into another step');
    assert.equal(decodeCallBound({ worstCaseTokens: null, maxChoices: null }, true, 1, 64), null);
  });

  test('an aborted signal or a passed deadline gives the frame up with the abort reason, after noting the partial decode', async () => {
    const signal = AbortSignal.abort(new StageAbort('shutdown', 'graph'));
    const sc = stageContext(11, { signal });
    await assert.rejects(stage.process(image(16, stage.nEmbd, 3), sc), (e: unknown) => e === signal.reason);
    assert.ok(sc.events.some((e) => e.kind === 'note' && e.data?.stopReason === 'cancelled'));
    // Native code sees the deadline before any JS timer could fire: the stage gives up with a StageAbort of its own.
    const late = stageContext(12, { budgetMs: -1 });
    await assert.rejects(
      stage.process(image(16, stage.nEmbd, 4), late),
      (e: unknown) => e instanceof StageAbort && e.reason === 'deadline' && e.stage === 'decode',
    );
    assert.ok(late.events.some((e) => e.kind === 'note' && e.data?.stopReason === 'deadline'));
  });

  test('an embedding of the wrong width is a clear error, and the stage keeps working', async () => {
    await assert.rejects(stage.process(image(16, 32, 1), stageContext(20)), /32 wide but .* takes 64/);
    const g = await stage.process(image(16, stage.nEmbd, 5), stageContext(21));
    assert.equal(g.stopReason, 'eos');
  });
});

describe('camera decode stages on gemma4-tiny (one sequence per camera)', () => {
  let stages: DecoderStage[];
  before(async () => {
    const { decoder } = loadConfig({ decoder: { nCtx: 2048, temperature: 0, seed: 1, jumpForward: true } });
    stages = await createCameraDecoderStages(
      { ...decoder, model: await ensureSynthModel('gemma4-tiny'), actionSchema: schema, threads: 1 },
      { cameras: 2, maxActive: null, prefillChunk: 512, kvUnified: false, imageTokens: 480 },
    );
  });
  after(async () => {
    for (const s of stages) await s.close?.();
  });

  test('a frame whose deadline its camera cannot meet is dropped stale before its prefill, and the camera goes on', async () => {
    // Large images: their prefill alone takes far longer than the overhead of getting a frame to the scheduler.
    const rows = 480;
    const first = stageContext(1);
    await stages[0]!.process(image(rows, stages[0]!.nEmbd, 1), first);
    const note = first.events.find((e) => e.kind === 'note' && e.message === 'decode');
    assert.ok(note?.kind === 'note' && note.data);
    // With a history, the stages ahead can read what admission will predict (Stage.predict).
    const due = process.hrtime.bigint() + 60_000_000_000n;
    const predicted = stages[0]!.predict?.(due, false);
    assert.ok(predicted && predicted.ownMs > 0 && predicted.waitMs >= 0, JSON.stringify(predicted));
    // At the decoder's own entry no frame on its way counts: another camera's reservation, due
    // earlier, leaves that prediction as it was.
    const release = stages[1]!.reserve!(due - 120_000_000n);
    assert.deepEqual(stages[0]!.predict?.(due, true), predicted);
    release();
    // A quarter of the time the last frame's prefill took: its image rows alone need more.
    const late = stageContext(2, { budgetMs: Number(note.data.prefillMs) / 4 });
    await assert.rejects(
      stages[0]!.process(image(rows, stages[0]!.nEmbd, 2), late),
      (e: unknown) => e instanceof DropFrame && e.reason === 'stale' && /^predicted miss: about [0-9.]+ ms to its action/.test(e.message),
    );
    const g = await stages[0]!.process(image(rows, stages[0]!.nEmbd, 3), stageContext(3));
    assert.equal(g.stopReason, 'eos');
  });

  test("while a camera's frame decodes, its stage says when that call ends (busyMs); the other camera's does not", async () => {
    const due = process.hrtime.bigint() + 60_000_000_000n;
    assert.equal(stages[0]!.predict?.(due, false).busyMs, undefined, 'nothing in flight');
    let ended = false;
    const decoding = stages[0]!.process(image(480, stages[0]!.nEmbd, 6), stageContext(6)).finally(() => (ended = true));
    const told: number[] = [];
    const other: (number | undefined)[] = [];
    while (!ended) {
      const busyMs = stages[0]!.predict?.(due, false).busyMs;
      if (busyMs !== undefined) told.push(busyMs);
      other.push(stages[1]!.predict?.(due, false).busyMs);
      await new Promise((r) => setTimeout(r, 2));
    }
    await decoding;
    assert.ok(told.length > 0 && told.some((ms) => ms > 0), `told while it ran: ${told.slice(0, 5).join(', ')} ms`);
    assert.ok(
      other.every((ms) => ms === undefined),
      'camera 1 has nothing in flight',
    );
    assert.equal(stages[0]!.predict?.(due, false).busyMs, undefined, 'ended');
  });
});

test('camera stages refuse, at load, a decoder.nCtx that cannot hold a frame, in both KV layouts', async () => {
  const model = await ensureSynthModel('gemma4-tiny');
  for (const kvUnified of [true, false]) {
    const { decoder } = loadConfig({ decoder: { nCtx: 256 } });
    await assert.rejects(
      createCameraDecoderStages(
        { ...decoder, model, actionSchema: schema, threads: 1 },
        { cameras: 3, maxActive: null, prefillChunk: 512, kvUnified, imageTokens: 280 },
      ),
      {
        name: 'RangeError',
        message: new RegExp(
          `^decoder\\.nCtx is too small for 3 cameras: a frame needs (\\d+) KV positions \\(prompt \\d+ tokens \\+ 282 image rows and markers \\+ maxNewTokens \\d+\\) but each camera has 256 \\(${kvUnified ? 'its share of the unified cache' : 'its own KV stream'}\\); raise decoder\\.nCtx to at least \\1$`,
        ),
      },
    );
  }
  // Room enough: loads.
  const { decoder } = loadConfig({ decoder: { nCtx: 1024 } });
  const stages = await createCameraDecoderStages(
    { ...decoder, model, actionSchema: schema, threads: 1 },
    { cameras: 3, maxActive: null, prefillChunk: 512, kvUnified: true, imageTokens: 280 },
  );
  for (const s of stages) await s.close?.();
});

describe('camera decode stages spread over lanes (one context each)', () => {
  test('camera i decodes on lane i % lanes: each lane holds its share, frames decode as on one lane, and the accounts add up', async () => {
    assert.deepEqual(
      [0, 1].map((lane) => laneCameras(5, 2, lane)),
      [3, 2],
    );
    assert.deepEqual(
      [0, 1, 2].map((lane) => laneCameras(16, 3, lane)),
      [6, 5, 5],
    );
    const model = await ensureSynthModel('gemma4-tiny');
    const { decoder } = loadConfig({ decoder: { nCtx: 1024, temperature: 0, seed: 1, jumpForward: true } });
    const config = { ...decoder, model, actionSchema: schema, threads: 1 };
    // A stream per camera: each decodes exactly as alone, so every lane gives the same text for one image.
    const batching = { cameras: 4, maxActive: null, prefillChunk: 512, kvUnified: false, imageTokens: 64 };
    await assert.rejects(createCameraDecoderStages(config, { ...batching, lanes: 3 }), {
      name: 'RangeError',
      message: 'decoder: lanes must be an integer from 1 to 2 (two cameras a lane at least, 4 cameras), got 3',
    });
    const one = await createCameraDecoderStages(config, batching);
    const alone = await one[0]!.process(image(64, one[0]!.nEmbd, 9), stageContext(1));
    for (const s of one) await s.close?.();

    const stages = await createCameraDecoderStages(config, { ...batching, lanes: 2 });
    try {
      assert.deepEqual(
        stages.map((s) => s.lanes),
        [2, 2, 2, 2],
      );
      // One frame at a time: each is a group of its own on its camera's lane.
      const texts: string[] = [];
      for (const [i, s] of stages.entries()) texts.push((await s.process(image(64, s.nEmbd, 9), stageContext(10 + i))).text);
      assert.deepEqual(texts, [alone.text, alone.text, alone.text, alone.text]);
      // Both lanes' schedulers count: two groups and two image decodes each.
      const time = stages[3]!.schedulerTime();
      assert.ok(time);
      assert.equal(time.groups, 4);
      assert.equal(time.imageDecodes, 4);
      assert.ok(time.tokenSeqs >= 4, `token decodes covered ${time.tokenSeqs} sequences`);
    } finally {
      for (const s of stages) await s.close?.();
    }
    const time = stages[0]!.schedulerTime();
    assert.equal(time?.groups, 4, 'closed: the accounts as they closed');
  });

  test('the lanes’ accounts are added field by field', () => {
    const a = { groups: 1, steps: 2, stepMs: 3.5 } as unknown as TimeAccount;
    const b = { groups: 2, steps: 5, stepMs: 1 } as unknown as TimeAccount;
    assert.deepEqual(sumTimeAccounts([a, b]), { groups: 3, steps: 7, stepMs: 4.5 });
  });
});
