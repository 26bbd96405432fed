// DDS peers for the ROS 2 tests: programs built in the test from Debian's packages (cyclonedds-dev with idlc,
// libfastrtps-dev), sources in test/nodes/ros2-peers/, run as child processes that talk RTPS over loopback.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { LOOPBACK_CYCLONE_CONFIG } from '../../native/dds/binding.ts';
import { REPO_ROOT } from './fixtures.ts';

const run = promisify(execFile);
export const PEER_SOURCES = join(REPO_ROOT, 'test', 'nodes', 'ros2-peers');

/** A domain id of this test process's own, so parallel test runs on one host do not meet. */
export const testDomainId = (offset: number): number => 20 + ((process.pid * 7 + offset) % 200);

/** Builds a C program against libddsc, with the idlc-generated C of `idl` beside it; resolves with its path. */
export async function buildCyclonePeer(program: string, idl: string): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'percept-dds-'));
  await run('idlc', ['-l', 'c', '-o', dir, join(PEER_SOURCES, `${idl}.idl`)]);
  const out = join(dir, program);
  await run('cc', ['-O1', '-I', dir, '-o', out, join(PEER_SOURCES, `${program}.c`), join(dir, `${idl}.c`), '-lddsc']);
  return out;
}

/** Builds the Fast DDS subscriber (C++, libfastrtps); resolves with its path. */
export async function buildFastDdsPeer(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'percept-fastdds-'));
  const out = join(dir, 'fastdds-raw-sub');
  await run('g++', ['-std=c++17', '-O1', '-o', out, join(PEER_SOURCES, 'fastdds-raw-sub.cpp'), '-lfastrtps', '-lfastcdr']);
  return out;
}

export interface Peer {
  readonly child: ChildProcess;
  /** Every stdout line so far. */
  readonly lines: string[];
  /** Resolves when a line satisfies `match` (at once if one did); rejects if the peer exits first. */
  waitForLine(match: (line: string) => boolean): Promise<string>;
  /** The exit code, once it exits. */
  readonly exited: Promise<number | null>;
  stderr(): string;
}

/** Starts a peer with Cyclone DDS's loopback config (CYCLONEDDS_URI) in its environment. */
export function startPeer(path: string, args: string[]): Peer {
  const child = spawn(path, args, { env: { ...process.env, CYCLONEDDS_URI: LOOPBACK_CYCLONE_CONFIG }, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: string[] = [];
  let err = '';
  let partial = '';
  const waiters: { match: (line: string) => boolean; resolve: (line: string) => void; reject: (e: Error) => void }[] = [];
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    const parts = (partial + chunk).split('\n');
    partial = parts.pop()!;
    for (const line of parts) {
      lines.push(line);
      for (const w of [...waiters])
        if (w.match(line)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(line);
        }
    }
  });
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (err += chunk));
  const exited = new Promise<number | null>((resolve) =>
    child.on('exit', (code) => {
      for (const w of waiters.splice(0)) w.reject(new Error(`${path} exited (${code}) before the line it was waited for: ${err}`));
      resolve(code);
    }),
  );
  return {
    child,
    lines,
    exited,
    stderr: () => err,
    waitForLine(match) {
      const seen = lines.find(match);
      if (seen !== undefined) return Promise.resolve(seen);
      if (child.exitCode !== null) return Promise.reject(new Error(`${path} has exited (${child.exitCode}): ${err}`));
      return new Promise((resolve, reject) => waiters.push({ match, resolve, reject }));
    },
  };
}

/** Polls `condition` on the event loop until it holds (no time limit: the test's own timeout is the guard). */
export async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 20));
}
