#!/usr/bin/env node
// percept's command line. Each command imports its implementation lazily, so `percept --help`
// stays fast and a command only loads what it uses (the native addon, onnxruntime, zeromq...).
import { readFileSync } from 'node:fs';
import { Command, InvalidArgumentError, Option } from 'commander';

const { version } = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };

const int =
  (name: string) =>
  (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n)) throw new InvalidArgumentError(`${name} must be an integer, got '${value}'`);
    return n;
  };
/** A virtualServiceSeed: an integer in [0, 2^32). */
const seed =
  (name: string) =>
  (value: string): number => {
    const n = int(name)(value);
    if (n < 0 || n > 0xffffffff) throw new InvalidArgumentError(`${name} must be in [0, 4294967295], got '${value}'`);
    return n;
  };
const bool =
  (name: string) =>
  (value: string): boolean => {
    if (value !== 'true' && value !== 'false') throw new InvalidArgumentError(`${name} must be true or false, got '${value}'`);
    return value === 'true';
  };
const positiveNumber =
  (name: string) =>
  (value: string): number => {
    const n = Number(value);
    if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError(`${name} must be a number > 0, got '${value}'`);
    return n;
  };

/** Prints a result as JSON (--json) or as aligned `key  value` lines. */
function printResult(result: object, json: boolean | undefined): void {
  if (json) {
    process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return;
  }
  const width = Math.max(...Object.keys(result).map((k) => k.length));
  for (const [key, value] of Object.entries(result)) {
    const text =
      typeof value === 'number'
        ? Number.isInteger(value)
          ? String(value)
          : value.toFixed(3)
        : typeof value === 'string'
          ? value
          : JSON.stringify(value);
    process.stdout.write(`${key.padEnd(width)}  ${text}\n`);
  }
}

/** The three ways to speculate, of which a command takes at most one. */
function speculationOptions(command: Command, what: { draft: string; draftMtp: string; ngram: string }): Command {
  return command
    .addOption(new Option('--draft <file>', what.draft).conflicts(['draftMtp', 'ngram']))
    .addOption(new Option('--draft-mtp <file>', what.draftMtp).conflicts(['ngram']))
    .option('--ngram', what.ngram);
}
/** --per-layer-embeddings-on-gpu on|off, for the benches that load the decoder; `prefix` and `suffix` frame its help. */
const perLayerEmbeddingsOption = (prefix: string, suffix = ''): Option =>
  new Option(
    '--per-layer-embeddings-on-gpu <mode>',
    `${prefix}on (Gemma 4's per-layer embedding table on the GPU) or off (in host memory, llama.cpp's place; default: on when every layer is offloaded${suffix})`,
  ).choices(['on', 'off']);

const SPECULATION = {
  draft: 'draft model (same vocabulary), or synth:PRESET',
  draftMtp: 'Gemma 4 MTP assistant GGUF, synth:PRESET or demo:gemma4-robot-assistant',
  ngram: 'n-gram drafting',
};

const program = new Command()
  .name('percept')
  .description(
    'Perception pipeline for robots: camera frames → vision encoder → Gemma decoder → validated actions over ZeroMQ, with per-frame deadlines.',
  )
  .version(version)
  .showHelpAfterError();

program
  .command('run')
  .description('run the pipeline from a config until the source ends, --duration passes, or SIGINT/SIGTERM/SIGHUP')
  .option(
    '-c, --config <file>',
    'pipeline config (JSON, validated against configs/percept.schema.json; default: the embedded configs/default.json)',
  )
  .option(
    '-s, --source <spec>',
    'override the source: pattern[:FPS[:FRAMES]], bag:PATH, folder:PATH, ffmpeg:URL, zmq:ENDPOINT, ros2:TOPIC[:raw]',
  )
  .option('-d, --duration <seconds>', 'stop after this many seconds', positiveNumber('--duration'))
  .option('--json-summary <file>', 'also write the end-of-run summary as JSON to this file')
  .addOption(new Option('--clock <kind>', 'override the clock (virtual: deterministic replay)').choices(['real', 'virtual']))
  .option('--record <file>', 'record the run to this MCAP file: frames, actions, events, stats and a metadata record')
  .option(
    '--metrics <[host:]port>',
    'serve Prometheus metrics, /healthz and /readyz there while the run goes on (host default 127.0.0.1); overrides metrics.endpoint',
  )
  .option(
    '--foxglove [url]',
    'serve a live view (frames, target boxes, actions, stage latencies, events) over the Foxglove WebSocket protocol (default ws://127.0.0.1:8765)',
  )
  .option(
    '--lockstep',
    'lockstep replay on the virtual clock: each frame enters when the previous one has ended (every frame processed, same outputs byte for byte)',
  )
  .action(async (opts) => {
    const { runPipeline } = await import('./run/run.ts');
    const code = await runPipeline(opts);
    process.exitCode = code;
  });

