// The demo model's draft: a Gemma 4 MTP assistant (llama.cpp's gemma4-assistant) trained for a demo target by
// tools/demo-model/train-assistant.py. Its weights file holds the trained tensors under llama.cpp's names and the
// token table's trained rows; this writes the GGUF llama.cpp loads. Format: models/README.md#demo-model
import { writeTrainedGguf, type Gemma4AssistantConfig } from './synth.ts';
import { TorchCpuGenerator, torchRandnAsync } from './torch-random.ts';

/** What an assistant's weights file says about it (KV `percept.demo.model`, JSON). */
export interface DemoAssistantInfo {
  readonly format: 'percept-demo-assistant/1';
  readonly assistant: Gemma4AssistantConfig;
  /** The demo model it drafts for: it reads that model's KV cache and hidden states. */
  readonly target: string;
  /** Rows of its token table that are not stored are torch.randn(…)·std from this seed. */
  readonly tables: { readonly seed: number; readonly std: number; readonly vocab: number };
  /** sha256 of the assembled GGUF (its decoder part: an assistant has no other). */
  readonly sha256: Readonly<Partial<Record<'decoder' | 'vision' | 'mmproj', string>>>;
  readonly provenance: Readonly<Record<string, unknown>>;
}

/** The tensors of an assistant's weights file, dequantized, and the ids of its stored table rows. */
export interface AssistantTensors {
  get(name: string): Promise<Float32Array>;
  tableIds(): Promise<Int32Array>;
}

/** The stored rows of the token table, and where train-assistant.py's generator is seeded. */
const ROWS = 'tables.token_embd.rows';
const generatorSeed = (seed: number): number => seed * 1_000_003 + 29;

/** The full token table: torch.randn from the seed, as train-assistant.py drew it, with the trained rows put back. */
async function tokenTable(w: AssistantTensors, info: DemoAssistantInfo): Promise<Float32Array> {
  const { seed, std, vocab } = info.tables;
  const width = info.assistant.hidden;
  const table = await torchRandnAsync(vocab * width, new TorchCpuGenerator(generatorSeed(seed)));
  const scale = Math.fround(std);
  for (let k = 0; k < table.length; k++) {
    table[k] = Math.fround(table[k]! * scale);
    if (k % (1 << 22) === 0) await new Promise<void>((resolve) => setImmediate(resolve));
  }
  const ids = await w.tableIds();
  const rows = await w.get(ROWS);
  if (rows.length !== ids.length * width)
    throw new Error(`demo assistant: ${ROWS} holds ${rows.length} values, not ${ids.length}×${width}`);
  ids.forEach((id, r) => {
    if (id < 0 || id >= vocab)
      throw new RangeError(`demo assistant ${info.target}: stored table row id ${id} is outside the vocabulary of ${vocab}`);
    table.set(rows.subarray(r * width, (r + 1) * width), id * width);
  });
  return table;
}

/** The assistant GGUF: llama.cpp's tensor order and KVs for its config, F32 weights, the real tokenizer. */
export async function writeDemoAssistant(w: AssistantTensors, info: DemoAssistantInfo, name: string, out: string): Promise<void> {
  await writeTrainedGguf(info.assistant, name, out, (def) => (def.name === 'token_embd.weight' ? tokenTable(w, info) : w.get(def.name)));
}
