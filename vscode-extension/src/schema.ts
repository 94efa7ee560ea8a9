// Checks a launch configuration against the JSON schema the extension contributes in package.json
// (the subset it uses), so the editor's completion and the checks at launch cannot drift apart.

export interface Schema {
  type?: string;
  description?: string;
  properties?: Record<string, Schema>;
  required?: string[];
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  pattern?: string;
  patternErrorMessage?: string;
  enum?: unknown[];
}

/** Every problem with `value` against `schema`, each naming the attribute; [] when it conforms. */
export function problems(value: unknown, schema: Schema, path = ''): string[] {
  const where = path || 'the configuration';
  if (schema.type !== undefined && !hasType(value, schema.type)) {
    return [`'${where}' must be ${article(schema.type)}, got ${JSON.stringify(value)}`];
  }
  if (typeof value === 'number') {
    return numberProblems(value, schema, where);
  }
  if (schema.enum !== undefined && !schema.enum.includes(value)) {
    return [`'${where}' is ${JSON.stringify(value)}; expected one of ${schema.enum.map((e) => JSON.stringify(e)).join(', ')}`];
  }
  if (typeof value === 'string' && schema.pattern !== undefined && !new RegExp(schema.pattern).test(value)) {
    return [`'${where}' is ${JSON.stringify(value)}; expected ${schema.patternErrorMessage ?? `a match of ${schema.pattern}`}`];
  }
  if (schema.type === 'object') {
    return objectProblems(value as Record<string, unknown>, schema, path);
  }
  return [];
}

function objectProblems(value: Record<string, unknown>, schema: Schema, path: string): string[] {
  const out = (schema.required ?? []).filter((k) => value[k] === undefined).map((k) => `'${join(path, k)}' is required`);
  for (const [key, sub] of Object.entries(schema.properties ?? {})) {
    if (value[key] !== undefined) {
      out.push(...problems(value[key], sub, join(path, key)));
    }
  }
  return out;
}

function numberProblems(value: number, schema: Schema, where: string): string[] {
  if (schema.minimum !== undefined && value < schema.minimum) {
    return [`'${where}' must be at least ${schema.minimum}, got ${value}`];
  }
  if (schema.maximum !== undefined && value > schema.maximum) {
    return [`'${where}' must be at most ${schema.maximum}, got ${value}`];
  }
  if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum) {
    return [`'${where}' must be more than ${schema.exclusiveMinimum}, got ${value}`];
  }
  return [];
}

function hasType(value: unknown, type: string): boolean {
  switch (type) {
    case 'integer':
      return Number.isInteger(value);
    case 'object':
      return typeof value === 'object' && value !== null && !Array.isArray(value);
    case 'array':
      return Array.isArray(value);
    default:
      return typeof value === type;
  }
}

function article(type: string): string {
  return /^[aeiou]/.test(type) ? `an ${type}` : `a ${type}`;
}

function join(path: string, key: string): string {
  return path ? `${path}.${key}` : key;
}
