// The remote decoder (decoder.kind "openai") against llama-server built from the same llama.cpp tree,
// serving the tiny synthetic Gemma 4 decoder and its gemma4v mmproj on loopback; a small node:http
// stub stands in where a case needs answers llama-server does not give on demand (429, 503, a hang).
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { mkdirSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import sharp from 'sharp';
import { benchFrameSamples } from '../../app/bench/frame.ts';
import { asCamera, createCameraGroup, createCameraStages } from '../../app/run/cameras.ts';
import { createStages } from '../../app/run/run.ts';
import { createSource } from '../../app/run/stages.ts';
import { startLlamaServer, type LlamaServer } from '../../app/bench/llama-server.ts';
import { resolveModel } from '../../models/resolve.ts';
import { jsonSchemaToGbnf } from '../../native/schema-grammar.ts';
import { loadActionSchema, type ActionSchema } from '../../nodes/action-schema.ts';
import {
  apiBaseUrl,
  apiKeyFromEnv,
  createOpenAIDecoderStage,
  imageDataUrl,
  type OpenAIDecoderStage,
  type OpenAIDecoderStageConfig,
} from '../../nodes/decoder-openai.ts';
import type { ActionMessage } from '../../nodes/payloads.ts';
import { RealClock, msToNs } from '../../pipeline/clock.ts';
import { ConfigError, loadConfig } from '../../pipeline/config.ts';
import { append } from '../../pipeline/graph/chain.ts';
import { createGraph } from '../../pipeline/graph/graph.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import type { TelemetryEvent } from '../../pipeline/telemetry/events.ts';
import { StageAbort, type StageEvent } from '../../pipeline/types.ts';
import { MODEL_CACHE, ensureSynthModel, REPO_ROOT } from '../support/fixtures.ts';

const dir = join(REPO_ROOT, '.cache', 'test-decoder-openai');
mkdirSync(dir, { recursive: true });
/** An action schema whose every constraint llama.cpp's JSON-schema grammar enforces (enums, integer
 * ranges, required keys, no extra keys), so each reply of the server must pass the actions stage. */
const SCHEMA_PATH = join(dir, 'test-action.schema.json');
writeFileSync(
  SCHEMA_PATH,
  JSON.stringify({
    $id: 'percept/test-action/v1',
    title: 'TestAction',
    type: 'object',
    additionalProperties: false,
    required: ['action', 'heading_deg'],
    properties: {
      action: { enum: ['stop', 'move', 'turn'] },
      heading_deg: { type: 'integer', minimum: -180, maximum: 180 },
    },
  }),
);
const MODEL_ID = 'percept-tiny';
const VALID_REPLY = '{"action":"stop","heading_deg":0}';

let schema: ActionSchema;
let model: string;
let mmproj: string;
let server: LlamaServer;

before(async () => {
  schema = loadActionSchema(SCHEMA_PATH);
  model = await ensureSynthModel('gemma4-tiny');
  mmproj = await resolveModel('synth:gemma4-vision-tiny-mmproj', 'mmproj', { cacheDir: MODEL_CACHE });
  server = await startLlamaServer({ model, mmproj, alias: MODEL_ID, parallel: 1 });
});
after(async () => {
  await server?.close();
});

function stageConfig(endpoint: string, overrides: Partial<OpenAIDecoderStageConfig> = {}): OpenAIDecoderStageConfig {
  return {
    endpoint,
    model: MODEL_ID,
    concurrency: 1,
    timeoutMs: null,
    retries: 2,
    systemPrompt: 'You are the perception module of a mobile robot.',
    instruction: 'Choose the next action.',
    maxNewTokens: 200,
    temperature: 0,
    seed: 1,
    actionSchema: schema,
    ...overrides,
  };
}

/** A config running [decode (openai), actions] on `frames` pattern frames, all queued at once. */
function remoteConfig(endpoint: string, frames: number, decoder: Record<string, unknown> = {}, decodeBudgetMs = 600_000) {
  return loadConfig({
    source: { kind: 'pattern', fps: 1000, frames, width: 320, height: 240 },
    decoder: { kind: 'openai', endpoint, model: MODEL_ID, maxNewTokens: 200, ...decoder },
    actions: { schema: SCHEMA_PATH },
    budgets: { endToEndMs: 600_000, stages: { decode: decodeBudgetMs }, dropPredictedMiss: false },
    edges: { default: { policy: 'queue', capacity: 16 } },
    ladder: { enabled: false, initial: { maxNewTokens: 200 } },
    telemetry: { liveTable: 'off' },
  });
}

/** Builds the stages (the load-time probe runs here), then `beforeRun`, then runs the graph to its end. */
async function runRemote(config: ReturnType<typeof remoteConfig>, beforeRun?: () => Promise<void>) {
  const stages = await createStages(config, loadActionSchema(config.actions.schema), { publish: false, warmup: false });
  await beforeRun?.();
  assert.deepEqual(
    stages.chain.stages.map((s) => s.name),
    ['decode', 'actions'],
    'no local preprocess or encoder in front of a remote decoder',
  );
  const graph = createGraph({
    source: await createSource(config.source, config.preprocess.maxPixels),
    stages: stages.chain,
    clock: new RealClock(),
    config,
  });
  const events: TelemetryEvent[] = [];
  const outputs: ActionMessage[] = [];
  graph.events.subscribe((e) => events.push(e));
  graph.outputs.subscribe((env) => outputs.push(env.payload as ActionMessage));
  const summary = await graph.run();
  return { summary, events, outputs };
}

describe('against llama-server (same llama.cpp tree, tiny Gemma 4 + gemma4v mmproj)', () => {
  test("llama-server decodes under percept's own bounded grammar: the robot-action schema's numbers end, every action is valid", async () => {
    const robot = join(REPO_ROOT, 'configs/actions/robot-action.schema.json');
    const config = loadConfig({ ...remoteConfig(server.url, 3), actions: { schema: robot } });
    const stages = await createStages(config, loadActionSchema(robot), { publish: false, warmup: false });
    const decoder = stages.chain.stages[0] as unknown as OpenAIDecoderStage;
    assert.equal(decoder.server.name, 'llamacpp');
    assert.equal(decoder.server.constraint, 'grammar');
    assert.equal(decoder.server.grammarRefused, null);
    const graph = createGraph({
      source: await createSource(config.source, config.preprocess.maxPixels),
      stages: stages.chain,
      clock: new RealClock(),
      config,
    });
    const outputs: ActionMessage[] = [];
    graph.outputs.subscribe((env) => outputs.push(env.payload as ActionMessage));
    const summary = await graph.run();
    assert.equal(summary.frames.out, 3, JSON.stringify(summary.drops));
    const valid = loadActionSchema(robot);
    for (const out of outputs) assert.ok(valid.validate(out.action), JSON.stringify(out.action));
  });

  test("under percept's grammar, a level's maxNewTokens below the grammar's worst case cuts no action", async () => {
    // 16 new tokens cannot hold a robot action; the grammar bounds it, so the server gets the bound it was probed with.
    const robot = join(REPO_ROOT, 'configs/actions/robot-action.schema.json');
    const base = remoteConfig(server.url, 3, { maxNewTokens: null });
    const config = loadConfig({
      ...base,
      decoder: { ...base.decoder, maxNewTokens: null },
      actions: { schema: robot },
      ladder: { enabled: false, initial: { maxNewTokens: 16 }, rungs: [] },
    });
    const { summary, outputs } = await runRemote(config);
    assert.equal(summary.frames.out, 3, JSON.stringify(summary.drops));
    const valid = loadActionSchema(robot);
    for (const out of outputs) assert.ok(valid.validate(out.action), JSON.stringify(out.action));
  });

  test('frames become actions that pass the schema, with the server’s token counts and timings', async () => {
    const { summary, events, outputs } = await runRemote(remoteConfig(server.url, 3));
    assert.equal(summary.frames.in, 3);
    assert.equal(summary.frames.out, 3, JSON.stringify(summary.drops));
    for (const out of outputs) {
      assert.ok(schema.validate(out.action), JSON.stringify(out.action));
      assert.equal(out.schemaId, 'percept/test-action/v1');
    }
    const notes = events.flatMap((e) => (e.type === 'note' && e.message === 'decode' ? [e.data!] : []));
    assert.equal(notes.length, 3);
    for (const n of notes) {
      // The image is part of the prompt: far more tokens than the system prompt and instruction.
      assert.ok((n.promptTokens as number) > 64, `prompt tokens ${n.promptTokens}`);
      assert.ok((n.tokens as number) > 0);
      assert.ok((n.prefillMs as number) > 0 && (n.decodeMs as number) > 0, 'llama-server timings');
      // The server's prefill and decode happen inside the round trip.
      assert.ok((n.httpMs as number) > 0 && (n.requestMs as number) > (n.prefillMs as number) + (n.decodeMs as number));
      assert.equal(n.attempts, 1);
    }
  });

  test('the frame deadline aborts a request in flight: counted as a cancel, the frame dropped stale', async () => {
    // After the load-time probe, the server's one slot is taken by a long streamed completion, so the
    // frame's request waits at the server until its stage deadline, whatever the machine's speed.
    const blocker = new AbortController();
    let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
    const holdSlot = async () => {
      const res = await fetch(`${server.url}/completion`, {
        method: 'POST',
        body: JSON.stringify({ prompt: 'hold the slot', n_predict: 100_000, ignore_eos: true, stream: true }),
        signal: blocker.signal,
      });
      reader = res.body!.getReader();
      await reader.read(); // the first token: the slot is busy
    };
    try {
      const { summary, events } = await runRemote(remoteConfig(server.url, 1, {}, 300), holdSlot);
      assert.equal(summary.frames.out, 0);
      assert.deepEqual(summary.drops.byReason, { stale: 1 });
      assert.deepEqual(summary.cancels, { decode: { deadline: 1 } });
      const details = events.flatMap((e) => (e.type === 'cancel' ? [e.detail] : []));
      assert.equal(details.length, 1);
      assert.match(details[0]!, /^request aborted after \d+ ms, attempt 1 \(llamacpp at http:\/\/127\.0\.0\.1:\d+\/v1\)$/);
    } finally {
      blocker.abort();
      await reader?.cancel().catch(() => undefined);
    }
  });

  test('a server without the mmproj fails at load: it lacks vision, named with the server', async () => {
    const textOnly = await startLlamaServer({ model, alias: MODEL_ID });
    try {
      await assert.rejects(
        createOpenAIDecoderStage(stageConfig(textOnly.url)),
        (err: Error) =>
          err.message.includes(`llamacpp at ${textOnly.url}/v1 (model "${MODEL_ID}") lacks vision`) && /--mmproj/.test(err.message),
      );
    } finally {
      await textOnly.close();
    }
  });

  test('a model the server does not serve fails at load, listing what it serves', async () => {
    await assert.rejects(
      createOpenAIDecoderStage(stageConfig(server.url, { model: 'gemma-4-E4B-it' })),
      /does not serve model "gemma-4-E4B-it" \(GET .*\/v1\/models lists "percept-tiny"\)/,
    );
  });

  test('an unreachable endpoint fails at load with what went wrong', async () => {
    const port = await closedPort();
    await assert.rejects(
      createOpenAIDecoderStage(stageConfig(`http://127.0.0.1:${port}`)),
      new RegExp(
        `server at http://127\\.0\\.0\\.1:${port}/v1 cannot be used: cannot reach .*/v1/models: connection refused \\(ECONNREFUSED\\)`,
      ),
    );
  });

  test('bench frame --decoder openai: latency, the server’s token counts and the HTTP path’s own cost', async () => {
    const { result, frames } = await benchFrameSamples({
      model: MODEL_ID,
      encoder: 'projection',
      decoder: 'openai',
      endpoint: server.url,
      imageTokens: 280,
      frames: 2,
      fps: 1000,
      gpuLayers: 0,
      warmup: false,
    });
    assert.equal(result.decoder, 'openai');
    assert.equal(result.frames_in, 2);
    assert.equal(frames.length, 2);
    assert.ok(Object.keys(result.stages_ms_p50).every((name) => ['decode', 'actions'].includes(name)));
    assert.ok(result.prompt_tokens_median! > 64 && result.new_tokens_median! > 0);
    assert.ok(result.http_ms_p50! > 0 && result.http_ms_p99! >= result.http_ms_p50!);
    assert.ok(frames.every((f) => f.httpMs! > 0 && f.totalMs > f.httpMs!));
  });

  test('several cameras share the remote decoder: each camera gets its actions, every frame accounted', async () => {
    const config = loadConfig({
      decoder: { kind: 'openai', endpoint: server.url, model: MODEL_ID, maxNewTokens: 200 },
      actions: { schema: SCHEMA_PATH },
      budgets: { endToEndMs: 600_000, stages: { decode: 600_000 }, dropPredictedMiss: false },
      edges: { default: { policy: 'queue', capacity: 16 } },
      ladder: { enabled: false, initial: { maxNewTokens: 200 } },
      telemetry: { liveTable: 'off' },
      cameras: ['front', 'rear'].map((id) => ({ id, source: { kind: 'pattern', fps: 1000, frames: 2, width: 320, height: 240 } })),
    });
    const stages = await createCameraStages(config, schema, { publish: false, warmup: false });
    assert.ok(stages.chains.every((c) => c.stages.map((s) => s.name).join() === 'decode,actions'));
    const sources = await Promise.all(
      config.cameras!.map(async (c) => asCamera(await createSource(c.source, config.preprocess.maxPixels), c.id)),
    );
    const outputs: ActionMessage[] = [];
    const tap = {
      name: 'tap',
      process: async (action: ActionMessage) => {
        outputs.push(action);
        return action;
      },
    };
    const group = createCameraGroup(config, sources, { ...stages, chains: stages.chains.map((c) => append(c, tap)) }, new RealClock());
    const summary = await group.run();
    for (const id of ['front', 'rear']) {
      const s = summary.cameras![id]!;
      assert.equal(s.frames.in, 2);
      assert.equal(s.frames.out, 2, `${id}: ${JSON.stringify(s.drops)}`);
    }
    assert.deepEqual(outputs.map((o) => o.sourceId).sort(), ['front', 'front', 'rear', 'rear']);
    assert.ok(outputs.every((o) => schema.validate(o.action)));
  });

  // Last: it stops the server.
  test('when the server goes away, connection refused is retried with backoff until the deadline, not past it', async () => {
    const stage = await createOpenAIDecoderStage(stageConfig(server.url, { retries: 1000 }));
    await server.close();
    const clock = new RealClock();
    const deadlineNs = clock.nowNs() + msToNs(3000);
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new StageAbort('deadline', 'decode')), 3000);
    const events: StageEvent[] = [];
    const frame = {
      encoding: 'jpeg' as const,
      data: await sharp({ create: { width: 8, height: 8, channels: 3, background: '#888' } })
        .jpeg()
        .toBuffer(),
    };
    try {
      const err = await stage
        .process(frame, standaloneContext({ clock, deadlineNs, signal: controller.signal, report: (e) => events.push(e) }))
        .then(
          () => assert.fail('a request to a stopped server succeeded'),
          (e: Error) => e,
        );
      // Either the backoff check gave up before the deadline, or the deadline cut a backoff wait.
      const m = /connection refused \(ECONNREFUSED\) \((\d+) attempts; no retry: .* past the deadline/.exec(err.message);
      const cancel = events.find((e) => e.kind === 'cancel');
      const attempts = m ? Number(m[1]) : Number(/after (\d+) attempts/.exec(cancel?.kind === 'cancel' ? (cancel.detail ?? '') : '')?.[1]);
      assert.ok(attempts >= 2 && attempts < 1001, `${err.message} / ${JSON.stringify(events)}`);
    } finally {
      clearTimeout(timer);
    }
  });
});

