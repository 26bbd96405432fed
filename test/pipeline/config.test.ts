// Config loading: schema defaults, and rejection that names the JSON path and what was expected.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError, loadConfig } from '../../pipeline/config.ts';
import { cudaEnvironment, cudaGraphsWanted } from '../../nodes/decoder.ts';

const cache = new URL('../../.cache/pipeline-config/', import.meta.url);

/** The issues loadConfig reports for `input`, as "path: message" lines. */
function issuesOf(input: object | string): string[] {
  try {
    loadConfig(input);
  } catch (error) {
    assert.ok(error instanceof ConfigError, String(error));
    return error.issues.map((i) => `${i.path}: ${i.message}`);
  }
  assert.fail('expected the config to be rejected');
}

describe('loadConfig', () => {
  test('{} gets every default from the schema', () => {
    const config = loadConfig({});
    assert.deepEqual(config.source, { kind: 'pattern', fps: 10, frames: 20, width: 1280, height: 720 });
    assert.deepEqual(config.preprocess, { maxPixels: 33177600, threads: 1, jpegDecode: 'auto' });
    assert.deepEqual(config.encoder, { kind: 'onnx', model: 'synth:gemma4-vision-tiny', executionProvider: 'cpu', threads: 1 });
    assert.equal(config.decoder.maxNewTokens, null);
    assert.equal(config.decoder.draft, null);
    assert.deepEqual(config.budgets, {
      endToEndMs: 2000,
      stages: { preprocess: 50, encode: 500, decode: 1500, actions: 20, publish: 20 },
      dropPredictedMiss: true,
      dropPredictedConflation: true,
      shutdownGraceMs: 3000,
    });
    assert.deepEqual(config.edges, { default: { policy: 'latest' } });
    assert.deepEqual(config.ladder.initial, { imageTokens: 280, maxNewTokens: 48, draft: true, frameSkip: 0 });
    assert.deepEqual(config.ladder.rungs, [{ imageTokens: 140 }, { maxNewTokens: 32 }, { draft: false }, { frameSkip: 1 }]);
    assert.equal(config.clock, 'real');
    assert.deepEqual(config.telemetry, { liveTable: 'auto', intervalMs: 1000 });
  });

  test('decoder.cudaGraphs: null by default, which is on; refused for a remote decoder', () => {
    const { decoder } = loadConfig({});
    assert.equal(decoder.cudaGraphs, null);
    assert.equal(cudaGraphsWanted(decoder), true, 'on for the default decoder (unpadded jump-forward)');
    assert.equal(cudaGraphsWanted(loadConfig({ decoder: { stepTokens: 4 } }).decoder), true);
    assert.equal(cudaGraphsWanted(loadConfig({ decoder: { cudaGraphs: false } }).decoder), false);
    // What the decoder adds to the environment before its model loads: graphs off, or nothing (PDL stays on).
    const gpu = (d: object) => ({ ...loadConfig({ decoder: d }).decoder, gpuLayers: 99 });
    assert.deepEqual(cudaEnvironment(gpu({ cudaGraphs: false }), {}), { GGML_CUDA_DISABLE_GRAPHS: '1' });
    assert.deepEqual(cudaEnvironment(gpu({}), { PATH: '/bin' }), {});
    assert.deepEqual(
      cudaEnvironment(gpu({ cudaGraphs: false }), { GGML_CUDA_DISABLE_GRAPHS: '0' }),
      {},
      "the user's graph setting is kept",
    );
    assert.deepEqual(cudaEnvironment({ ...gpu({ cudaGraphs: false }), gpuLayers: 0 }, {}), {}, 'nothing on the CPU');
    assert.throws(
      () => loadConfig({ decoder: { kind: 'openai', endpoint: 'http://x', model: 'm', cudaGraphs: false } }),
      /\/decoder\/cudaGraphs: applies to decoder.kind "local" only/,
    );
  });

  // Nullable booleans of the local decoder: null by default (the binding decides), a boolean, refused for a remote one.
  for (const [key, why] of [
    ['perLayerEmbeddingsOnGpu', 'on with every layer offloaded'],
    ['mixedPrefill', 'the binding decides'],
  ] as const) {
    test(`decoder.${key}: null by default (${why}), a boolean, refused for a remote decoder`, () => {
      assert.equal(loadConfig({}).decoder[key], null);
      assert.equal(loadConfig({ decoder: { [key]: false } }).decoder[key], false);
      assert.throws(() => loadConfig({ decoder: { [key]: 'off' } }), new RegExp(`/decoder/${key}`));
      assert.throws(
        () => loadConfig({ decoder: { kind: 'openai', endpoint: 'http://x', model: 'm', [key]: true } }),
        new RegExp(`/decoder/${key}: applies to decoder.kind "local" only`),
      );
    });
  }

  test('decoder.stepTokens: 1 (no padding) by default, refused for a remote decoder and out of range', () => {
    assert.equal(loadConfig({}).decoder.stepTokens, 1);
    assert.equal(loadConfig({ decoder: { stepTokens: 4 } }).decoder.stepTokens, 4);
    assert.throws(
      () => loadConfig({ decoder: { kind: 'openai', endpoint: 'http://x', model: 'm', stepTokens: 4 } }),
      /\/decoder\/stepTokens: applies to decoder.kind "local" only/,
    );
    assert.throws(() => loadConfig({ decoder: { stepTokens: 0 } }), /\/decoder\/stepTokens: must be >= 1/);
  });

  test('defaults fill the chosen kind of a source, and the object passed in is left alone', () => {
    const input = { source: { kind: 'bag', path: 'bags/sample.mcap' } };
    const config = loadConfig(input);
    assert.deepEqual(config.source, { kind: 'bag', path: 'bags/sample.mcap', pace: 'recorded', rate: 1, loop: false });
    assert.deepEqual(input, { source: { kind: 'bag', path: 'bags/sample.mcap' } });
  });

  test('configs/test-fake.json loads', () => {
    const config = loadConfig('configs/test-fake.json');
    assert.equal(config.clock, 'virtual');
    assert.deepEqual(config.edges.publish, { policy: 'queue', capacity: 8 });
  });

  const rejected: [string, object, string[]][] = [
    ['a wrong type', { budgets: { endToEndMs: '2000' } }, ['/budgets/endToEndMs: must be number']],
    ['a misspelt key', { budgets: { endToEndMS: 2000 } }, ['/budgets/endToEndMS: is not a known property']],
    ['an unknown source kind', { source: { kind: 'webcam' } }, ['/source/kind: "webcam" is not one of the known kinds']],
    ['a missing required field', { source: { kind: 'bag' } }, ["/source: must have required property 'path'"]],
    ['a queue without capacity', { edges: { publish: { policy: 'queue' } } }, ["/edges/publish: must have required property 'capacity'"]],
    [
      'an edge for an unknown stage',
      { edges: { decoder: { policy: 'latest' } } },
      [
        '/edges/decoder: is not a known name here (expected "default" or a stage name: preprocess, encode, decode, actions, publish, record)',
      ],
    ],
    [
      'a budget for an unknown stage',
      { budgets: { stages: { decod: 5 } } },
      ['/budgets/stages/decod: is not a known name here (expected a stage name: preprocess, encode, decode, actions, publish, record)'],
    ],
    ['a non-positive budget', { budgets: { endToEndMs: 0 } }, ['/budgets/endToEndMs: must be > 0']],
    [
      'an image-token budget Gemma does not have',
      { ladder: { initial: { imageTokens: 300 } } },
      ['/ladder/initial/imageTokens: must be one of 70, 140, 256, 280, 560, 1120'],
    ],
    ['an empty rung', { ladder: { rungs: [{}] } }, ['/ladder/rungs/0: must NOT have fewer than 1 properties']],
    ['a bad clock', { clock: 'wall' }, ['/clock: must be one of "real", "virtual"']],
    [
      'several problems at once',
      { clock: 1, telemetry: { intervalMs: 5 } },
      ['/clock: must be one of "real", "virtual"', '/telemetry/intervalMs: must be >= 50'],
    ],
    // semantic checks, after the schema
    [
      'a stage budget above the end-to-end budget',
      { budgets: { endToEndMs: 1000 } },
      ['/budgets/stages/decode: must be at most /budgets/endToEndMs (1000) but is 1500'],
    ],
    [
      'rungs that do not degrade',
      { ladder: { rungs: [{ imageTokens: 560 }, { draft: false }, { draft: false }, { maxNewTokens: 48 }, { frameSkip: 0 }] } },
      [
        '/ladder/rungs/0/imageTokens: must be below the level above (280) but is 560',
        '/ladder/rungs/2/draft: drafting is already off at the level above',
        '/ladder/rungs/3/maxNewTokens: must be below the level above (48) but is 48',
        '/ladder/rungs/4/frameSkip: must be above the level above (0) but is 0',
      ],
    ],
    [
      'more service levels than ladder levels',
      { ladder: { rungs: [{ draft: false }] }, virtualServiceMs: { decode: [3, 2, 1] } },
      [
        "/virtualServiceMs/decode: has 3 levels but the ladder has 2 (ladder.rungs + 1): calibrate again with this ladder, or leave ladder.rungs out to take the calibration file's",
      ],
    ],
    [
      'minSamples above the window',
      { ladder: { window: 4, minSamples: 5 } },
      ['/ladder/minSamples: must be at most /ladder/window (4) but is 5'],
    ],
    // endpoints: libzmq would bind 99999 modulo 65536, and * on every interface, without a word
    [
      'a port out of range',
      { publisher: { endpoint: 'tcp://127.0.0.1:99999' } },
      ['/publisher/endpoint: tcp://127.0.0.1:99999: port 99999 is out of range (1–65535, or * for any free port)'],
    ],
    [
      'a bind on every interface without CURVE',
      { publisher: { endpoint: 'tcp://*:5556' } },
      [
        '/publisher/endpoint: tcp://*:5556 binds every network interface without encryption: set curve (key files) to encrypt it, or insecure: true to allow it in the clear',
      ],
    ],
    [
      'a control socket on another interface without CURVE',
      { control: { enabled: true, endpoint: 'tcp://192.168.1.20:5557' } },
      [
        '/control/endpoint: tcp://192.168.1.20:5557 binds 192.168.1.20, which other hosts can reach, without encryption: set curve (key files) to encrypt it, or insecure: true to allow it in the clear',
      ],
    ],
    [
      'a frame input from another host without CURVE',
      { source: { kind: 'zmq', endpoint: 'tcp://10.1.2.3:6000' } },
      [
        '/source/endpoint: tcp://10.1.2.3:6000 connects to another host without encryption: set curve (key files) to encrypt it, or insecure: true to allow it in the clear',
      ],
    ],
    [
      'a live source on a virtual clock',
      { source: { kind: 'ffmpeg', url: 'a.mp4' }, clock: 'virtual' },
      ['/clock: must be "real" for a live source (ffmpeg): its frames come in real time'],
    ],
    [
      'a connect to any port',
      { source: { kind: 'zmq', endpoint: 'tcp://127.0.0.1:*' } },
      ['/source/endpoint: tcp://127.0.0.1:*: a connect needs a port number, not *'],
    ],
    [
      'a transport percept does not speak',
      { publisher: { endpoint: 'udp://127.0.0.1:5556' } },
      [
        '/publisher/endpoint: "udp://127.0.0.1:5556" is not an endpoint percept accepts: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME',
      ],
    ],
    [
      'CURVE without the key the side needs',
      {
        source: { kind: 'zmq', endpoint: 'tcp://127.0.0.1:6000', curve: { secretKeyFile: 'client.key' } },
        publisher: { endpoint: 'tcp://*:1', curve: { serverKeyFile: 'x.pub' } },
      },
      [
        "/publisher/curve/secretKeyFile: is required to bind with CURVE (the server's secret key)",
        "/source/curve/serverKeyFile: is required to connect with CURVE (the server's public key)",
      ],
    ],
  ];
  for (const [what, input, expected] of rejected) {
    test(`rejects ${what}, naming the path`, () => {
      assert.deepEqual(issuesOf(input), expected);
    });
  }

  test('endpoints other hosts can reach are allowed with CURVE or insecure: true; loopback, ipc and wildcard ports as they are', () => {
    assert.equal(
      loadConfig({ publisher: { endpoint: 'tcp://*:5556', curve: { secretKeyFile: '/keys/server.key' } } }).publisher.endpoint,
      'tcp://*:5556',
    );
    assert.equal(loadConfig({ publisher: { endpoint: 'tcp://0.0.0.0:5556', insecure: true } }).publisher.insecure, true);
    for (const endpoint of [
      'tcp://127.0.0.1:*',
      'tcp://localhost:5556',
      'tcp://[::1]:5556',
      'ipc:///tmp/percept.sock',
      'inproc://percept',
    ]) {
      assert.equal(loadConfig({ publisher: { endpoint } }).publisher.endpoint, endpoint);
    }
    const config = loadConfig({});
    assert.deepEqual(config.publisher.highWaterMarks, { actions: 1000, events: 1000, telemetry: 16 });
    assert.equal(config.publisher.curve, null);
    assert.deepEqual(config.control, { enabled: false, endpoint: 'tcp://127.0.0.1:5557', curve: null, insecure: false });
  });

  test('the error message names the file and every issue', () => {
    mkdirSync(cache, { recursive: true });
    const file = new URL('bad.json', cache).pathname;
    writeFileSync(file, JSON.stringify({ budgets: { endToEndMs: 'soon' }, clock: 'wall' }));
    assert.throws(
      () => loadConfig(file),
      (error: Error) => {
        assert.equal(
          error.message,
          `invalid config ${file}:\n  /budgets/endToEndMs: must be number\n  /clock: must be one of "real", "virtual"`,
        );
        return true;
      },
    );
  });

  test('relative paths in a config file are relative to the file; defaults to the installation; synth: specs stay', () => {
    const root = fileURLToPath(new URL('../..', import.meta.url));
    const dir = fileURLToPath(new URL('relative/configs/', cache));
    mkdirSync(dir, { recursive: true });
    const file = join(dir, 'run.json');
    writeFileSync(
      file,
      JSON.stringify({
        source: { kind: 'bag', path: '../bags/front.mcap' },
        encoder: { kind: 'onnx', model: 'synth:gemma4-vision-tiny' },
        decoder: { model: 'models/decoder.gguf', draft: '/abs/draft.gguf' },
        recorder: { enabled: true, path: 'out/run.mcap' },
        publisher: { curve: { secretKeyFile: 'keys/server.key' } },
      }),
    );
    const ffmpeg = join(dir, 'ffmpeg.json');
    writeFileSync(ffmpeg, JSON.stringify({ source: { kind: 'ffmpeg', url: 'clips/a.mp4' } }));
    const stream = join(dir, 'stream.json');
    writeFileSync(stream, JSON.stringify({ source: { kind: 'ffmpeg', url: 'rtsp://127.0.0.1:8554/cam' } }));
    assert.deepEqual(
      [loadConfig(ffmpeg).source, loadConfig(stream).source].map((s) => s.kind === 'ffmpeg' && s.url),
      [join(dir, 'clips/a.mp4'), 'rtsp://127.0.0.1:8554/cam'],
      'a file is relative to the config, a URL stays',
    );
    const config = loadConfig(file);
    assert.equal(config.source.kind === 'bag' && config.source.path, join(dir, '../bags/front.mcap'));
    assert.equal(config.encoder.kind === 'onnx' && config.encoder.model, 'synth:gemma4-vision-tiny');
    assert.equal(config.decoder.model, join(dir, 'models/decoder.gguf'));
    assert.equal(config.decoder.draft, '/abs/draft.gguf');
    assert.equal(config.decoder.draftMtp, null);
    assert.equal(config.recorder.path, join(dir, 'out/run.mcap'));
    assert.equal(config.publisher.curve?.secretKeyFile, join(dir, 'keys/server.key'));
    assert.equal(config.actions.schema, join(root, 'configs/actions/robot-action.schema.json'), 'a default names the installed file');
    // The shipped config works from any directory: its paths are relative to configs/.
    const shipped = loadConfig(join(root, 'configs/default.json'));
    assert.equal(shipped.source.kind === 'bag' && shipped.source.path, join(root, 'bags/sample.mcap'));
    assert.equal(shipped.actions.schema, join(root, 'configs/actions/robot-action.schema.json'));
  });

  test('a file that is not JSON, or missing, is a ConfigError too', () => {
    mkdirSync(cache, { recursive: true });
    const file = new URL('broken.json', cache).pathname;
    writeFileSync(file, '{ "clock": ');
    assert.match(issuesOf(file)[0]!, /^: is not valid JSON/);
    assert.match(issuesOf(new URL('missing.json', cache).pathname)[0]!, /^: cannot read the file/);
  });

  test('rejects inputs that are neither a path nor an object', () => {
    assert.throws(() => loadConfig([] as unknown as object), /expected a file path or a config object but received an array/);
  });
});
