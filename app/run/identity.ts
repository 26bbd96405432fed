// What makes a run is its config, the bytes of its input and models (seeds included), the action schema
// and percept's version. A recording's `percept.run` metadata holds it.
// On a virtual clock it also names the run, since a replay's outputs are a function of exactly these.
// The same replay twice gets the same id, and a replay of another input, model or config gets another.
// A run on the real clock is a new run every time, with the publisher's random id.
import { createHash } from 'node:crypto';
import { createReadStream, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { PerceptConfig } from '../../pipeline/config.ts';
import type { ActionSchema } from '../../nodes/action-schema.ts';
import { resolveModel, type ModelKind } from '../../models/resolve.ts';

const { version: PERCEPT_VERSION } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
  version: string;
};

/** Each value is JSON text (or a plain string), as an MCAP metadata record holds it. */
export type RunIdentity = Readonly<Record<string, string>>;

/** Hashes every model and input file once with SHA-256: a replay's inputs, not the names they go by. */
export async function runIdentity(config: PerceptConfig, actionSchema: ActionSchema): Promise<RunIdentity> {
  const files = [];
  if (config.decoder.kind === 'openai') {
    // A remote server holds its model and vision tower, so they are named by its id and endpoint.
    files.push({ role: 'decoder', spec: config.decoder.model, endpoint: config.decoder.endpoint });
  } else {
    const models: { role: string; spec: string; kind: ModelKind }[] = [{ role: 'decoder', spec: config.decoder.model, kind: 'decoder' }];
    if (config.decoder.draft) models.push({ role: 'draft', spec: config.decoder.draft, kind: 'decoder' });
    if (config.decoder.draftMtp) models.push({ role: 'draftMtp', spec: config.decoder.draftMtp, kind: 'decoder' });
    if (config.encoder.kind === 'onnx') models.push({ role: 'encoder', spec: config.encoder.model, kind: 'vision' });
    if (config.encoder.kind === 'mtmd') models.push({ role: 'encoder', spec: config.encoder.mmproj, kind: 'mmproj' });
    for (const { role, spec, kind } of models) {
      const path = await resolveModel(spec, kind);
      files.push({ role, spec, path, bytes: statSync(path).size, sha256: await sha256File(path) });
    }
  }
  const seeds = { decoder: config.decoder.seed, ...(config.encoder.kind === 'projection' ? { encoder: config.encoder.seed } : {}) };
  return {
    percept_version: PERCEPT_VERSION,
    // Where the run writes or serves metrics is no part of what it is: a replay recorded or not is the same replay.
    config: JSON.stringify({ ...config, recorder: undefined, metrics: undefined }),
    source: JSON.stringify(await sourceIdentity(config.source)),
    models: JSON.stringify(files),
    seeds: JSON.stringify(seeds),
    action_schema: JSON.stringify({ id: actionSchema.id, sha256: actionSchema.sha256 }),
  };
}

/** A replay's run id, a name-based UUID (RFC 9562 version 8) over the SHA-256 of its identity. */
export function replayRunId(identity: RunIdentity): string {
  const digest = createHash('sha256').update('percept.run\n').update(JSON.stringify(identity)).digest();
  digest[6] = (digest[6]! & 0x0f) | 0x80; // version 8
  digest[8] = (digest[8]! & 0x3f) | 0x80; // the RFC's variant
  const hex = digest.toString('hex', 0, 16);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** A bag by its bytes, a folder by the name and bytes of each file in it, a pattern by its config alone.
 * A folder counts every file, whatever the source makes of them. */
async function sourceIdentity(source: PerceptConfig['source']): Promise<object> {
  if (!('path' in source)) return source;
  if (statSync(source.path).isFile()) return { ...source, bytes: statSync(source.path).size, sha256: await sha256File(source.path) };
  const hash = createHash('sha256');
  const names = readdirSync(source.path, { withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => entry.name)
    .sort();
  for (const name of names) hash.update(`${name}\n${await sha256File(join(source.path, name))}\n`);
  return { ...source, files: names.length, sha256: hash.digest('hex') };
}

/** Hashes already read in this process, by path, size and modification time in ns. A tune names every
 * grid point's run by its model files, and this cache reads each large file once, not once per point.
 * A file modified less than RACY_NS before it was read is read again next time. File times are only as
 * fine as the kernel's tick, so a same-size rewrite within one tick keeps both. */
const hashed = new Map<string, Promise<string>>();
const RACY_NS = 2_000_000_000n;

export async function sha256File(path: string): Promise<string> {
  const { size, mtimeNs } = statSync(path, { bigint: true });
  const key = `${resolve(path)}\0${size}\0${mtimeNs}`;
  const cached = hashed.get(key);
  if (cached) return cached;
  const readAtNs = BigInt(Date.now()) * 1_000_000n;
  const digest = (async () => {
    const hash = createHash('sha256');
    for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
    return hash.digest('hex');
  })();
  if (mtimeNs < readAtNs - RACY_NS) {
    hashed.set(key, digest);
    digest.catch(() => hashed.delete(key));
  }
  return digest;
}
