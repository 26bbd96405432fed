// `percept keys`: a CURVE key pair for an encrypted publisher, control socket or frame input.
// NAME.key holds the secret key, readable by its owner only, and NAME.pub the public key for clients.
// Each is the 40-character Z85 text that the config's key files and `percept echo --server-key` read.
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { curveKeyPair } from 'zeromq';

export interface KeysOptions {
  readonly out: string;
  readonly name?: string;
  readonly force?: boolean;
}

export function writeKeyPair({ out, name = 'server', force = false }: KeysOptions): { secretKeyFile: string; publicKeyFile: string } {
  if (!/^[\w.-]+$/.test(name)) throw new Error(`keys: the name must be letters, digits, '.', '-' or '_' but is ${JSON.stringify(name)}`);
  const secretKeyFile = join(out, `${name}.key`);
  const publicKeyFile = join(out, `${name}.pub`);
  if (!force && (existsSync(secretKeyFile) || existsSync(publicKeyFile)))
    throw new Error(`keys: ${secretKeyFile} or ${publicKeyFile} exists (--force replaces them)`);
  mkdirSync(out, { recursive: true });
  const { publicKey, secretKey } = curveKeyPair();
  writeFileSync(secretKeyFile, `${secretKey}\n`, { mode: 0o600 });
  writeFileSync(publicKeyFile, `${publicKey}\n`);
  return { secretKeyFile, publicKeyFile };
}
