// Energy sampler (app/bench/energy.ts): parsers on recorded-format nvidia-smi and tegrastats lines, integration on
// a fake clock, the sampling tools run as child processes (fakes on PATH that print those formats and record
// their arguments), and every "not available" path.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import {
  EnergyMeter,
  PowerIntegrator,
  energyJson,
  parseNvidiaSmiLine,
  parseTegrastatsRails,
  tegrastatsBoardPower,
} from '../../../app/bench/energy.ts';
import { REPO_ROOT, ensureSynthModel } from '../../support/fixtures.ts';

// Lines in the formats the tools print (tegrastats layouts per board and JetPack as NVIDIA documents
// them; values invented).
const TEGRASTATS = {
  /** Orin Nano / NX, JetPack 6: VDD_IN is the module input. */
  orinNano:
    '11-30-2025 10:00:00 RAM 2433/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) CPU [3%@729,1%@729,0%@729,0%@729,off,off] ' +
    'EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305] VIC_FREQ 115 APE 200 cpu@47.5C soc2@46.218C soc0@47.093C gpu@46.25C tj@47.5C soc1@46.468C ' +
    'VDD_IN 5012mW/5012mW VDD_CPU_GPU_CV 636mW/636mW VDD_SOC 1433mW/1433mW',
  /** AGX Orin, JetPack 6: no input rail; the module is GPU+SOC, CPU+CV and the 5 V system rail. */
  agxOrin:
    '11-30-2025 10:00:01 RAM 1402/30697MB (lfb 31x4MB) SWAP 0/15348MB (cached 0MB) CPU [2%@729,0%@729,0%@729,0%@729,off,off,off,off] ' +
    'GR3D_FREQ 61% cpu@44.1C soc2@40.2C soc0@40.8C tj@44.1C soc1@39.9C VDD_GPU_SOC 12480mW/9876mW VDD_CPU_CV 1203mW/998mW VIN_SYS_5V0 3310mW/3120mW',
  /** AGX Orin, JetPack 7 layout: current/average/peak. */
  agxOrin3:
    '11-30-2025 10:00:02 RAM 999/62841MB CPU [0%@729,off] GR3D_FREQ 0% cpu@43.0C tj@42.9C VDD_GPU_SOC 2800mW/2792mW/2950mW VDD_CPU_CV 0mW/0mW/0mW VIN_SYS_5V0 3918mW/3952mW/4019mW',
  /** Thor, JetPack 7: renamed rails, no GR3D utilization. */
  thor:
    '11-30-2025 10:00:03 RAM 4208/125773MB (lfb 31x4MB) SWAP 0/2048MB (cached 0MB) CPU [1%@972,0%@972,0%@972,1%@972] EMC_FREQ 0%@665 ' +
    'GR3D_FREQ @[0,0,0] NVENC0_FREQ @0 VIC off APE 300 cpu@34.468C tj@34.5C soc012@33.781C soc345@34.5C VDD_GPU 21450mW/18000mW VDD_CPU_SOC_MSS 4165mW/4165mW VIN_SYS_5V0 4126mW/4126mW',
  /** Thor on a carrier with an input monitor: VIN is the whole system. */
  thorVin:
    '11-30-2025 10:00:04 RAM 4208/125773MB CPU [1%@972] cpu@34.4C VDD_GPU 21450mW/18000mW VDD_CPU_SOC_MSS 4165mW/4165mW VIN_SYS_5V0 4126mW/4126mW VIN 38210mW/35000mW',
  /** Jetson Nano, JetPack 4: unit-less mW. */
  nanoJp4:
    'RAM 1985/3964MB (lfb 107x4MB) SWAP 0/1982MB (cached 0MB) CPU [9%@1420,off,off,off] EMC_FREQ 0% GR3D_FREQ 0% PLL@32C CPU@35C PMIC@100C GPU@33C POM_5V_IN 2089/2089 POM_5V_GPU 0/0 POM_5V_CPU 541/541',
  /** Xavier's older names: not a rail set we know. */
  xavier:
    'RAM 2031/15692MB (lfb 3048x4MB) CPU [1%@1190,0%@1190] EMC_FREQ 0% GR3D_FREQ 0% AO@36C GPU@36C GPU 0/0 CPU 311/311 SOC 933/933 CV 0/0 VDDRQ 155/155 SYS5V 1400/1400',
};

