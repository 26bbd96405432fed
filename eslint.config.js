// Lint: typescript-eslint's recommended rules over the TypeScript tree; formatting is prettier's
// (eslint-config-prettier turns off the rules it owns). `npm run lint` runs both, and clang-format
// over native/src.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'build/', '.cache/', '.carry/', 'out/', 'client/dist/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    // Plain JavaScript files (scripts, the worker entry, configs) run on Node.
    files: ['**/*.{js,mjs,cjs}'],
    languageOptions: {
      globals: { process: 'readonly', console: 'readonly', URL: 'readonly', module: 'writable', require: 'readonly' },
    },
  },
  {
    rules: {
      // `_name` marks a parameter an interface requires but this implementation does not use.
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  prettier,
);
