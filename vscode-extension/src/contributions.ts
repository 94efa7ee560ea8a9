// What the extension contributes in package.json, read where code needs the same facts.

import * as fs from 'fs';
import * as path from 'path';
import { Schema } from './schema';

export interface Contributions {
  debuggers: { type: string; configurationAttributes: Record<string, Schema>; initialConfigurations: object[] }[];
  commands: { command: string; title: string }[];
}

let cached: Contributions | undefined;

export function contributions(): Contributions {
  cached ??= JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'package.json'), 'utf8')).contributes;
  return cached as Contributions;
}

/** The JSON schema of a `rewind` configuration for `request` ("launch" or "attach"), or undefined. */
export function configurationSchema(request: string): Schema | undefined {
  const schema = contributions().debuggers[0].configurationAttributes[request];
  return schema && { type: 'object', ...schema };
}