describe('parsers', () => {
  test('tegrastats rails: current value in mW, any number of /values, JetPack 4 unit-less POM_ rails; RAM, CPU, clocks ignored', () => {
    assert.deepEqual(Object.fromEntries(parseTegrastatsRails(TEGRASTATS.orinNano)), { VDD_IN: 5012, VDD_CPU_GPU_CV: 636, VDD_SOC: 1433 });
    assert.deepEqual(Object.fromEntries(parseTegrastatsRails(TEGRASTATS.agxOrin3)), {
      VDD_GPU_SOC: 2800,
      VDD_CPU_CV: 0,
      VIN_SYS_5V0: 3918,
    });
    assert.deepEqual(Object.fromEntries(parseTegrastatsRails(TEGRASTATS.nanoJp4)), { POM_5V_IN: 2089, POM_5V_GPU: 0, POM_5V_CPU: 541 });
    assert.deepEqual(Object.fromEntries(parseTegrastatsRails(TEGRASTATS.xavier)), {});
  });

  test('board power: the input rail where there is one, else the rails that make up the module', () => {
    const board = (line: string) => tegrastatsBoardPower(parseTegrastatsRails(line));
    assert.deepEqual(board(TEGRASTATS.orinNano), { watts: 5.012, rails: ['VDD_IN'] });
    assert.deepEqual(board(TEGRASTATS.agxOrin), {
      watts: (12480 + 1203 + 3310) / 1000,
      rails: ['VDD_GPU_SOC', 'VDD_CPU_CV', 'VIN_SYS_5V0'],
    });
    assert.deepEqual(board(TEGRASTATS.agxOrin3), { watts: (2800 + 0 + 3918) / 1000, rails: ['VDD_GPU_SOC', 'VDD_CPU_CV', 'VIN_SYS_5V0'] });
    assert.deepEqual(board(TEGRASTATS.thor), { watts: (21450 + 4165 + 4126) / 1000, rails: ['VDD_GPU', 'VDD_CPU_SOC_MSS', 'VIN_SYS_5V0'] });
    assert.deepEqual(board(TEGRASTATS.thorVin), { watts: 38.21, rails: ['VIN'] });
    assert.deepEqual(board(TEGRASTATS.nanoJp4), { watts: 2.089, rails: ['POM_5V_IN'] });
    assert.equal(board(TEGRASTATS.xavier), undefined);
  });

  test('nvidia-smi csv,noheader,nounits: "index, watts"; [N/A] and [Not Supported] are errors, other lines are not samples', () => {
    assert.deepEqual(parseNvidiaSmiLine('0, 113.45'), { gpu: '0', watts: 113.45 });
    assert.deepEqual(parseNvidiaSmiLine('7, 74'), { gpu: '7', watts: 74 });
    assert.deepEqual(parseNvidiaSmiLine('0, [N/A]'), { gpu: '0', error: '[N/A]' });
    assert.deepEqual(parseNvidiaSmiLine('1, [Not Supported]'), { gpu: '1', error: '[Not Supported]' });
    assert.equal(parseNvidiaSmiLine('No devices were found'), undefined);
    assert.equal(parseNvidiaSmiLine(''), undefined);
  });
});

describe('integration on a fake clock (power held from one sample to the next)', () => {
  test('one channel, one window between samples', () => {
    const p = new PowerIntegrator();
    p.add(0, 'gpu0', 10);
    p.add(100, 'gpu0', 20);
    p.add(250, 'gpu0', 5);
    p.begin(50);
    p.end(300);
    // 10 W for 50 ms, 20 W for 150 ms, 5 W for 50 ms.
    assert.deepEqual(p.result(), { joules: 0.5 + 3 + 0.25, seconds: 0.25, samples: 2 });
  });

  test('windows only: the time between them is not counted; channels add up; before the first sample, its value', () => {
    const p = new PowerIntegrator();
    p.add(20, 'gpu0', 100);
    p.add(30, 'gpu1', 50);
    p.add(500, 'gpu0', 200);
    p.begin(0);
    p.end(100); // gpu0 100 W × 0.1 s + gpu1 50 W × 0.1 s
    p.begin(400);
    p.end(600); // gpu0 100 W × 0.1 s + 200 W × 0.1 s, gpu1 50 W × 0.2 s
    const r = p.result()!;
    assert.ok(Math.abs(r.joules - (10 + 5 + 10 + 20 + 10)) < 1e-9, String(r.joules));
    assert.equal(r.seconds, 0.3);
  });

  test('no sample: no result; misuse is refused', () => {
    const p = new PowerIntegrator();
    p.begin(0);
    p.end(10);
    assert.equal(p.result(), undefined);
    assert.throws(() => p.end(20), /end\(\) without begin\(\)/);
    p.begin(30);
    assert.throws(() => p.begin(40), /while a window is open/);
    p.add(5, 'x', 1);
    assert.throws(() => p.add(4, 'x', 1), /time order/);
  });
});

