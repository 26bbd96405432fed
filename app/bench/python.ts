// The Python interpreter percept runs its pyzmq peers with.
import { existsSync } from 'node:fs';

/** Debian's python3-zmq installs for the system interpreter. */
export const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
