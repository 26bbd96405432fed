// The JavaScript JPEG header reader (readJpegHeader, nodes/preprocess.ts) against sharp's metadata() on the same
// frames, and the preprocess stage's GPU route through it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import sharp from 'sharp';
import { createPreprocessStage, gpuTakes, readJpegHeader } from '../../nodes/preprocess.ts';
import { standaloneContext } from '../../pipeline/standalone.ts';
import { PREPROCESS_DEFAULTS } from '../support/fixtures.ts';

function noise(width: number, height: number, channels: 1 | 3): Buffer {
  const raw = Buffer.alloc(width * height * channels);
  let s = 7;
  for (let i = 0; i < raw.length; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    raw[i] = (s >>> 24) & 255;
  }
  return raw;
}

const image = (width: number, height: number, channels: 1 | 3 = 3) =>
  sharp(noise(width, height, channels), { raw: { width, height, channels } });

/** An APP1 Exif segment whose first IFD holds one SHORT orientation, in either byte order. */
function exifSegment(orientation: number, little: boolean): Buffer {
  const tiff = Buffer.alloc(8 + 2 + 12 + 4);
  tiff.write(little ? 'II' : 'MM', 0, 'latin1');
  const w16 = (v: number, at: number) => (little ? tiff.writeUInt16LE(v, at) : tiff.writeUInt16BE(v, at));
  const w32 = (v: number, at: number) => (little ? tiff.writeUInt32LE(v, at) : tiff.writeUInt32BE(v, at));
  w16(42, 2);
  w32(8, 4);
  w16(1, 8);
  w16(0x0112, 10);
  w16(3, 12);
  w32(1, 14);
  w16(orientation, 18);
  w32(0, 22);
  const body = Buffer.concat([Buffer.from('Exif\0\0', 'latin1'), tiff]);
  const head = Buffer.from([0xff, 0xe1, (body.length + 2) >> 8, (body.length + 2) & 255]);
  return Buffer.concat([head, body]);
}

/** Where exifSegment's orientation entry keeps its type, once inserted after SOI: SOI 2, marker and
 * length 4, 'Exif\0\0' 6, TIFF header 8, entry count 2, tag 2. */
const ORIENTATION_TYPE_AT = 2 + 4 + 6 + 8 + 2 + 2;

/** The JPEG with a segment inserted right after SOI. */
const withSegment = (jpeg: Buffer, segment: Buffer): Buffer => Buffer.concat([jpeg.subarray(0, 2), segment, jpeg.subarray(2)]);

test("reads what sharp's metadata() reads: size, channels, progressive, orientation, on the frames sharp writes", async () => {
  const cases: [string, Buffer][] = [
    ['720p 4:2:0', await image(1280, 720).jpeg({ quality: 85 }).toBuffer()],
    ['odd size 4:4:4', await image(333, 101).jpeg({ chromaSubsampling: '4:4:4' }).toBuffer()],
    ['grey', await image(64, 48, 1).jpeg().toBuffer()],
    ['progressive', await image(160, 90).jpeg({ progressive: true }).toBuffer()],
    ['cmyk', await image(40, 30).toColourspace('cmyk').jpeg().toBuffer()],
    ['optimised huffman, no JFIF quirks', await image(100, 200).jpeg({ optimiseCoding: true, mozjpeg: true }).toBuffer()],
  ];
  for (let o = 1; o <= 8; o++) cases.push([`orientation ${o}`, await image(96, 64).withMetadata({ orientation: o }).jpeg().toBuffer()]);
  for (const [name, jpeg] of cases) {
    const meta = await sharp(jpeg).metadata();
    const h = readJpegHeader(jpeg);
    assert.ok(h, `${name}: read`);
    assert.deepEqual(
      [h.width, h.height, h.components, h.sequentialHuffman, h.orientation],
      [meta.width, meta.height, meta.channels, meta.isProgressive !== true, meta.orientation ?? 1],
      name,
    );
    assert.equal(h.precision, 8, name);
    assert.equal(gpuTakes(h), meta.isProgressive !== true && meta.space !== 'cmyk', `${name}: what the GPU path takes`);
  }
});