speculationOptions(
  program
    .command('generate')
    .description('generate text (or a schema-constrained JSON action) with the native llama.cpp binding')
    .requiredOption('-m, --model <file>', 'GGUF model, or synth:PRESET')
    .requiredOption('-p, --prompt <text>', 'prompt text (special tokens are parsed)')
    .option('--schema <file>', 'action schema (JSON Schema with an $id): the output is constrained to it'),
  SPECULATION,
)
  .option('-n, --max-tokens <n>', "maximum new tokens (default 128; with --schema the schema's worst case)", int('--max-tokens'))
  .option('--seed <n>', 'sampling seed', int('--seed'), 1)
  .option('--temperature <t>', 'sampling temperature (0 = greedy)', Number, 0)
  .option('--gpu-layers <n>', 'layers to offload to the GPU', int('--gpu-layers'), 0)
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { generate } = await import('./generate.ts');
    const result = await generate({ ...opts, onToken: opts.json ? undefined : (piece: string) => process.stdout.write(piece) });
    if (!opts.json) process.stdout.write('\n');
    printResult(opts.json ? result : { ...result, text: undefined, tokens: undefined }, opts.json);
  });

const bench = program.command('bench').description('benchmarks; every one prints JSON with --json');

speculationOptions(
  bench
    .command('decode')
    .description('decode speed of the native binding (optionally next to llama-bench built from the same source)')
    .requiredOption('-m, --model <file>', 'GGUF model, or synth:PRESET'),
  SPECULATION,
)
  .option('--schema <file>', 'constrain generation to this action schema (structured-action benchmark)')
  .option('--prompt-tokens <n>', 'prompt length', int('--prompt-tokens'), 64)
  .option('--gen-tokens <n>', 'tokens to generate', int('--gen-tokens'), 128)
  .option('--reps <n>', 'repetitions', int('--reps'), 3)
  .option('--gpu-layers <n>', 'layers to offload to the GPU', int('--gpu-layers'), 0)
  .option('--threads <n>', 'CPU threads (default: every core), for both sides with --peer', int('--threads'))
  .option('--peer', 'also run llama-bench from the same llama.cpp build and report the ratio')
  .option('--energy <source>', 'board power sampled during decode: auto, tegrastats, nvidia-smi, off', 'auto')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchDecode } = await import('./bench/decode.ts');
    printResult(await benchDecode(opts), opts.json);
  });

bench
  .command('encode')
  .description('preprocess + vision encoder latency')
  .requiredOption('-e, --encoder <file>', 'vision_encoder.onnx, mmproj .gguf, synth:PRESET or synth:PRESET-mmproj')
  .option('--ep <provider>', 'execution provider: cpu, cuda, tensorrt (for an mmproj, cuda runs llama.cpp clip on the GPU)', 'cpu')
  .option('--image <file>', 'input image (default: a generated 1280×720 JPEG)')
  .option('--image-tokens <n>', 'Gemma 4 image-token budget', int('--image-tokens'), 280)
  .option('--iterations <n>', 'timed iterations', int('--iterations'), 20)
  .option('--threads <n>', 'CPU threads for preprocessing (libvips) and the CPU encoder; 1 measures one core', int('--threads'))
  .addOption(
    new Option(
      '--profile <mode>',
      "mmproj: where each encode's time goes (phases: setup vs compute; ops: per op type, slows the run)",
    ).choices(['phases', 'ops']),
  )
  .addOption(
    new Option(
      '--flash-attention <mode>',
      "mmproj: flash attention (auto: percept's kernel on CUDA; padded: ggml's, heads zero-padded to a tensor-core size)",
    ).choices(['auto', 'on', 'off', 'padded', 'percept']),
  )
  .option('--batch <n>', 'mmproj: also time N same-size frames in one encode call', int('--batch'))
  .addOption(
    new Option('--path <graph>', "mmproj: percept's persistent graph over clip's weights, or clip's own encode").choices([
      'percept',
      'clip',
    ]),
  )
  .option(
    '--check',
    "mmproj: encode the last frame through the other path too and report the worst per-token cosine, with the tower's own sensitivity (1 value in 97 moved by 1e-6) as the baseline",
  )
  .option('--no-pinned-pixels', "mmproj: pixel arrays in ordinary (pageable) memory, not the GPU's pinned host memory (to compare)")
  .option(
    '--jpeg-decode <where>',
    'auto (default): an mmproj on CUDA decodes, resizes and lays out JPEG frames on the GPU (nvJPEG); host: libvips decodes them on the CPU',
  )
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchEncode } = await import('./bench/encode.ts');
    printResult(await benchEncode(opts), opts.json);
  });

