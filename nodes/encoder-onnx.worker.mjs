// Worker entry point: registers tsx in this thread, then loads the TypeScript worker.
// Node 20 does not carry the parent's `--import tsx` loader into a worker's entry module.
import { register } from 'tsx/esm/api';

register();
await import('./encoder-onnx.worker.ts');
