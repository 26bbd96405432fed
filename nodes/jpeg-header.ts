// A JPEG frame's header read in JavaScript, for the GPU path (preprocess with jpegToEncoder): the stored
// size, the EXIF orientation and whether the frame is one nvJPEG's path is checked on. sharp's metadata()
// reads the same through libvips on the libuv pool, 0.27 ms a 720p frame on a 2-core VM and 0.8–1.1 ms
// of the H200 host's frame → embeddings p50 of 10.3 ms, where the rest of the frame's preprocessing is
// microseconds; this walks the marker segments up to the scan. Anything it does not read plainly
// (a truncated header, an unusual EXIF, a second frame) gives undefined, and the caller asks sharp.

export interface JpegHeader {
  /** Stored size (the frame header's, before the EXIF orientation). */
  readonly width: number;
  readonly height: number;
  readonly components: number;
  /** Bits per sample (8; 12 for 12-bit JPEGs). */
  readonly precision: number;
  /** SOF0 or SOF1: sequential and Huffman-coded (not progressive, lossless, hierarchical or arithmetic). */
  readonly sequentialHuffman: boolean;
  /** Three components stored as RGB rather than YCbCr (an Adobe marker with transform 0, or component
   * ids 'R', 'G', 'B' without one), as libjpeg decides it. */
  readonly rgb: boolean;
  /** EXIF orientation 1–8; 1 without one. */
  readonly orientation: number;
}

const u16 = (d: Uint8Array, i: number, little: boolean): number => (little ? d[i]! | (d[i + 1]! << 8) : (d[i]! << 8) | d[i + 1]!);
const u32 = (d: Uint8Array, i: number, little: boolean): number =>
  little
    ? (d[i]! | (d[i + 1]! << 8) | (d[i + 2]! << 16) | (d[i + 3]! << 24)) >>> 0
    : ((d[i]! << 24) | (d[i + 1]! << 16) | (d[i + 2]! << 8) | d[i + 3]!) >>> 0;

/** The orientation in an APP1 Exif segment's first IFD (TIFF header at t, segment end at end): a
 * number, or undefined where the segment is not plain enough to read (libvips's libexif then decides). */
function exifOrientation(d: Uint8Array, t: number, end: number): number | undefined {
  if (t + 8 > end) return undefined;
  const little = d[t] === 0x49 && d[t + 1] === 0x49;
  if (!little && !(d[t] === 0x4d && d[t + 1] === 0x4d)) return undefined;
  if (u16(d, t + 2, little) !== 42) return undefined;
  const ifd = t + u32(d, t + 4, little);
  if (ifd + 2 > end) return undefined;
  const entries = u16(d, ifd, little);
  if (ifd + 2 + entries * 12 + 4 > end) return undefined;
  for (let e = 0; e < entries; e++) {
    const at = ifd + 2 + e * 12;
    if (u16(d, at, little) !== 0x0112) continue;
    // SHORT, one value, in the entry itself
    if (u16(d, at + 2, little) !== 3 || u32(d, at + 4, little) !== 1) return undefined;
    return u16(d, at + 8, little);
  }
  // None in the first IFD: libexif would look in the others (the thumbnail's); leave that to it.
  return u32(d, ifd + 2 + entries * 12, little) === 0 ? 1 : undefined;
}

/** The header of a JPEG up to its first scan, or undefined (see the file comment). */
export function readJpegHeader(d: Uint8Array): JpegHeader | undefined {
  if (d.length < 4 || d[0] !== 0xff || d[1] !== 0xd8) return undefined;
  let frame: Omit<JpegHeader, 'orientation' | 'rgb'> | undefined;
  let ids: number[] = [];
  let orientation: number | undefined = 1;
  let exifSeen = false;
  let jfif = false;
  let adobeTransform: number | undefined;
  let i = 2;
  while (i + 4 <= d.length) {
    if (d[i] !== 0xff) return undefined;
    while (d[i + 1] === 0xff && i + 2 < d.length) i++; // fill bytes
    const marker = d[i + 1]!;
    i += 2;
    if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd8)) continue; // no length: TEM, RSTn, SOI
    if (marker === 0xd9 || i + 2 > d.length) return undefined; // EOI before a scan
    if (marker === 0xda) {
      // the first scan: the header is complete
      if (frame === undefined || orientation === undefined) return undefined;
      const rgb = frame.components === 3 && (adobeTransform !== undefined ? adobeTransform === 0 : !jfif && ids.join() === '82,71,66');
      return { ...frame, rgb, orientation };
    }
    const length = (d[i]! << 8) | d[i + 1]!;
    const seg = i + 2;
    const end = i + length;
    if (length < 2 || end > d.length) return undefined;
    if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
      if (frame !== undefined || length < 8) return undefined; // a second frame: hierarchical
      const components = d[seg + 5]!;
      if (length < 8 + 3 * components) return undefined;
      frame = {
        precision: d[seg]!,
        height: (d[seg + 1]! << 8) | d[seg + 2]!,
        width: (d[seg + 3]! << 8) | d[seg + 4]!,
        components,
        sequentialHuffman: marker === 0xc0 || marker === 0xc1,
      };
      ids = Array.from({ length: components }, (_, c) => d[seg + 6 + 3 * c]!);
    } else if (marker === 0xe0 && length >= 7 && String.fromCharCode(...d.subarray(seg, seg + 5)) === 'JFIF\0') {
      jfif = true;
    } else if (marker === 0xe1 && !exifSeen && length >= 8 && String.fromCharCode(...d.subarray(seg, seg + 6)) === 'Exif\0\0') {
      exifSeen = true;
      orientation = exifOrientation(d, seg + 6, end);
    } else if (marker === 0xee && length >= 14 && String.fromCharCode(...d.subarray(seg, seg + 5)) === 'Adobe') {
      adobeTransform = d[seg + 11];
    }
    i = end;
  }
  return undefined;
}

/** A header the GPU path takes: sequential Huffman, 8-bit, grey or YCbCr, a size. */
export function gpuTakes(h: JpegHeader): boolean {
  return h.sequentialHuffman && h.precision === 8 && (h.components === 1 || (h.components === 3 && !h.rgb)) && h.width > 0 && h.height > 0;
}