speculationOptions(
  bench
    .command('frame')
    .description('camera frame → validated action through the real stages (no publisher): latency p50/p99')
    .requiredOption('-m, --model <file>', 'decoder GGUF, or synth:PRESET (with --decoder openai: the model id the server serves)'),
  SPECULATION,
)
  .option('-e, --encoder <file>', 'vision encoder: .onnx, mmproj .gguf, or "projection"', 'projection')
  .addOption(
    new Option('--decoder <kind>', 'local: the in-process binding; openai: the server at --endpoint')
      .choices(['local', 'openai'])
      .default('local'),
  )
  .option('--endpoint <url>', 'with --decoder openai: the OpenAI-compatible server (http://host:port)')
  .option('--concurrency <n>', 'with --decoder openai: requests in flight', int('--concurrency'), 1)
  .option('--image-tokens <n>', 'image tokens per frame (Gemma 4 budget)', int('--image-tokens'), 280)
  .option('--frames <n>', 'frames', int('--frames'), 20)
  .option('--fps <n>', 'frame rate (keep it below what the pipeline sustains)', positiveNumber('--fps'), 2)
  .option('--max-new-tokens <n>', "max new tokens per action (default: the action schema's worst case)", int('--max-new-tokens'))
  .option('--threads <n>', "llama.cpp's CPU threads for the decoder (decoder.threads; default every core)", int('--threads'))
  .addOption(perLayerEmbeddingsOption('decoder.perLayerEmbeddingsOnGpu: '))
  .option(
    '--step-tokens <n>',
    'tokens per decode step, padded so every step has one shape (decoder.stepTokens; default 1: no padding)',
    int('--step-tokens'),
  )
  .option(
    '--graph-slots <n>',
    "built decode graphs kept besides the current one, each reused when its step shape comes again (decoder.graphSlots; 0: llama.cpp's last graph only; default: the config's)",
    int('--graph-slots'),
  )
  .addOption(
    new Option(
      '--cuda-graphs <mode>',
      "decoder.cudaGraphs: on (ggml-cuda's CUDA graphs, one per step shape) or off (default: the config's)",
    ).choices(['on', 'off']),
  )
  .addOption(
    new Option(
      '--mixed-prefill <mode>',
      "decoder.mixedPrefill: on (a causal Gemma 4 image and the text after it in one decode) or off (default: the config's)",
    ).choices(['on', 'off']),
  )
  .option(
    '--jpeg-decode <where>',
    'preprocess.jpegDecode: auto (default) decodes JPEG frames on the encoder GPU where it can (nvJPEG); host: libvips',
  )
  .option('--gpu-layers <n>', 'decoder layers on the GPU', int('--gpu-layers'), 0)
  .option('--no-warmup', 'skip the warm-up at load (to see what the first frame pays without it)')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchFrame } = await import('./bench/frame.ts');
    printResult(await benchFrame(opts), opts.json);
  });

bench
  .command('remote')
  .description(
    'the HTTP path against the in-process binding: llama-server (same build, model, mmproj, image tokens) on loopback, rounds of bench frame alternating the two',
  )
  .requiredOption('-m, --model <file>', 'decoder GGUF, or synth:PRESET')
  .requiredOption('-e, --encoder <file>', 'the vision projector for both: mmproj .gguf or synth:PRESET-mmproj')
  .option('--image-tokens <n>', 'image tokens per frame, both arms', int('--image-tokens'), 280)
  .option('--frames <n>', 'frames per round and arm', int('--frames'), 10)
  .option('--rounds <n>', 'rounds (each runs both arms, in alternating order)', int('--rounds'), 4)
  .option('--fps <n>', 'frame rate (keep it below what both sustain)', positiveNumber('--fps'), 1)
  .option('--max-new-tokens <n>', "max new tokens per action (default: each decoder's own)", int('--max-new-tokens'))
  .option('--gpu-layers <n>', 'decoder layers on the GPU, both arms', int('--gpu-layers'), 0)
  .option('--threads <n>', 'llama-server threads (default: all cores, as the binding)', int('--threads'))
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchRemote } = await import('./bench/remote.ts');
    printResult(await benchRemote(opts), opts.json);
  });