test('EXIF in either byte order, fill bytes before a marker; what is not plain gives undefined (sharp decides)', async () => {
  const jpeg = await image(32, 16).jpeg().toBuffer();
  for (const little of [true, false]) {
    for (const o of [3, 6, 8]) {
      const framed = withSegment(jpeg, exifSegment(o, little));
      assert.equal(readJpegHeader(framed)?.orientation, o, `${little ? 'II' : 'MM'} orientation ${o}`);
      assert.equal((await sharp(framed).metadata()).orientation, o, "sharp reads the same segment so (the test's own EXIF is valid)");
    }
  }
  const filled = Buffer.concat([jpeg.subarray(0, 2), Buffer.from([0xff, 0xff]), jpeg.subarray(2)]);
  assert.equal(readJpegHeader(filled)?.width, 32, 'fill bytes');
  // An orientation stored as a LONG: not what the reader takes as plain
  const odd = withSegment(jpeg, exifSegment(6, true));
  odd.writeUInt16LE(4, ORIENTATION_TYPE_AT);
  assert.equal(readJpegHeader(odd), undefined);
  assert.equal(readJpegHeader(Buffer.from('not a jpeg')), undefined);
  assert.equal(readJpegHeader(await image(8, 8).png().toBuffer()), undefined);
  const sos = jpeg.indexOf(Buffer.from([0xff, 0xda]));
  assert.ok(sos > 0);
  assert.equal(readJpegHeader(jpeg.subarray(0, sos)), undefined, 'cut before the scan');
  assert.ok(readJpegHeader(jpeg.subarray(0, sos + 4)), 'the scan itself is not needed');
  // A segment length that runs past the end
  const bad = Buffer.from(jpeg.subarray(0, sos + 4));
  bad.writeUInt16BE(0xfff0, 4);
  assert.equal(readJpegHeader(bad), undefined);
});

test('12-bit, arithmetic-coded and RGB-stored JPEGs are read but not taken by the GPU path', async () => {
  const jpeg = await image(48, 32).jpeg({ chromaSubsampling: '4:4:4' }).toBuffer();
  const sof = jpeg.indexOf(Buffer.from([0xff, 0xc0]));
  assert.ok(sof > 0);
  const twelve = Buffer.from(jpeg);
  twelve[sof + 4] = 12;
  assert.deepEqual([readJpegHeader(twelve)?.precision, gpuTakes(readJpegHeader(twelve)!)], [12, false]);
  const arithmetic = Buffer.from(jpeg);
  arithmetic[sof + 1] = 0xc9;
  assert.deepEqual([readJpegHeader(arithmetic)?.sequentialHuffman, gpuTakes(readJpegHeader(arithmetic)!)], [false, false]);
  // Adobe APP14, transform 0: three components stored as RGB
  const adobe = Buffer.from([0xff, 0xee, 0, 14, ...Buffer.from('Adobe', 'latin1'), 0, 100, 0, 0, 0, 0, 0]);
  const rgb = readJpegHeader(withSegment(jpeg, adobe))!;
  assert.deepEqual([rgb.rgb, gpuTakes(rgb)], [true, false]);
  adobe[15] = 1; // transform 1: YCbCr
  assert.equal(readJpegHeader(withSegment(jpeg, adobe))!.rgb, false);
});

test('the preprocess stage plans a JPEG for the GPU from this header: the same tensor as from sharp, and sharp where it does not read', async () => {
  const ctx = () => standaloneContext({ frame: { frameId: 1, sourceId: 't' }, knobs: { imageTokens: 280, maxNewTokens: 8 } });
  const stage = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true });
  const jpeg = await image(1280, 720).withMetadata({ orientation: 6 }).jpeg().toBuffer();
  const t = await stage.process({ encoding: 'jpeg', data: jpeg }, ctx());
  assert.ok(t.jpeg, 'to the encoder');
  assert.deepEqual([t.jpeg.storedWidth, t.jpeg.storedHeight, t.jpeg.orientation], [1280, 720, 6]);
  // the same frame with its EXIF in a form the reader leaves to sharp: the same plan
  const odd = withSegment(await image(1280, 720).jpeg().toBuffer(), exifSegment(6, true));
  odd.writeUInt16LE(4, ORIENTATION_TYPE_AT); // LONG: sharp reads it as 6 all the same
  assert.equal(readJpegHeader(odd), undefined);
  const viaSharp = await stage.process({ encoding: 'jpeg', data: odd }, ctx());
  assert.ok(viaSharp.jpeg);
  assert.deepEqual(
    [viaSharp.imageTokens, viaSharp.pixelDims, Array.from(viaSharp.positionIds ?? [])],
    [t.imageTokens, t.pixelDims, Array.from(t.positionIds ?? [])],
  );
  // too many pixels is refused from the header alone, naming the size
  const small = createPreprocessStage({ ...PREPROCESS_DEFAULTS, contract: 'gemma4', jpegToEncoder: true, maxPixels: 1000 });
  await assert.rejects(
    small.process({ encoding: 'jpeg', data: jpeg }, ctx()),
    /jpeg frame: 1280×720 = 921600 pixels exceeds maxPixels 1000/,
  );
});
