// The control socket: a ZeroMQ REP socket that applies one JSON request at a time through GraphControl
// and replies with the status. Config section `control`, off by default.
// The requests are in configs/wire/control.schema.json. A bad or out-of-range one gets {ok: false, error}
// and changes nothing. As for the publisher, an interface other than loopback needs CURVE or `insecure: true`.
import { readFileSync } from 'node:fs';
import { Ajv, type ValidateFunction } from 'ajv';
import { Reply } from 'zeromq';
import type { ControlConfig } from '../../pipeline/config.ts';
import type { GraphControl } from '../../pipeline/graph/control.ts';
import { insecureEndpointProblem, parseEndpoint, readCurveKey } from '../../pipeline/endpoint.ts';

export interface ControlServer {
  /** The endpoint bound (a wildcard port resolved). */
  readonly endpoint: string;
  /** Requests answered so far, and how many of them were refused. */
  readonly handled: number;
  readonly refused: number;
  close(): Promise<void>;
}

type Request =
  | { command: 'status' | 'release_level' | 'pause' | 'resume' }
  | { command: 'set_budgets'; endToEndMs?: number; stages?: Record<string, number | null> }
  | { command: 'pin_level'; level: number };

const SCHEMA = new URL('../../configs/wire/control.schema.json', import.meta.url);

export async function startControlServer(
  config: Pick<ControlConfig, 'endpoint' | 'curve' | 'insecure'>,
  control: GraphControl,
): Promise<ControlServer> {
  const parsed = parseEndpoint(config.endpoint);
  const refused = insecureEndpointProblem(parsed, config.endpoint, { bind: true, curve: config.curve != null, insecure: config.insecure });
  if (refused) throw new Error(`control: ${refused}`);
  const secretKeyFile = config.curve?.secretKeyFile;
  if (config.curve && !secretKeyFile) throw new Error('control: curve.secretKeyFile is required');
  const validate: ValidateFunction = new Ajv({ strict: true, allErrors: true }).compile(JSON.parse(readFileSync(SCHEMA, 'utf8')) as object);
  const socket = new Reply({
    linger: 0,
    ...(secretKeyFile ? { curveServer: true, curveSecretKey: readCurveKey(secretKeyFile, 'control secret key') } : {}),
  });
  try {
    await socket.bind(config.endpoint);
  } catch (err) {
    socket.close();
    throw new Error(`control: cannot bind ${config.endpoint}: ${(err as Error).message}`, { cause: err });
  }
  const endpoint = socket.lastEndpoint ?? config.endpoint;
  const counts = { handled: 0, refused: 0 };

  const answer = (frames: Buffer[]): object => {
    let request: unknown;
    try {
      if (frames.length !== 1) throw new Error(`expected one frame, got ${frames.length}`);
      request = JSON.parse(frames[0]!.toString('utf8'));
    } catch (err) {
      return { ok: false, error: `not a JSON request: ${(err as Error).message}` };
    }
    if (!validate(request)) {
      const why = (validate.errors ?? []).map((e) => `${e.instancePath || '(root)'} ${e.message}`).join('; ');
      return { ok: false, error: `not a control request (configs/wire/control.schema.json): ${why}` };
    }
    const r = request as Request;
    try {
      switch (r.command) {
        case 'status':
          break;
        case 'set_budgets':
          control.setBudgets({ endToEndMs: r.endToEndMs, stages: r.stages });
          break;
        case 'pin_level':
          control.pinLevel(r.level);
          break;
        case 'release_level':
          control.releaseLevel();
          break;
        case 'pause':
          control.pause();
          break;
        case 'resume':
          control.resume();
          break;
      }
    } catch (err) {
      return { ok: false, error: (err as Error).message };
    }
    return { ok: true };
  };

  const serving = (async () => {
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await socket.receive();
      } catch {
        return; // closed
      }
      const reply = answer(frames);
      counts.handled += 1;
      if (!(reply as { ok: boolean }).ok) counts.refused += 1;
      await socket.send(JSON.stringify({ ...reply, status: control.status() })).catch(() => undefined);
    }
  })();

  return {
    endpoint,
    get handled() {
      return counts.handled;
    },
    get refused() {
      return counts.refused;
    },
    async close(): Promise<void> {
      if (!socket.closed) {
        await socket.unbind(endpoint).catch(() => undefined);
        socket.close();
      }
      await serving;
    },
  };
}