bench
  .command('cameras')
  .description(
    'N cameras at F fps each through the real stages on one shared encoder and batched decoder: per-camera p50/p99, drops, actions/s, tok/s',
  )
  .option('--cameras <n>', 'cameras (test-pattern sources started together)', int('--cameras'), 4)
  .option('--fps <n>', 'frames per second of each camera', positiveNumber('--fps'), 10)
  .option('-m, --model <file>', 'decoder GGUF, or synth:PRESET', 'synth:gemma4-tiny')
  .option('-e, --encoder <file>', 'vision encoder: .onnx, mmproj .gguf, or "projection"', 'projection')
  .option('--gpu-layers <n>', 'decoder layers on the GPU (and clip on the GPU when not 0)', int('--gpu-layers'), 0)
  .option('--seconds <s>', 'how long each camera sends frames', positiveNumber('--seconds'), 10)
  .option('--image-tokens <n>', 'image tokens per frame (Gemma 4 budget)', int('--image-tokens'), 280)
  .option('--budget-ms <ms>', "each frame's deadline after capture", positiveNumber('--budget-ms'), 1000)
  .option(
    '--kv-unified <bool>',
    'one KV buffer for every camera (true, the default) or one stream per camera (false)',
    bool('--kv-unified'),
  )
  .option(
    '--no-drop-predicted-miss',
    'decode every frame not yet late (default: drop one before preprocess when the decoder predicts it misses)',
  )
  .option(
    '--no-drop-predicted-conflation',
    "encode every frame (default: drop one before preprocess when its camera's next frame would replace it at decode anyway)",
  )
  .option(
    '--admit <how>',
    "together: a group of arrivals at a time (the default); rolling: together, the group's tail takes the next in; adaptive: together, the tail takes them in when predicted to pay; each: one at a time (batching.admit)",
  )
  .option(
    '--prefill-chunk <n>',
    'with --admit each: prompt positions read per decode step (default: the config default)',
    int('--prefill-chunk'),
  )
  .option('--max-active <n>', 'cameras decoded together at most (default: all)', int('--max-active'))
  .option('--threads <n>', "llama.cpp's CPU threads for the decoder (decoder.threads; default every core)", int('--threads'))
  .addOption(perLayerEmbeddingsOption('decoder.perLayerEmbeddingsOnGpu: '))
  .option(
    '--lanes <n>',
    'decoder contexts the cameras are spread over, each batched on its own (batching.lanes; default 1)',
    int('--lanes'),
  )
  .option('--encode-wait-ms <ms>', 'how long an idle encoder may hold a frame for the other cameras', Number)
  .option('--group-wait-ms <ms>', 'admitting together: how long an idle decoder may hold a group for frames on their way', Number)
  .option(
    '--rolling-join <n>',
    "with --admit rolling: the fewest waiting frames that go in beside a group's tail (batching.rollingJoin; default 1)",
    int('--rolling-join'),
  )
  .addOption(
    new Option(
      '--join-running <mode>',
      "batching.joinRunning: on (a frame that would miss waiting for the running group joins it at once) or off (it is dropped) (default: the config's, on)",
    ).choices(['on', 'off']),
  )
  .option(
    '--step-rows <n>',
    'a row for every camera in each token decode, rows padded to a multiple of N, so llama.cpp reuses its graph (batching.stepRows; default 0: off)',
    int('--step-rows'),
  )
  .addOption(
    new Option(
      '--mix-steps <mode>',
      "batching.mixSteps: on (a step's causal image rows and its token rows in one decode) or off (default: the config's, off)",
    ).choices(['on', 'off']),
  )
  .option(
    '--step-tokens <n>',
    'tokens per camera and decode step, padded (decoder.stepTokens; default 1: no padding)',
    int('--step-tokens'),
  )
  .option('--no-jump-forward', "decode the grammar's forced tokens one per step (keeps the batch's shape, so llama.cpp reuses its graph)")
  .option('--no-ceiling', "skip the engine's ceiling for the run's shape, measured after the run (ceiling_actions_per_s, ceiling_share)")
  .option('--ceiling-ubatch <n>', 'prefill ubatch of the ceiling at most (default 4096; it is min(this, N×P))', int('--ceiling-ubatch'))
  .option('--peer', 'also measure the ceiling with llama-batched-bench from the same llama.cpp build')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchCameras } = await import('./bench/cameras.ts');
    printResult(await benchCameras(opts), opts.json);
  });

bench
  .command('batch')
  .description(
    'the batched decoder alone: B sequences of P prompt and T new tokens at once (as llama-batched-bench), aggregate tok/s per B',
  )
  .option('-m, --model <file>', 'decoder GGUF, or synth:PRESET', 'synth:gemma4-tiny')
  .option('--sequences <list>', 'sequence counts, comma-separated', '1,2,4')
  .option('--prompt-tokens <n>', 'prompt tokens per sequence', int('--prompt-tokens'), 256)
  .option('--gen-tokens <n>', 'new tokens per sequence', int('--gen-tokens'), 128)
  .option('--gpu-layers <n>', 'layers on the GPU', int('--gpu-layers'), 0)
  .option('--kv-unified', 'one KV buffer for every sequence (default: one stream per sequence)')
  .option('--threads <n>', 'CPU threads', int('--threads'))
  .addOption(perLayerEmbeddingsOption('', '; the peer gets the same `-ot`'))
  .addOption(
    new Option('--backend-sampling <mode>', "on (default): each row's argmax in llama.cpp's graph; off: on the host").choices([
      'on',
      'off',
    ]),
  )
  .option('--peer', 'also run llama-batched-bench from the same llama.cpp build and report the ratio')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchBatch } = await import('./bench/batch.ts');
    const sequences = String(opts.sequences)
      .split(',')
      .map((x) => Number(x.trim()));
    printResult(await benchBatch({ ...opts, sequences }), opts.json);
  });

