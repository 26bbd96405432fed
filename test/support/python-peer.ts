// The Python subscriber (client/python/percept_client.py) as a child process for the tests: one
// JSON line per message on its stdout.
import assert from 'node:assert/strict';
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { PYTHON } from '../../app/bench/python.ts';

const root = new URL('../..', import.meta.url).pathname;

export interface PythonSubscriber {
  readonly child: ChildProcessWithoutNullStreams;
  /** Resolves with the next JSON line the subscriber printed. */
  next(): Promise<Record<string, unknown>>;
  /** Everything it printed on stderr. */
  readonly stderr: () => string;
}

/** Starts client/python/percept_client.py with `args`; resolves when it is connected. */
export async function startPythonSubscriber(args: string[]): Promise<PythonSubscriber> {
  const child = spawn(PYTHON, [join(root, 'client/python/percept_client.py'), ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async () => {
    const r = await lines.next();
    if (r.done) throw new Error(`the Python subscriber ended: ${stderr}`);
    return JSON.parse(r.value) as Record<string, unknown>;
  };
  const first = await next();
  assert.deepEqual(first, { ready: true }, stderr);
  return { child, next, stderr: () => stderr };
}
