// The committed sample bag's frames as a make-scenes-style dataset, so train.py can score the demo model
// on exactly the JPEG bytes percept replays (bags/sample.mcap) against bags/sample.labels.jsonl:
//   node --import tsx tools/demo-model/sample-frames.ts [--bag bags/sample.mcap] [--labels bags/sample.labels.jsonl]
//        --out DIR [--seed0 3000000]
// writes DIR/images/<seed>.jpg and DIR/scenes.jsonl; frame i gets seed seed0 + i (outside every
// make-scenes split: the sample scene is no seed), matched to its label by log time.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { McapIndexedReader } from '@mcap/core';
import { FileHandleReadable } from '@mcap/nodejs';
import { loadDecompressHandlers } from '@mcap/support';

const { values } = parseArgs({
  options: {
    bag: { type: 'string', default: 'bags/sample.mcap' },
    labels: { type: 'string', default: 'bags/sample.labels.jsonl' },
    out: { type: 'string' },
    seed0: { type: 'string', default: '3000000' },
  },
  strict: true,
});
if (!values.out) throw new Error('--out DIR is required');
const seed0 = Number(values.seed0);
const labels = new Map<string, unknown>();
for (const l of readFileSync(values.labels, 'utf8').split('\n')) {
  if (l.trim()) {
    const o = JSON.parse(l) as { log_time_ns: string; action: unknown };
    labels.set(o.log_time_ns, o.action);
  }
}
const handle = await open(values.bag, 'r');
const reader = await McapIndexedReader.Initialize({
  readable: new FileHandleReadable(handle),
  decompressHandlers: await loadDecompressHandlers(),
});
mkdirSync(join(values.out, 'images'), { recursive: true });
const lines: string[] = [];
for await (const m of reader.readMessages()) {
  const ch = reader.channelsById.get(m.channelId)!;
  if (ch.messageEncoding !== 'json') continue;
  const msg = JSON.parse(Buffer.from(m.data).toString('utf8')) as { format?: string; data?: string };
  if (msg.format !== 'jpeg' || typeof msg.data !== 'string') continue;
  const action = labels.get(String(m.logTime));
  if (action === undefined) throw new Error(`no label for the frame at ${m.logTime}`);
  const jpeg = Buffer.from(msg.data, 'base64');
  const seed = seed0 + lines.length;
  const width = jpeg.readUInt16BE(jpeg.indexOf(Buffer.from([0xff, 0xc0])) + 7);
  const height = jpeg.readUInt16BE(jpeg.indexOf(Buffer.from([0xff, 0xc0])) + 5);
  writeFileSync(join(values.out, 'images', `${seed}.jpg`), jpeg);
  lines.push(
    JSON.stringify({
      seed,
      split: 'sample',
      image: `images/${seed}.jpg`,
      width,
      height,
      action,
      log_time_ns: String(m.logTime),
      topic: ch.topic,
    }),
  );
}
await handle.close();
if (lines.length !== labels.size) throw new Error(`${lines.length} frames for ${labels.size} labels`);
writeFileSync(join(values.out, 'scenes.jsonl'), lines.join('\n') + '\n');
console.log(`wrote ${lines.length} frames to ${values.out}`);