bench
  .command('ladder')
  .description(
    'the deployment table, rung by rung (F16 → Q8_0 → Q4_K_M → + speculative): size, speed, TTFT, KV, agreement with F16, roofline, bag p99, energy',
  )
  .requiredOption('-m, --model <file>', 'reference: an unquantized GGUF (F32/F16/BF16), or synth:PRESET (made in F16)')
  .option(
    '--quants <list>',
    'rungs below the reference, comma-separated: q8_0, q4_0, q4_k_m, or GGUF files quantized elsewhere',
    'q8_0,q4_k_m',
  )
  .option(
    '--draft <file>',
    'draft of the speculative rung on the last one: a same-vocabulary GGUF or a Gemma 4 MTP assistant (synth:PRESET too)',
  )
  .option('--bag <file>', 'replay this bag through the real stages: end-to-end p99 and joules per frame per rung')
  .option(
    '-c, --config <file>',
    'config whose stages the bag runs through, each rung as its decoder (default: the embedded configs/default.json)',
  )
  .option('-e, --encoder <spec>', "vision encoder of the bag run instead of the config's: .onnx, mmproj .gguf, synth:PRESET or projection")
  .option('--quantizer <kind>', 'auto (llama-quantize when built, else percept), percept, llama-quantize', 'auto')
  .option('--out-dir <dir>', 'where rung files are made (reused by later runs)')
  .option('--prompt-tokens <n>', 'prefill length of the decode benchmark', int('--prompt-tokens'), 64)
  .option('--gen-tokens <n>', 'tokens generated by the decode benchmark', int('--gen-tokens'), 128)
  .option('--reps <n>', 'decode benchmark repetitions', int('--reps'), 3)
  .option('--agreement-tokens <n>', 'greedy tokens per agreement prompt', int('--agreement-tokens'), 32)
  .option('--kv-ctx <list>', 'contexts of the KV columns, comma-separated (default 4096,32768,131072 up to the trained context)')
  .addOption(
    new Option('--bandwidth-gbs <x>', 'memory bandwidth for the roofline, GB/s')
      .argParser(positiveNumber('--bandwidth-gbs'))
      .conflicts('device'),
  )
  .option('--device <name>', 'bandwidth preset: jetson-orin-nano-8gb, jetson-agx-orin, jetson-thor, h100, h200')
  .option('--gpu-layers <n>', 'layers to offload to the GPU', int('--gpu-layers'), 0)
  .option('--energy <source>', 'board power: auto, tegrastats, nvidia-smi, off', 'auto')
  .option('--no-progress', 'no progress bars on stderr')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchLadder, formatLadderTable } = await import('./bench/ladder.ts');
    const list = (text: string | undefined) =>
      text
        ?.split(',')
        .map((x) => x.trim())
        .filter(Boolean);
    const kvCtx = list(opts.kvCtx)?.map((x) => int('--kv-ctx')(x));
    const result = await benchLadder({ ...opts, quants: list(opts.quants), kvCtx });
    process.stdout.write(opts.json ? `${JSON.stringify(result, null, 2)}\n` : formatLadderTable(result));
    if (result.failed > 0) process.exitCode = 1;
  });

bench
  .command('graph')
  .description('per-hop overhead of the graph runtime with no-op stages')
  .option('--hz <n>', 'frame rate', int('--hz'), 1000)
  .option('--frames <n>', 'frames', int('--frames'), 5000)
  .option('--stages <n>', 'no-op stages', int('--stages'), 5)
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchGraph } = await import('./bench/graph.ts');
    printResult(await benchGraph(opts), opts.json);
  });

bench
  .command('publish')
  .description('ZeroMQ publish → receive throughput and latency on loopback')
  .option('--messages <n>', 'messages', int('--messages'), 100000)
  .option('--size <bytes>', 'body size', int('--size'), 256)
  .addOption(
    new Option('--subscriber <kind>', 'the receiving peer: zeromq.js in a worker thread, or pyzmq in a Python process (python3-zmq)')
      .choices(['zeromq', 'pyzmq'])
      .default('zeromq'),
  )
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchPublish } = await import('./bench/publish.ts');
    printResult(await benchPublish(opts), opts.json);
  });

bench
  .command('bag')
  .description(
    'bag replay read throughput (1080p JPEG, ROS 2 CompressedImage; @mcap/core as the peer) and recording throughput at 1080p 30 fps',
  )
  .option('--frames <n>', 'frames in the replay bag', int('--frames'), 300)
  .option('--width <px>', 'frame width', int('--width'), 1920)
  .option('--height <px>', 'frame height', int('--height'), 1080)
  .option('--fps <n>', 'recording rate', positiveNumber('--fps'), 30)
  .option('--seconds <s>', 'recording duration', positiveNumber('--seconds'), 5)
  .option('--reps <n>', 'replay passes (median reported)', int('--reps'), 3)
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchBag } = await import('./bench/bag.ts');
    printResult(await benchBag(opts), opts.json);
  });

