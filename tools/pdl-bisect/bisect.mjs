#!/usr/bin/env node
// Finds which kernels, launched with programmatic dependent launch (PDL), make CUDA-graph decode steps give
// other logits than the same steps launched kernel by kernel. Needs a CUDA build with diag-logits.diff applied
// to native/src and ggml-cuda-pdl-deny.diff to build/llama.cpp (README.md). Each run is diag.ts in a process
// of its own; runs compare the per-call logit hashes with a run without graphs.
//   node tools/pdl-bisect/bisect.mjs            list the PDL kernels, then halve them down to a set that alone
//                                               still gives the mismatch, then try each kernel family out of PDL
//   node tools/pdl-bisect/bisect.mjs --check    graphs off twice, ggml-cuda's graphs, shape graphs (with and
//                                               without graph slots): as built
// Results go to stdout and, with $OUT set, $OUT/bisect.log.
import { spawnSync } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const log = (line) => {
  console.log(line);
  if (process.env.OUT) appendFileSync(join(process.env.OUT, 'bisect.log'), `${line}\n`);
};

/** One diag.ts run (graphSlots: ContextOptions.graphSlots): its llama_decode logit hashes and stderr. */
function diag(mode, env, graphSlots = 0) {
  const r = spawnSync(process.execPath, ['--import', 'tsx', join(here, 'diag.ts'), mode, '3', String(graphSlots)], {
    env: { ...process.env, PERCEPT_DIAG: '1', ...env },
    encoding: 'utf8',
    maxBuffer: 1 << 28,
  });
  if (r.status !== 0)
    throw new Error(`diag ${mode} ${JSON.stringify(env)} exited ${r.status}: ${r.stderr.split('\n').slice(-4).join(' | ')}`);
  const calls = r.stderr
    .split('\n')
    .filter((l) => l.startsWith('D '))
    .map((l) => l.replace(/ reuse=\d/, ''));
  return { calls, stderr: r.stderr };
}

const reference = diag('plain', { GGML_CUDA_DISABLE_GRAPHS: '1' }).calls;
// No hashes: the addon was built without diag-logits.diff, and every comparison would pass on nothing.
if (reference.length === 0) throw new Error('no logit hashes on stderr: build with tools/pdl-bisect/diag-logits.diff applied (README.md)');
log(`graphs off: ${reference.length} llama_decode calls (the reference)`);

/** Index of the first call whose logits differ from the reference, or -1. */
function firstDifference(calls) {
  let k = 0;
  while (k < calls.length && calls[k] === reference[k]) k++;
  return k === calls.length && calls.length === reference.length ? -1 : k;
}

function report(name, mode, env, graphSlots = 0) {
  const k = firstDifference(diag(mode, env, graphSlots).calls);
  log(`${name}: ${k < 0 ? 'equal to graphs off' : `first differing call ${k}`}`);
  return k >= 0;
}

if (process.argv.includes('--check')) {
  report('graphs off, again', 'plain', { GGML_CUDA_DISABLE_GRAPHS: '1' });
  report("ggml-cuda's graphs", 'plain', {});
  report('shape graphs', 'shape', {});
  report('shape graphs, 4 graph slots', 'shape', {}, 4);
  report("ggml-cuda's graphs, GGML_CUDA_PDL=0", 'plain', { GGML_CUDA_PDL: '0' });
} else {
  const listed = diag('plain', { GGML_CUDA_PDL_LOG: '1' }).stderr;
  const kernels = [
    ...new Set(
      listed
        .split('\n')
        .filter((l) => l.startsWith('pdl 1 '))
        .map((l) => l.slice(6)),
    ),
  ];
  log(`${kernels.length} kernels launched with PDL`);
  // Kernel names are mangled; GGML_CUDA_PDL_DENY matches parts of them, so a whole name denies one kernel.
  const onlyThese = (set) => ({ GGML_CUDA_PDL_DENY: kernels.filter((k) => !set.includes(k)).join(',') });
  const name = (k) => k.slice(0, 60);
  let suspects = kernels;
  while (suspects.length > 1) {
    const a = suspects.slice(0, suspects.length >> 1);
    const b = suspects.slice(suspects.length >> 1);
    if (report(`only ${a.length} from ${name(a[0])} with PDL`, 'plain', onlyThese(a))) suspects = a;
    else if (report(`only ${b.length} from ${name(b[0])} with PDL`, 'plain', onlyThese(b))) suspects = b;
    else break; // neither half alone: kernels of both halves together
  }
  log(`a set that alone gives the mismatch (${suspects.length}):\n  ${suspects.join('\n  ')}`);
  for (const family of [
    'flash_attn',
    'mul_mat_vec',
    'quantize',
    'rms_norm',
    'rope',
    'get_rows',
    'set_rows',
    'bin_bcast',
    'unary',
    'cpy',
    'scale',
    'soft_max',
    'mul_mat_q',
  ])
    report(`${family} out of PDL`, 'plain', { GGML_CUDA_PDL_DENY: family });
}
