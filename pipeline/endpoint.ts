// ZeroMQ endpoints as percept accepts them: stricter than libzmq, as a robot stack needs.
// libzmq binds `tcp://127.0.0.1:99999` to the port modulo 65536 without a word.
// So every endpoint in a config is parsed here first. Rules: pipeline/README.md#endpoints
import { readFileSync } from 'node:fs';

export interface ParsedEndpoint {
  readonly transport: 'tcp' | 'ipc' | 'inproc';
  /** tcp: the host or interface as written ('*', '127.0.0.1', '[::1]', 'localhost', 'eth0'…). */
  readonly host: string;
  /** tcp: the port, or '*' for any free port. */
  readonly port: number | '*' | null;
  /** True when only this machine can reach it: loopback tcp, ipc, inproc. */
  readonly local: boolean;
}

const TCP = /^tcp:\/\/(\[[^\]]*\]|[^:/[\]]+):([^:/]+)$/;
const LOOPBACK_V4 = /^127(\.\d{1,3}){3}$/;

/** Parses an endpoint; throws an Error that says what is wrong with it. `bind` allows the wildcard
 * port (a connect needs a real one). */
export function parseEndpoint(endpoint: string, { bind = true }: { bind?: boolean } = {}): ParsedEndpoint {
  if (typeof endpoint !== 'string' || endpoint.length === 0)
    throw new Error(`expected an endpoint string but received ${JSON.stringify(endpoint)}`);
  if (endpoint.startsWith('ipc://')) {
    if (endpoint.length === 'ipc://'.length) throw new Error(`${endpoint}: ipc:// needs a path`);
    return { transport: 'ipc', host: '', port: null, local: true };
  }
  if (endpoint.startsWith('inproc://')) {
    if (endpoint.length === 'inproc://'.length) throw new Error(`${endpoint}: inproc:// needs a name`);
    return { transport: 'inproc', host: '', port: null, local: true };
  }
  const m = TCP.exec(endpoint);
  if (!m) {
    throw new Error(
      `${JSON.stringify(endpoint)} is not an endpoint percept accepts: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME`,
    );
  }
  const host = m[1]!;
  const portText = m[2]!;
  let port: number | '*';
  if (portText === '*') {
    if (!bind) throw new Error(`${endpoint}: a connect needs a port number, not *`);
    port = '*';
  } else {
    const n = Number(portText);
    if (!/^\d+$/.test(portText) || n < 1 || n > 65535) {
      throw new Error(`${endpoint}: port ${portText} is out of range (1–65535${bind ? ', or * for any free port' : ''})`);
    }
    port = n;
  }
  const local = LOOPBACK_V4.test(host) || host === 'localhost' || host === '[::1]' || host === 'lo';
  return { transport: 'tcp', host, port, local };
}

/** Why a socket on `endpoint` is refused, or undefined when it is allowed.
 * A socket other hosts can reach needs CURVE or an explicit `insecure: true`.
 * That is a bind on a non-loopback interface, or a connect to another host. */
export function insecureEndpointProblem(
  endpoint: ParsedEndpoint,
  raw: string,
  { bind, curve, insecure }: { bind: boolean; curve: boolean; insecure: boolean },
): string | undefined {
  if (endpoint.local || curve || insecure) return undefined;
  const wildcard = endpoint.host === '*' || endpoint.host === '0.0.0.0' || endpoint.host === '[::]';
  const what = bind
    ? `binds ${wildcard ? 'every network interface' : `${endpoint.host}, which other hosts can reach,`}`
    : 'connects to another host';
  return `${raw} ${what} without encryption: set curve (key files) to encrypt it, or insecure: true to allow it in the clear`;
}

const Z85_KEY = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

/** A CURVE key (Z85 text, 40 characters) from a file; surrounding whitespace is ignored. Throws an
 * error naming the file when it cannot be read or holds no key. */
export function readCurveKey(file: string, what: string): string {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch (err) {
    throw new Error(`cannot read the ${what} ${file}: ${(err as Error).message}`, { cause: err });
  }
  if (!Z85_KEY.test(text))
    throw new Error(`the ${what} ${file} is not a CURVE key (expected 40 characters of Z85 text, as \`percept keys\` writes)`);
  return text;
}