bench
  .command('frame-input')
  .description('a pusher → the ZeroMQ frame input on loopback: JPEG frames at a fixed rate; drops and the added latency p50/p99')
  .option('--fps <n>', 'frames per second', positiveNumber('--fps'), 30)
  .option('--seconds <n>', 'how long to push', positiveNumber('--seconds'), 10)
  .option('--width <n>', 'frame width', int('--width'), 1280)
  .option('--height <n>', 'frame height', int('--height'), 720)
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { benchFrameInput } = await import('./bench/frame-input.ts');
    printResult(await benchFrameInput(opts), opts.json);
  });

const models = program.command('models').description('synthetic checkpoints (random weights, real shapes, real Gemma 4 tokenizer)');
models
  .command('synth')
  .description('write a synthetic checkpoint: a decoder GGUF or a vision encoder ONNX (idempotent, seeded)')
  .requiredOption('--preset <name>', 'preset (see `percept models list`)')
  .requiredOption('-o, --out <file>', 'output file')
  .option('--wtype <type>', 'weight type: f32, f16, q8_0, q4_0, q4_k for a decoder (default q8_0); f32 or f16 for an mmproj (default f32)')
  .option('--seed <n>', 'random seed', int('--seed'), 1)
  .action(async (opts) => {
    const { synthesizeAny } = await import('./model-commands.ts');
    printResult(await synthesizeAny(opts), false);
  });
models
  .command('list')
  .description('list the synthetic presets')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { listAllPresets } = await import('./model-commands.ts');
    const presets = await listAllPresets();
    if (opts.json) process.stdout.write(`${JSON.stringify(presets, null, 2)}\n`);
    else for (const p of presets) process.stdout.write(`${p.name.padEnd(24)} ${p.description}\n`);
  });

const calc = program
  .command('calc')
  .description("calculators over a GGUF's metadata (no weights loaded; synth:PRESET is described in memory)");
calc
  .command('kv')
  .description('KV-cache bytes at a context, sized as llama.cpp sizes it (sliding-window, full and KV-shared layers)')
  .requiredOption('-m, --model <file>', 'GGUF model, or synth:PRESET[?wtype=…]')
  .requiredOption('--ctx <n>', 'context per sequence, tokens', int('--ctx'))
  .option('--batch <n>', 'sequences in parallel (llama.cpp -np)', int('--batch'), 1)
  .option('--kv-type <type>', 'cache type: f16, bf16, f32, q8_0, q4_0', 'f16')
  .option('--ubatch <n>', 'physical batch (the sliding cache keeps window + ubatch cells)', int('--ubatch'), 512)
  .option('--swa-full', "sliding layers keep the whole context (llama.cpp --swa-full; percept's decoder runs this way)")
  .option('--no-flash-attn', 'flash attention off (V stored transposed, widened to the largest head)')
  .option('--unified', 'one cache shared by all sequences (llama.cpp --kv-unified)')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { calcKv } = await import('./calc-commands.ts');
    printResult(await calcKv(opts), opts.json);
  });
calc
  .command('roofline')
  .description('decode bandwidth ceiling: bytes read per token (weights touched + KV attended) → the most tok/s')
  .requiredOption('-m, --model <file>', 'GGUF model, or synth:PRESET[?wtype=…]')
  .addOption(new Option('--bandwidth-gbs <x>', 'memory bandwidth, GB/s').argParser(positiveNumber('--bandwidth-gbs')).conflicts('device'))
  .option(
    '--device <name>',
    'bandwidth preset: jetson-orin-nano-8gb (68 GB/s), jetson-agx-orin (204.8), jetson-thor (273), h100 (3350), h200 (4800)',
  )
  .option('--measured-tok-s <y>', 'a measured decode rate to place against the ceiling', positiveNumber('--measured-tok-s'))
  .option('--ctx <n>', 'context the decoded tokens attend (adds KV reads; 0 = weights only)', int('--ctx'), 0)
  .option('--batch <n>', 'sequences decoded together (weights read once per step)', int('--batch'), 1)
  .option('--kv-type <type>', 'cache type: f16, bf16, f32, q8_0, q4_0', 'f16')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { calcRoofline } = await import('./calc-commands.ts');
    printResult(await calcRoofline(opts), opts.json);
  });