/** A stub OpenAI-compatible server: /v1/models lists 'stub'; the probe gets VALID_REPLY; later chat
 * requests get what `answer` returns. Records each chat request's arrival (performance.now()). */
async function startStub(answer: (res: ServerResponse, n: number) => void | Promise<void>) {
  const arrivals: number[] = [];
  let inFlight = 0;
  let maxInFlight = 0;
  const completion = (content: string) => JSON.stringify({ choices: [{ finish_reason: 'stop', message: { role: 'assistant', content } }] });
  const srv: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/v1/models') {
        res.setHeader('content-type', 'application/json');
        return res.end(JSON.stringify({ object: 'list', data: [{ id: 'stub', owned_by: 'stub-server' }] }));
      }
      const n = arrivals.push(performance.now()) - 1;
      if (n === 0) return res.end(completion(VALID_REPLY)); // the load-time probe
      inFlight += 1;
      maxInFlight = Math.max(maxInFlight, inFlight);
      res.on('close', () => (inFlight -= 1));
      void answer(res, n);
    });
  });
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  return {
    url,
    /** Chat requests after the probe. */
    requests: () => arrivals.slice(1),
    maxInFlight: () => maxInFlight,
    completion,
    close: () => new Promise<void>((resolve) => srv.close(() => resolve())),
  };
}

