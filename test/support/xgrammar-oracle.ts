// XGrammar (npm @mlc-ai/web-xgrammar, WASM) as an independent oracle for grammar tests: which
// tokens a GBNF admits after a prefix. Its bundle is a UMD script in a "type": "module" package, so
// it is evaluated here as the CommonJS module it is. (Its string matcher is not used: 0.1.27 admits
// "1000" for `([0-9] | [1-9] [0-9] | [1-9] [0-9]{2}) ("." [0-9]{1,2})?`.)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';

interface XgGrammar {
  dispose(): void;
}
interface XgTokenizerInfo {
  dispose(): void;
}
interface XgCompiledGrammar {
  dispose(): void;
}
interface XgMatcher {
  acceptToken(token: number): boolean;
  getNextTokenBitmask(): Promise<Int32Array>;
  dispose(): void;
}
interface XGrammar {
  Grammar: { fromEBNF(ebnf: string, root?: string): Promise<XgGrammar> };
  TokenizerInfo: {
    createTokenizerInfo(
      vocab: string[],
      vocabType?: string,
      prependSpace?: boolean,
      vocabSize?: number,
      stop?: number[],
    ): Promise<XgTokenizerInfo>;
  };
  GrammarCompiler: {
    createGrammarCompiler(
      t: XgTokenizerInfo,
      cache?: boolean,
    ): Promise<{ compileGrammar(g: XgGrammar): Promise<XgCompiledGrammar>; dispose(): void }>;
  };
  GrammarMatcher: {
    createGrammarMatcher(c: XgCompiledGrammar, stop?: number[], terminateWithoutStop?: boolean, rollback?: number): Promise<XgMatcher>;
  };
}

let cached: XGrammar | undefined;

function xgrammar(): XGrammar {
  if (cached) return cached;
  const require = createRequire(import.meta.url);
  const path = require.resolve('@mlc-ai/web-xgrammar');
  const module = { exports: {} as XGrammar };
  // The package's own UMD bundle, run as CommonJS.
  new Function('exports', 'module', 'require', '__filename', '__dirname', readFileSync(path, 'utf8'))(
    module.exports,
    module,
    require,
    path,
    dirname(path),
  );
  cached = module.exports;
  return cached;
}

/** A GBNF grammar as XGrammar reads it (its EBNF is a superset of what our grammars use). */
export async function xgGrammar(gbnf: string): Promise<XgGrammar> {
  return xgrammar().Grammar.fromEBNF(gbnf, 'root');
}

/** A token matcher over a vocabulary: allowed tokens (from XGrammar's bitmask) after the tokens accepted so far. */
export class XgTokenMatcher {
  readonly #matcher: XgMatcher;
  readonly #nVocab: number;
  private constructor(matcher: XgMatcher, nVocab: number) {
    this.#matcher = matcher;
    this.#nVocab = nVocab;
  }
  /**
   * `vocab`: each token's raw text as the tokenizer stores it (SentencePiece: ▁ for space,
   * <0xNN> for byte tokens), decoded by XGrammar as a byte-fallback vocabulary.
   */
  static async create(grammar: XgGrammar, vocab: string[], stopTokens: number[]): Promise<XgTokenMatcher> {
    const xg = xgrammar();
    const info = await xg.TokenizerInfo.createTokenizerInfo(vocab, 'byte_fallback', false, vocab.length, stopTokens);
    const compiler = await xg.GrammarCompiler.createGrammarCompiler(info, false);
    const compiled = await compiler.compileGrammar(grammar);
    return new XgTokenMatcher(await xg.GrammarMatcher.createGrammarMatcher(compiled, stopTokens, false), vocab.length);
  }
  accept(token: number): boolean {
    return this.#matcher.acceptToken(token);
  }
  async allowed(): Promise<number[]> {
    const mask = await this.#matcher.getNextTokenBitmask();
    const out: number[] = [];
    for (let t = 0; t < this.#nVocab; t++) if ((mask[t >>> 5]! >>> (t & 31)) & 1) out.push(t);
    return out;
  }
  dispose(): void {
    this.#matcher.dispose();
  }
}