program
  .command('eval')
  .description(
    'replay a bag in lockstep, record it, and measure it: metrics.json and report.html (valid rate, accuracy vs labels, deadline misses, drops, latency modelled on the virtual clock)',
  )
  .requiredOption('-b, --bag <file>', 'the bag (MCAP) to replay')
  .option('-c, --config <file>', 'pipeline config (default: the embedded configs/default.json)')
  .option('-l, --labels <file>', 'expected actions, JSON lines (default: <bag>.labels.jsonl when it exists)')
  .option(
    '--reference <config>',
    'a second config (e.g. the F16 decoder) replayed on the same bag: the report gives the token agreement of the two',
  )
  .requiredOption('-o, --out <dir>', 'output folder: metrics.json, report.html and the recordings')
  .option(
    '--calibration <file>',
    "stage costs from a calibration file written by percept calibrate, in place of the config's virtualServiceMs",
  )
  .option('--seed <n>', "seeds the draws from the calibrated distributions (default: the config's virtualServiceSeed)", seed('--seed'))
  .option(
    '--fail-under <limits>',
    'exit 2 when a metric is on the wrong side: valid=0.99,accuracy=0.8,iou=0.5,agreement=0.9 (minimums), miss=0.05 (maximum)',
  )
  .option('--no-progress', 'no progress bar')
  .option('--json', 'print metrics.json')
  .action(async (opts) => {
    const { evaluate } = await import('./eval/eval.ts');
    const { code, metrics } = await evaluate(opts);
    if (opts.json) process.stdout.write(`${JSON.stringify(metrics, null, 2)}\n`);
    else {
      const pct = (v: number | null | undefined) => (v === null || v === undefined ? '-' : `${(v * 100).toFixed(2)} %`);
      printResult(
        {
          frames: `${metrics.frames.in} in, ${metrics.frames.out} out`,
          valid: pct(metrics.validRate),
          accuracy: pct(metrics.accuracy?.action),
          miss: pct(metrics.deadlineMissRate),
          ...(metrics.tokens ? { agreement: pct(metrics.tokens.tokenAgreement) } : {}),
          latencies: metrics.timing.summary,
          report: `${opts.out}/report.html`,
        },
        false,
      );
    }
    process.exitCode = code;
  });

program
  .command('compare')
  .description('two eval outputs side by side (folders or metrics.json files), with B − A')
  .argument('<a>', 'the first eval output')
  .argument('<b>', 'the second eval output')
  .option('--json', 'print JSON')
  .action(async (a: string, b: string, opts) => {
    const { compare, formatComparison } = await import('./eval/eval.ts');
    const comparison = compare(a, b);
    process.stdout.write(opts.json ? `${JSON.stringify(comparison, null, 2)}\n` : formatComparison(comparison));
  });

program
  .command('trace')
  .description('convert a recording into a Chrome trace (JSON) that Perfetto and chrome://tracing open: a track per camera and stage')
  .argument('<recording>', 'a recording made with percept run --record or percept eval (MCAP)')
  .option('-o, --out <file>', 'the trace to write (default: the recording with .trace.json)')
  .option('--json', 'print JSON')
  .action(async (recording: string, opts) => {
    const { traceRecording } = await import('./trace.ts');
    const { warnings, ...result } = await traceRecording({ recording, out: opts.out });
    for (const warning of warnings) process.stderr.write(`percept: ${warning}\n`);
    printResult(result, opts.json);
  });

program
  .command('calibrate')
  .description(
    "measure each stage's service times per ladder level on this machine; write their distributions to a calibration file a config names in virtualServiceMs",
  )
  .option('-c, --config <file>', 'pipeline config (default: the embedded configs/default.json)')
  .option('-s, --source <spec>', 'where the frames come from (default: the config source): pattern[:FPS[:FRAMES]], bag:PATH, folder:PATH')
  .option('--frames <n>', 'frames timed per level', int('--frames'), 10)
  .requiredOption('-o, --out <file>', 'the calibration file to write (JSON)')
  .option('--json', 'print the calibration file')
  .action(async (opts) => {
    const { calibrate } = await import('./eval/calibrate.ts');
    // A terminal gets one line redrawn; a pipe or file gets a line a level, without carriage returns.
    const tty = process.stderr.isTTY === true;
    const file = await calibrate({
      ...opts,
      onProgress: (done, total) => {
        if (tty) process.stderr.write(`\rpercept: calibrate ${done}/${total} frames${done === total ? '\n' : ''}`);
        else if (done === total || done % opts.frames === 0) process.stderr.write(`percept: calibrate ${done}/${total} frames\n`);
      },
    });
    if (opts.json) process.stdout.write(`${JSON.stringify(file, null, 2)}\n`);
    else printResult({ out: opts.out, frames: file.frames, levels: file.levels.length, ...file.medianMs }, false);
  });

