// The data that flows on each edge of the graph. Stages import these, never each other.
import type { VisionJpeg } from '../native/vision.ts';

/** A camera frame as a source delivers it. */
export type FrameEncoding = 'jpeg' | 'png' | 'rgb8' | 'bgr8' | 'rgba8' | 'bgra8' | 'mono8' | 'mono16';
export interface CameraFrame {
  readonly encoding: FrameEncoding;
  readonly data: Uint8Array;
  /** Required for raw encodings. */
  readonly width?: number;
  readonly height?: number;
  /** Bytes per row for raw encodings (defaults to width × channels × bytes per channel). */
  readonly stride?: number;
}

/** An encoder input tensor, in the layout of an encoder contract. */
export type EncoderContract = 'gemma3' | 'gemma4';
export interface PixelTensor {
  readonly contract: EncoderContract;
  /** gemma3: [N,3,896,896] CHW in [-1,1]; gemma4: [N,P,768] patches (HWC 16×16×3) in [0,1]. Empty
   * (length 0) when `jpeg` is set: the encoder makes these values on its GPU. */
  readonly pixelValues: Float32Array;
  readonly pixelDims: readonly number[];
  /** A JPEG frame left for the encoder to decode, resize and lay out on its GPU, when its decodesJpeg is true.
   * pixelDims and positionIds describe the tensor it makes there. */
  readonly jpeg?: DeviceJpegFrame;
  /** gemma4 only: [N,P,2] (col,row) per patch, −1 for padding. */
  readonly positionIds?: BigInt64Array;
  readonly positionDims?: readonly number[];
  /** The number of image tokens the decoder will receive for this image. */
  readonly imageTokens: number;
  /** Gives pixelValues back to its producer for reuse. The consumer, the encoder, owns the tensor.
   * It calls this at most once, when nothing reads the array any more.
   * After a transfer to a worker and back, it passes the array it got back.
   * Optional: without a call the array is garbage collected. */
  readonly recycle?: (pixelValues: Float32Array) => void;
}

/** What host preprocessing read and decided for a JPEG the encoder decodes on its GPU.
 * It is the frame as the GPU path takes it: stored size, EXIF orientation, filter and normalization.
 * It adds the display-oriented size to resample to. */
export interface DeviceJpegFrame extends VisionJpeg {
  readonly width: number;
  readonly height: number;
}

/** Where a preprocessor gets its pixel arrays, when the encoder reads some memory faster, such as the GPU's pinned host memory.
 * undefined: allocate an ordinary Float32Array. */
export type PixelAllocator = (length: number) => Float32Array | undefined;

/** Image embeddings in the decoder's width, ready for the prompt's image segment. */
export interface ImageEmbedding {
  /** nTokens × nEmbd floats, row-major. */
  readonly data: Float32Array;
  readonly nTokens: number;
  readonly nEmbd: number;
}

/** The cosine similarity of each token's row in `a` and `b` (two encoders' outputs for one image). */
export function tokenCosines(a: ImageEmbedding, b: ImageEmbedding): number[] {
  if (a.nTokens !== b.nTokens || a.nEmbd !== b.nEmbd)
    throw new RangeError(`embeddings differ in shape: ${a.nTokens}×${a.nEmbd} vs ${b.nTokens}×${b.nEmbd}`);
  const out: number[] = [];
  for (let t = 0; t < a.nTokens; t++) {
    let dot = 0;
    let na = 0;
    let nb = 0;
    for (let i = t * a.nEmbd; i < (t + 1) * a.nEmbd; i++) {
      dot += a.data[i]! * b.data[i]!;
      na += a.data[i]! ** 2;
      nb += b.data[i]! ** 2;
    }
    out.push(dot / Math.sqrt(na * nb));
  }
  return out;
}

export type StopReason = 'eos' | 'max_tokens' | 'stop' | 'cancelled' | 'deadline';
/** What the decoder produced for one frame. */
export interface Generation {
  readonly text: string;
  /** The new tokens' ids, where the decoder has them.
   * A remote server's API returns text only: this is empty, and timings.decodeTokens holds the count. */
  readonly tokens: readonly number[];
  readonly stopReason: StopReason;
  readonly promptTokens: number;
  readonly reusedTokens: number;
  readonly drafted: number;
  readonly accepted: number;
  readonly forced: number;
  readonly timings: GenerationTimings;
}
export interface GenerationTimings {
  readonly prefillMs: number;
  readonly prefillTokens: number;
  readonly ttftMs: number;
  readonly decodeMs: number;
  readonly decodeTokens: number;
  readonly sampleMs: number;
}

/** A validated action, ready for the wire. */
export interface ActionMessage {
  readonly schemaId: string;
  readonly frameId: number;
  readonly sourceId: string;
  readonly captureWallMs: number;
  readonly action: unknown;
}
