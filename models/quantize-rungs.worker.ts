// A worker of percept's quantizer (quantize-rungs.ts ConvertPool): reads a byte range of the source
// checkpoint and re-encodes it. Protocol:
//   in : workerData = { sourcePath }; { id, offset, byteLength, srcType, dstType, n }
//   out: { id, data } (buffer transferred) | { id, error }
import { openSync, readSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { convertBlocks, type ConvertJob } from './quantize-rungs.ts';

const fd = openSync((workerData as { sourcePath: string }).sourcePath, 'r');

parentPort!.on('message', (job: ConvertJob & { id: number }) => {
  try {
    const bytes = Buffer.allocUnsafe(job.byteLength);
    let done = 0;
    while (done < job.byteLength) {
      const n = readSync(fd, bytes, done, job.byteLength - done, job.offset + done);
      if (n === 0) throw new Error(`source truncated at byte ${job.offset + done}`);
      done += n;
    }
    const data = convertBlocks(bytes, job.srcType, job.dstType, job.n);
    parentPort!.postMessage({ id: job.id, data }, [data.buffer as ArrayBuffer]);
  } catch (err) {
    parentPort!.postMessage({ id: job.id, error: err instanceof Error ? err.message : String(err) });
  }
});