program
  .command('tune')
  .description(
    'sweep knobs on a bag (virtual clock from calibrated costs, or real runs), print the Pareto table and write the config the objective picks, with a degrade ladder',
  )
  .requiredOption('-b, --bag <file>', 'the bag (MCAP) to replay')
  .requiredOption('--budget-ms <ms>', 'the end-to-end latency budget', positiveNumber('--budget-ms'))
  .option('--grid <file>', 'the knobs and values to sweep (configs/tune-grid.schema.json; default: the ladder knobs of the config)')
  .option(
    '--objective <spec>',
    "what picks the point, e.g. 'max accuracy s.t. p99<=budget, drop<=0.05' (default: that, with the best quality measurable)",
  )
  .option('-l, --labels <file>', 'expected actions, JSON lines (default: <bag>.labels.jsonl when it exists)')
  .option('--reference <config>', 'a config whose decoder is the reference (e.g. F16): token agreement with it per point')
  .option('-c, --config <file>', 'the base config (default: the embedded configs/default.json)')
  .addOption(new Option('--virtual', 'virtual clock: stage costs from calibration files (the default when one is given)').conflicts('real'))
  .option('--real', 'real stages on the real clock, the bag at its recorded pace')
  .option('--calibration <file...>', 'calibration files written by percept calibrate (default: the one the config names)')
  .option(
    '--seed <n>',
    "virtual mode: seeds the draws from the calibrated distributions (default: the config's virtualServiceSeed)",
    seed('--seed'),
  )
  .addOption(
    new Option('--pace <pace>', 'virtual mode: lockstep, or the recorded pace (edge policies matter)').choices(['lockstep', 'recorded']),
  )
  .requiredOption('-o, --out <file>', 'the tuned config to write (and NAME.tune-state.json next to it, for resuming)')
  .option('--no-progress', 'no progress bar')
  .option('--json', 'print the result as JSON')
  .action(async (opts) => {
    const { failedPoints, formatTune, tune, TuneInterrupted } = await import('./tune/tune.ts');
    try {
      const result = await tune({ ...opts, mode: opts.virtual ? 'virtual' : opts.real ? 'real' : undefined });
      process.stdout.write(opts.json ? `${JSON.stringify(result, null, 2)}\n` : formatTune(result));
      // A point that failed is a sweep not done, as in bench ladder: exit 1, saying which and why.
      const failed = failedPoints(result);
      for (const line of failed) process.stderr.write(`percept: tune point failed: ${line.replace(/\s*\n\s*/g, ' ')}\n`);
      if (failed.length > 0) {
        process.stderr.write(`percept: ${failed.length} of ${result.points.length} points failed (a rerun tries them again)\n`);
        process.exitCode = 1;
      } else if (!result.chosen) process.exitCode = 2;
    } catch (err) {
      if (!(err instanceof TuneInterrupted)) throw err;
      process.stderr.write(`percept: ${err.message}\n`);
      // The shell's 128 + the signal: 130 for Ctrl-C, 143 for a kill.
      process.exitCode = err.signal === 'SIGTERM' ? 143 : 130;
    }
  });

program
  .command('echo')
  .description('print what a running percept publishes: actions (validated, with age and staleness), events, telemetry; seq gaps on stderr')
  .option('--connect <endpoint>', "the publisher's endpoint", 'tcp://127.0.0.1:5556')
  .option('--topic <topic...>', 'topics: actions, events, telemetry', ['actions'])
  .option('--json', 'one JSON line per message: {"header": …, "body": …}')
  .option('--schema <file>', 'the action schema (default: configs/actions/robot-action.schema.json)')
  .option('--server-key <file>', "the publisher's CURVE public key, when it encrypts")
  .option('--count <n>', 'exit after this many messages', int('--count'))
  .option('--keep-going', "go on past a run's end event (by default echo exits with the run)")
  .action(async (opts) => {
    const { echo } = await import('./echo.ts');
    process.exitCode = await echo(opts);
  });

program
  .command('keys')
  .description('write a CURVE key pair: NAME.key (secret, for the config) and NAME.pub (public, for subscribers)')
  .requiredOption('-o, --out <dir>', 'folder for the two files')
  .option('--name <name>', 'file name stem', 'server')
  .option('--force', 'replace existing files')
  .action(async (opts) => {
    const { writeKeyPair } = await import('./keys.ts');
    printResult(writeKeyPair(opts), false);
  });

program
  .command('doctor')
  .description('check the installation: Node, the native addon, onnxruntime, sharp, zeromq, configs')
  .option('--json', 'print JSON')
  .action(async (opts) => {
    const { doctor } = await import('./doctor.ts');
    const report = await doctor();
    printResult(report, opts.json);
    if (Object.values(report).some((v) => typeof v === 'string' && v.startsWith('FAIL'))) process.exitCode = 1;
  });

program.parseAsync(process.argv).catch((err: unknown) => {
  const message = err instanceof Error ? err.message : String(err);
  process.stderr.write(`percept: ${message}\n`);
  if (process.env.PERCEPT_DEBUG && err instanceof Error) process.stderr.write(`${err.stack}\n`);
  process.exitCode = 1;
});
