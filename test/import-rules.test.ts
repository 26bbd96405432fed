// The layout's import rule (.dependency-cruiser.cjs), checked with dependency-cruiser on the source
// folders: app → nodes → {pipeline, native, models}, nothing back. A violation fails with the rule,
// the importing file and the import. The negative test runs the same rules on a small fixture tree
// that breaks each of them once.
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, test } from 'node:test';
import { cruise, type ICruiseResult } from 'dependency-cruiser';
import extractDepcruiseOptions from 'dependency-cruiser/config-utl/extract-depcruise-options';

const ROOT = join(import.meta.dirname, '..');
const FOLDERS = ['app', 'pipeline', 'nodes', 'native', 'models', 'client', 'tools'];

/** "rule: from → to" for every violation of the repo's rules in `baseDir`'s source folders. */
async function violations(baseDir: string): Promise<string[]> {
  const options = await extractDepcruiseOptions(join(ROOT, '.dependency-cruiser.cjs'));
  const { output } = await cruise(FOLDERS, { ...options, validate: true, baseDir });
  return (output as ICruiseResult).summary.violations.map((v) => `${v.rule.name}: ${v.from} → ${v.to}`).sort();
}

describe('import rules', () => {
  test('the source folders follow app → nodes → {pipeline, native, models}, nothing back', async () => {
    const found = await violations(ROOT);
    assert.deepEqual(found, [], `imports against the layout:\n  ${found.join('\n  ')}`);
  });

  test('a fixture with one wrong arrow per rule reports each of them, naming the file and the import', async () => {
    const dir = join(ROOT, '.cache', 'import-rules-fixture');
    rmSync(dir, { recursive: true, force: true });
    const files: Record<string, string> = {
      'app/run.ts':
        "import '../nodes/decoder.ts';\nimport '../pipeline/graph.ts';\nimport '../models/resolve.ts';\nimport '../native/llama.ts';\n",
      'pipeline/graph.ts': "import '../nodes/payloads.ts';\n", // the runtime knows no stage
      'pipeline/types.ts': "import type {} from './clock.ts';\n", // with clock.ts, an import circle
      'pipeline/clock.ts': "import type {} from './types.ts';\n",
      'nodes/payloads.ts': 'export {};\n',
      'nodes/action-schema.ts': 'export {};\n',
      'nodes/encoder.ts':
        "import './payloads.ts';\nimport './action-schema.ts';\nimport './encoder.worker.ts';\nimport '../pipeline/types.ts';\n",
      'nodes/encoder.worker.ts': "import './payloads.ts';\n",
      'nodes/decoder.ts': "import './encoder.ts';\nimport '../native/llama.ts';\nimport '../models/resolve.ts';\n", // a stage importing a stage; resolving a spec
      'nodes/recorder.ts': "import './mcap-write.ts';\nimport '../app/run.ts';\n", // a stage importing the app
      'nodes/source-bag.ts': "import './mcap-read.ts';\nimport './payloads.ts';\n",
      'nodes/mcap-read.ts': 'export {};\n', // the shared MCAP reader and writer are not stages
      'nodes/mcap-write.ts': "import './decoder.ts';\n", // but they import no stage either
      'native/llama.ts': "import '../pipeline/types.ts';\n", // the binding importing the runtime
      'models/resolve.ts': "import '../nodes/payloads.ts';\n", // models importing a stage's types
      'models/synth.ts': "import './missing.ts';\n", // an import that resolves to nothing
      'tools/make-bag.ts': "import '../app/run.ts';\n",
      'tools/helpers.ts': 'export {};\n',
      'app/cli.ts': "import '../tools/helpers.ts';\n", // source importing a script
      'client/index.ts': "import './wire-types.ts';\nimport '../pipeline/types.ts';\n", // the client needing the pipeline
      'client/wire-types.ts': 'export {};\n',
      'nodes/publisher.ts': "import '../client/wire-types.ts';\nimport '../client/index.ts';\n", // a stage using the subscriber code
    };
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    assert.deepEqual(await violations(dir), [
      'client-stands-alone: client/index.ts → pipeline/types.ts',
      'models-import-no-stage-or-app: models/resolve.ts → nodes/payloads.ts',
      'models-resolved-by-app-only: nodes/decoder.ts → models/resolve.ts',
      'native-is-the-binding: native/llama.ts → pipeline/types.ts',
      'no-circular: pipeline/clock.ts → pipeline/types.ts',
      'no-unresolvable-import: models/synth.ts → ./missing.ts',
      'only-app-imports-app: nodes/recorder.ts → app/run.ts',
      'only-wire-types-from-client: nodes/publisher.ts → client/index.ts',
      'pipeline-is-the-runtime: pipeline/graph.ts → nodes/payloads.ts',
      'stages-never-import-stages: nodes/decoder.ts → nodes/encoder.ts',
      'stages-never-import-stages: nodes/mcap-write.ts → nodes/decoder.ts',
      'tools-are-scripts: app/cli.ts → tools/helpers.ts',
    ]);
  });
});