const jpegFrame = async () => ({
  encoding: 'jpeg' as const,
  data: await sharp({ create: { width: 8, height: 8, channels: 3, background: '#888' } })
    .jpeg()
    .toBuffer(),
});

describe('retries, timeouts and concurrency (stub server)', () => {
  test('503 is retried with exponential backoff until the deadline stops it, not decoder.retries', async () => {
    const stub = await startStub((res) => {
      res.statusCode = 503;
      res.end(JSON.stringify({ error: { message: 'Loading model' } }));
    });
    try {
      const stage = await createOpenAIDecoderStage(stageConfig(stub.url, { model: 'stub', retries: 1000 }));
      const controller = new AbortController();
      const timer = setTimeout(() => controller.abort(new StageAbort('deadline', 'decode')), 3000);
      const clock = new RealClock();
      await assert.rejects(
        stage.process(await jpegFrame(), standaloneContext({ clock, deadlineNs: clock.nowNs() + msToNs(3000), signal: controller.signal })),
        (err: Error) => err instanceof StageAbort || /answered 503 .*Loading model \(\d+ attempts; no retry/.test(err.message),
      );
      clearTimeout(timer);
      const requests = stub.requests();
      assert.ok(requests.length >= 2 && requests.length < 1001, `${requests.length} attempts`);
      // Exponential backoff: the wait before attempt k+1 is at least half of 50 ms · 2^(k−1), capped at
      // 2 s (a busy machine only makes the gaps longer; 2 ms for timer rounding). An eighth attempt
      // fits in the 3 s when the jitter is low: its wait is capped.
      requests
        .slice(1)
        .forEach((t, i) => assert.ok(t - requests[i]! >= Math.min(2000, 50 * 2 ** i) / 2 - 2, `gap ${i + 1}: ${t - requests[i]!} ms`));
    } finally {
      await stub.close();
    }
  });

  test('retries stop at decoder.retries', async () => {
    const stub = await startStub((res) => {
      res.statusCode = 503;
      res.end('busy');
    });
    try {
      const stage = await createOpenAIDecoderStage(stageConfig(stub.url, { model: 'stub', retries: 1 }));
      await assert.rejects(
        stage.process(await jpegFrame(), standaloneContext()),
        /answered 503 .*busy \(2 attempts; decoder\.retries is 1\)/,
      );
      assert.equal(stub.requests().length, 2);
    } finally {
      await stub.close();
    }
  });

  test('a 429 whose Retry-After ends past the deadline is not retried; a 400 never is', async () => {
    let status = 429;
    const stub = await startStub((res) => {
      res.statusCode = status;
      if (status === 429) res.setHeader('retry-after', '30');
      res.end(JSON.stringify({ error: { message: status === 429 ? 'slow down' : 'bad image' } }));
    });
    try {
      const stage = await createOpenAIDecoderStage(stageConfig(stub.url, { model: 'stub', retries: 5 }));
      const clock = new RealClock();
      await assert.rejects(
        stage.process(await jpegFrame(), standaloneContext({ clock, deadlineNs: clock.nowNs() + msToNs(10_000) })),
        /answered 429 .*slow down \(1 attempt; no retry: waiting 30000 ms .* past the deadline/,
      );
      status = 400;
      await assert.rejects(stage.process(await jpegFrame(), standaloneContext()), /answered 400 .*bad image$/);
      assert.equal(stub.requests().length, 2);
    } finally {
      await stub.close();
    }
  });

  test('decoder.timeoutMs aborts one attempt (a cancel) and the next attempt may succeed', async () => {
    const stub = await startStub((res, n) => {
      if (n === 1) return; // hangs: aborted by the timeout
      res.end(stub.completion(VALID_REPLY));
    });
    try {
      // Later attempts are answered at once; retries to spare in case a busy machine stalls one past its limit.
      const stage = await createOpenAIDecoderStage(stageConfig(stub.url, { model: 'stub', retries: 5, timeoutMs: 500 }));
      const events: StageEvent[] = [];
      const clock = new RealClock();
      const generation = await stage.process(
        await jpegFrame(),
        standaloneContext({ clock, deadlineNs: clock.nowNs() + msToNs(600_000), report: (e) => events.push(e) }),
      );
      assert.equal(generation.text, VALID_REPLY);
      assert.equal(generation.stopReason, 'eos');
      const cancels = events.filter((e) => e.kind === 'cancel');
      assert.ok(cancels.length >= 1);
      assert.equal(stub.requests().length, cancels.length + 1, 'each attempt but the last was aborted');
      assert.match(cancels[0]!.kind === 'cancel' ? cancels[0]!.detail! : '', /decoder\.timeoutMs \(500 ms\), attempt 1 \(stub-server at /);
    } finally {
      await stub.close();
    }
  });

  test('decoder.concurrency requests are in flight at once and no more; the rest wait on the edge', { timeout: 60_000 }, async () => {
    const held: ServerResponse[] = [];
    const stub = await startStub((res) => {
      held.push(res);
      // Answer only when two are waiting (or the last one): proves two were in flight together.
      if (held.length === 2 || stub.requests().length === 5) for (const r of held.splice(0)) r.end(stub.completion(VALID_REPLY));
    });
    try {
      const { summary } = await runRemote(remoteConfig(stub.url, 5, { model: 'stub', concurrency: 2 }));
      assert.equal(summary.frames.out, 5, JSON.stringify(summary.drops));
      assert.equal(stub.maxInFlight(), 2);
    } finally {
      await stub.close();
    }
  });

  test("vLLM gets percept's grammar in the field its version reads; one that refuses it gets the json_schema, saying why", async () => {
    // What a vLLM answers: /v1/models owned by "vllm", /version at its root. Each chat request's constraint is kept.
    const vllm = async (version: string | null, refuseGrammar = false) => {
      const constraints: string[] = [];
      const grammars: unknown[] = [];
      const srv = createServer((req, res) => {
        let text = '';
        req.on('data', (chunk: Buffer) => (text += chunk.toString()));
        req.on('end', () => {
          if (req.url === '/v1/models') return res.end(JSON.stringify({ data: [{ id: 'stub', owned_by: 'vllm' }] }));
          if (req.url === '/version') return version === null ? res.writeHead(404).end('{}') : res.end(JSON.stringify({ version }));
          const sent = JSON.parse(text) as Record<string, unknown>;
          const field = ['structured_outputs', 'guided_grammar', 'response_format'].find((k) => k in sent)!;
          constraints.push(field);
          if (refuseGrammar && field !== 'response_format') {
            return res.writeHead(400).end(JSON.stringify({ error: { message: 'grammar is not supported by this backend' } }));
          }
          if (field !== 'response_format')
            grammars.push(field === 'structured_outputs' ? (sent[field] as { grammar?: unknown }).grammar : sent[field]);
          res.end(JSON.stringify({ choices: [{ finish_reason: 'stop', message: { content: VALID_REPLY } }] }));
        });
      });
      await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
      try {
        const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
        const { server } = await createOpenAIDecoderStage(stageConfig(url, { model: 'stub' }));
        for (const gbnf of grammars) assert.equal(gbnf, jsonSchemaToGbnf(schema.schema), 'the GBNF the local decoder runs');
        return { server, constraints };
      } finally {
        await new Promise<void>((resolve) => srv.close(() => resolve()));
      }
    };
    const current = await vllm('0.11.2');
    assert.equal(current.server.constraint, 'structured_outputs');
    assert.deepEqual(current.constraints, ['response_format', 'structured_outputs']);
    assert.equal((await vllm('0.10.2+cu128')).server.constraint, 'structured_outputs');
    assert.equal((await vllm(null)).server.constraint, 'structured_outputs', 'no /version: taken as current');
    const old = await vllm('0.9.2');
    assert.equal(old.server.constraint, 'guided_grammar');
    assert.deepEqual(old.constraints, ['response_format', 'guided_grammar']);
    const refusing = await vllm('0.11.2', true);
    assert.equal(refusing.server.constraint, 'json_schema');
    assert.match(refusing.server.grammarRefused ?? '', /answered 400 .*grammar is not supported by this backend/);
  });

  test('a server that ignores response_format fails at load: it lacks structured output', async () => {
    const srv = createServer((req, res) => {
      req.resume();
      req.on('end', () =>
        res.end(
          req.url === '/v1/models'
            ? JSON.stringify({ data: [{ id: 'stub', owned_by: 'plain-server' }] })
            : JSON.stringify({ choices: [{ finish_reason: 'stop', message: { content: 'I think the robot should stop.' } }] }),
        ),
      );
    });
    await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
    try {
      await assert.rejects(
        createOpenAIDecoderStage(stageConfig(url, { model: 'stub' })),
        /plain-server at .* \(model "stub"\) lacks structured output: .*not JSON: "I think the robot should stop\."/,
      );
    } finally {
      await new Promise<void>((resolve) => srv.close(() => resolve()));
    }
  });
});

describe('frames, endpoints, keys and config', () => {
  test('raw frames are sent as JPEG: BGR channels swapped, stride honoured, mono16 by its high byte', async () => {
    const [w, h, stride] = [4, 2, 16];
    const bgr = new Uint8Array(stride * h);
    for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) bgr.set([255, 0, 0], y * stride + 3 * x); // blue, as B,G,R
    const pixel = async (url: string) => {
      const [head, b64] = url.split(',');
      assert.equal(head, 'data:image/jpeg;base64');
      const { data } = await sharp(Buffer.from(b64!, 'base64')).toColourspace('srgb').raw().toBuffer({ resolveWithObject: true });
      return [...data.subarray(0, 3)];
    };
    const [r, g, b] = await pixel(await imageDataUrl({ encoding: 'bgr8', data: bgr, width: w, height: h, stride }));
    assert.ok(b! > 200 && r! < 50 && g! < 50, `blue stays blue: ${[r, g, b]}`);
    const mono16 = new Uint16Array(w * h).fill(0xc000);
    const [v] = await pixel(await imageDataUrl({ encoding: 'mono16', data: new Uint8Array(mono16.buffer), width: w, height: h }));
    assert.ok(Math.abs(v! - 0xc0) <= 2, `mono16 0xc000 → ${v}`);
    const jpeg = (await jpegFrame()).data;
    assert.equal(await imageDataUrl({ encoding: 'jpeg', data: jpeg }), `data:image/jpeg;base64,${jpeg.toString('base64')}`);
    await assert.rejects(imageDataUrl({ encoding: 'rgb8', data: new Uint8Array(10), width: 4, height: 2 }), /has 10 bytes, needs 24/);
  });

  test('endpoints take /v1 or not; keys come from the environment only', () => {
    assert.equal(apiBaseUrl('http://127.0.0.1:8080'), 'http://127.0.0.1:8080/v1');
    assert.equal(apiBaseUrl('https://lb.example/v1/'), 'https://lb.example/v1');
    assert.equal(apiBaseUrl('http://host/proxy'), 'http://host/proxy/v1');
    assert.throws(() => apiBaseUrl('tcp://127.0.0.1:8080'), /http\(s\) URL/);
    assert.equal(apiKeyFromEnv(null, {}), undefined);
    assert.equal(apiKeyFromEnv({ env: 'K' }, { K: 'secret' }), 'secret');
    assert.throws(() => apiKeyFromEnv({ env: 'K' }, {}), /environment variable K is not set/);
  });

  test('config: kind openai needs an endpoint and a served model id; each kind refuses the other’s settings', () => {
    const issues = (decoder: object): string[] => {
      try {
        loadConfig({ decoder });
        return [];
      } catch (err) {
        return (err as ConfigError).issues.map((i) => `${i.path}: ${i.message}`);
      }
    };
    assert.deepEqual(issues({ kind: 'openai', endpoint: 'http://127.0.0.1:8080', model: 'google/gemma-4-E4B-it' }), []);
    const missing = issues({ kind: 'openai' });
    assert.ok(missing.some((m) => m.startsWith('/decoder/endpoint: is required')));
    assert.ok(missing.some((m) => m.startsWith('/decoder/model: with decoder.kind "openai" must be the model id')));
    assert.deepEqual(issues({ kind: 'openai', endpoint: 'ftp://x', model: 'm', ngram: true }), [
      '/decoder/endpoint: must be an http:// or https:// URL, got "ftp://x"',
      '/decoder/ngram: applies to decoder.kind "local" only',
    ]);
    assert.deepEqual(issues({ endpoint: 'http://x', concurrency: 2 }), [
      '/decoder/endpoint: applies to decoder.kind "openai" only',
      '/decoder/concurrency: must be 1 for decoder.kind "local" (it decodes one frame at a time)',
    ]);
    assert.ok(
      issues({ kind: 'openai', endpoint: 'http://x', model: 'm', apiKey: 'sk-inline' }).some((m) => m.startsWith('/decoder/apiKey')),
    );
    // From a file, a served model id is not taken for a path relative to the config.
    const file = join(dir, 'remote.json');
    writeFileSync(file, JSON.stringify({ decoder: { kind: 'openai', endpoint: 'http://x', model: 'google/gemma-4-E4B-it' } }));
    assert.equal(loadConfig(file).decoder.model, 'google/gemma-4-E4B-it');
  });
});

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address() as AddressInfo;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return port;
}