describe('EnergyMeter with the sampling tools as child processes', () => {
  const DIR = join(REPO_ROOT, '.cache', 'test-energy');
  const bin = (name: string) => join(DIR, name);

  /**
   * An executable fake tool in its own folder (the whole PATH of a test, so real tools never interfere): a
   * Node script that records its arguments, then prints `lines` every 20 ms, or runs `script`.
   */
  async function tool(folder: string, name: string, behaviour: { lines: string[] } | { script: string }): Promise<void> {
    const dir = bin(folder);
    await mkdir(dir, { recursive: true });
    const body =
      'lines' in behaviour
        ? `const lines = ${JSON.stringify(behaviour.lines)}; setInterval(() => process.stdout.write(lines.join('\\n') + '\\n'), 20);`
        : behaviour.script;
    await writeFile(
      join(dir, name),
      `#!${process.execPath}\nimport { writeFileSync } from 'node:fs';\nwriteFileSync(process.argv[1] + '.args', process.argv.slice(2).join('\\n'));\n${body}\n`,
    );
    await chmod(join(dir, name), 0o755);
  }

  before(async () => {
    await rm(DIR, { recursive: true, force: true });
    await mkdir(DIR, { recursive: true });
    await writeFile(join(DIR, 'package.json'), '{ "type": "module" }\n');
    await tool('smi', 'nvidia-smi', { lines: ['0, 50.00', '1, 25.50'] });
    await tool('jetson', 'tegrastats', { lines: [TEGRASTATS.agxOrin] });
    await tool('both', 'tegrastats', { lines: [TEGRASTATS.orinNano] });
    await tool('both', 'nvidia-smi', { lines: ['0, [N/A]'] });
    await tool('nodev', 'nvidia-smi', { script: "console.log('No devices were found'); process.exit(6);" });
    await tool('na', 'nvidia-smi', { lines: ['0, [N/A]'] });
    await tool('xavier', 'tegrastats', { lines: [TEGRASTATS.xavier] });
    await tool('rails', 'tegrastats', { lines: ['RAM 1/2MB VDD_FOO 100mW/100mW VDD_BAR 5mW/5mW'] });
    await tool('dies', 'nvidia-smi', {
      script: "console.log('0, 80.00'); setTimeout(() => { console.error('GPU is lost'); process.exit(15); }, 200);",
    });
    await mkdir(bin('empty'), { recursive: true });
  });
  after(async () => rm(DIR, { recursive: true, force: true }));

  async function measure(folder: string, options: Parameters<typeof EnergyMeter.start>[0] = {}, ms = 120) {
    const meter = await EnergyMeter.start({ intervalMs: 20, env: { PATH: bin(folder) }, firstSampleTimeoutMs: 20_000, ...options });
    meter.begin();
    await sleep(ms);
    meter.end();
    return meter.stop();
  }

  test('nvidia-smi: the GPUs CUDA_VISIBLE_DEVICES names, summed; the arguments as one array', { timeout: 30_000 }, async () => {
    const r = await measure('smi', { source: 'nvidia-smi', env: { PATH: bin('smi'), CUDA_VISIBLE_DEVICES: '0,1' } });
    assert.equal(r.available, true, JSON.stringify(r));
    if (!r.available) return;
    assert.ok(Math.abs(r.avgWatts - 75.5) < 1e-9, String(r.avgWatts));
    assert.ok(Math.abs(r.joules - 75.5 * r.seconds) < 1e-9);
    assert.ok(r.seconds >= 0.1);
    assert.match(r.source, /^nvidia-smi power\.draw \(GPU 0, 1\)$/);
    const args = (await readFile(join(bin('smi'), 'nvidia-smi.args'), 'utf8')).split('\n');
    assert.deepEqual(args, ['--query-gpu=index,power.draw', '--format=csv,noheader,nounits', '-lms', '20', '-i', '0,1']);
  });

  test('tegrastats (AGX Orin rails): board power from the module rails; --interval N', { timeout: 30_000 }, async () => {
    const r = await measure('jetson', { source: 'auto', device: 'cpu' });
    assert.equal(r.available, true, JSON.stringify(r));
    if (!r.available) return;
    assert.ok(Math.abs(r.avgWatts - 16.993) < 1e-9, String(r.avgWatts));
    assert.equal(r.source, 'tegrastats VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0');
    assert.deepEqual((await readFile(join(bin('jetson'), 'tegrastats.args'), 'utf8')).split('\n'), ['--interval', '20']);
  });

  test("auto prefers tegrastats where both exist (a Jetson's module power covers CPU and GPU)", { timeout: 30_000 }, async () => {
    const r = await measure('both');
    assert.equal(r.available && r.source, 'tegrastats VDD_IN');
  });

  test('json: tokens per joule for decode, joules per frame for frames', () => {
    const reading = { available: true as const, source: 's', joules: 20, seconds: 2, avgWatts: 10, samples: 40 };
    assert.deepEqual(energyJson(reading, { tokens: 500 }), {
      available: true,
      source: 's',
      joules: 20,
      avg_watts: 10,
      seconds: 2,
      samples: 40,
      tok_per_watt: 25,
    });
    assert.equal(energyJson(reading, { frames: 4 }).joules_per_frame, 5);
    const none = energyJson({ available: false, source: null, reason: 'why' }, { tokens: 500 });
    assert.deepEqual(none, {
      available: false,
      source: null,
      joules: null,
      avg_watts: null,
      seconds: null,
      samples: 0,
      tok_per_watt: null,
      reason: 'why',
    });
  });

  test('bench decode --json: energy over the decode runs, tokens per joule', { timeout: 180_000 }, async () => {
    const model = await ensureSynthModel('gemma4-tiny');
    const bench = async (...extra: string[]) => {
      const { stdout } = await promisify(execFile)(
        process.execPath,
        [
          '--import',
          'tsx',
          'app/cli.ts',
          'bench',
          'decode',
          '-m',
          model,
          '--prompt-tokens',
          '8',
          '--gen-tokens',
          '16',
          '--reps',
          '2',
          '--json',
          ...extra,
        ],
        { cwd: REPO_ROOT, env: { PATH: bin('jetson') }, timeout: 170_000 },
      );
      return JSON.parse(stdout).energy;
    };
    const e = await bench();
    assert.equal(e.available, true, JSON.stringify(e));
    assert.equal(e.source, 'tegrastats VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0');
    assert.ok(Math.abs(e.avg_watts - 16.993) < 1e-9);
    assert.ok(Math.abs(e.joules - 16.993 * e.seconds) < 1e-9);
    assert.ok(Math.abs(e.tok_per_watt - (2 * 16) / e.joules) < 1e-9, 'two runs of 16 tokens, EOS ignored');
    const off = await bench('--energy', 'off');
    assert.deepEqual([off.available, off.joules, off.tok_per_watt], [false, null, null]);
    await assert.rejects(bench('--energy', 'rapl'), /energy source must be one of auto, tegrastats, nvidia-smi, off, got "rapl"/);
  });

  describe('not available, with the reason', () => {
    const unavailable = async (folder: string, options: Parameters<typeof EnergyMeter.start>[0], reason: RegExp) => {
      const r = await measure(folder, options, 10);
      assert.equal(r.available, false, JSON.stringify(r));
      if (!r.available) assert.match(r.reason, reason);
    };
    test('neither tool on PATH', { timeout: 30_000 }, () =>
      unavailable('empty', {}, /tegrastats: not found on PATH; nvidia-smi: not found on PATH/),
    );
    test('nvidia-smi without a GPU', { timeout: 30_000 }, () =>
      unavailable('nodev', { source: 'nvidia-smi' }, /nvidia-smi: No devices were found/),
    );
    test('power.draw not supported', { timeout: 30_000 }, () =>
      unavailable('na', { source: 'nvidia-smi' }, /nvidia-smi: power\.draw of GPU 0 is \[N\/A\]/),
    );
    test('tegrastats without a board-power rail we know', { timeout: 30_000 }, async () => {
      await unavailable('xavier', { source: 'tegrastats' }, /tegrastats: no power rail in its output/);
      await unavailable('rails', { source: 'tegrastats' }, /tegrastats: no known board-power rail among VDD_FOO, VDD_BAR/);
    });
    test('GPU power for a run on the CPU', { timeout: 30_000 }, () =>
      unavailable('smi', { device: 'cpu' }, /nvidia-smi: reports GPU board power, but the measured work runs on the CPU/),
    );
    test('CUDA_VISIBLE_DEVICES hides every GPU', { timeout: 30_000 }, () =>
      unavailable('smi', { source: 'nvidia-smi', env: { PATH: bin('smi'), CUDA_VISIBLE_DEVICES: '' } }, /hides every GPU/),
    );
    test('sampling off', { timeout: 30_000 }, () => unavailable('smi', { source: 'off' }, /off/));
    test('the tool dies during the measurement: no partial number', { timeout: 30_000 }, async () => {
      const r = await measure('dies', { source: 'nvidia-smi' }, 600);
      assert.equal(r.available, false);
      if (!r.available) assert.match(r.reason, /nvidia-smi stopped during the measurement: GPU is lost/);
    });
  });
});
