#!/usr/bin/env node
// `percept` on the PATH (npm link / npx percept): loads the TypeScript CLI through tsx.
import { register } from 'tsx/esm/api';

register();
await import('../app/cli.ts');
