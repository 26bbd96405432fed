// The import rule of the layout, checked by dependency-cruiser (test/import-rules.test.ts runs it in
// `npm test`; `npx depcruise app pipeline nodes native models tools` runs it by hand):
//
//   app → nodes → {pipeline, native, models}, nothing back, and no import circle; client/ (the subscriber library users
//   import as percept/client) stands alone, and the rest may use its wire types.
//
// Paths are relative to the repository root. test/ is not checked: tests may import anything.
const TS_FOLDERS = '^(app|pipeline|nodes|native|models|client|tools)/';

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'pipeline-is-the-runtime',
      comment: 'pipeline/ is the runtime only: it knows no stage, no binding, no checkpoint code and no app.',
      severity: 'error',
      from: { path: '^pipeline/' },
      to: { path: '^(app|nodes|native|models|tools)/' },
    },
    {
      name: 'native-is-the-binding',
      comment: 'native/ is the binding only: it imports none of the TypeScript folders.',
      severity: 'error',
      from: { path: '^native/' },
      to: { path: TS_FOLDERS, pathNot: '^native/' },
    },
    {
      name: 'models-import-no-stage-or-app',
      comment: 'models/ makes and resolves checkpoints; stages and the app use it, not the other way round.',
      severity: 'error',
      from: { path: '^models/' },
      to: { path: '^(app|nodes|tools)/' },
    },
    {
      name: 'only-app-imports-app',
      comment: 'app/ is the face (CLI, run wiring, benches): nothing below it imports it (the bin script in tools/ runs it).',
      severity: 'error',
      from: { path: '^(pipeline|nodes|native|models)/' },
      to: { path: '^app/' },
    },
    {
      name: 'stages-never-import-stages',
      comment:
        'A stage sees only its input and output types: nodes/X.ts imports no other stage. The shared payload types, ' +
        "the action schema, the action header, the shared MCAP reader and writer and the stage's own worker file are not stages.",
      severity: 'error',
      from: { path: '^nodes/([^/]+?)(\\.worker)?\\.ts$' },
      to: {
        path: '^nodes/',
        pathNot: ['^nodes/(payloads|action-schema|action-header|mcap-read|mcap-write)\\.ts$', '^nodes/$1(\\.worker)?\\.(ts|mjs)$'],
      },
    },
    {
      name: 'models-resolved-by-app-only',
      comment: 'Model specs (synth:…) are resolved in app/ and by scripts in tools/; stages receive file paths.',
      severity: 'error',
      from: { path: TS_FOLDERS, pathNot: '^(app|models|tools)/' },
      to: { path: '^models/resolve\\.ts$' },
    },
    {
      name: 'client-stands-alone',
      comment: 'client/ is what robot stacks import (percept/client): it needs nothing of the pipeline, only the wire schemas in configs/.',
      severity: 'error',
      from: { path: '^client/' },
      to: { path: TS_FOLDERS, pathNot: '^client/' },
    },
    {
      name: 'only-wire-types-from-client',
      comment: 'The pipeline shares the wire types with the client (client/wire-types.ts), not its subscriber code.',
      severity: 'error',
      from: { path: '^(pipeline|nodes|native|models)/' },
      to: { path: '^client/', pathNot: '^client/wire-types\\.ts$' },
    },
    {
      name: 'tools-are-scripts',
      comment: 'tools/ holds build and test scripts; no source folder imports them.',
      severity: 'error',
      from: { path: TS_FOLDERS, pathNot: '^tools/' },
      to: { path: '^tools/' },
    },
    {
      name: 'no-circular',
      comment: 'No import circle, type-only imports included: a module and what it needs read one way.',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'no-unresolvable-import',
      comment: 'An import that resolves to nothing is a typo or a missing dependency.',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    // Type-only imports are arrows too.
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(node_modules|build|test)/' },
    // Resolve packages through their "exports" maps, as Node does.
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['import', 'require', 'node', 'default'] },
  },
};
