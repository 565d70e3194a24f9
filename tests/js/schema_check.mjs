// Validates the texts that tests/tools/grammar_sample drew under each JSON schema with ajv (draft
// 2020-12, formats from ajv-formats): every text must parse as JSON and validate, 100%.
//   node schema_check.mjs SCHEMAS.json SAMPLES.json
import { readFileSync } from 'node:fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const [schemasPath, samplesPath] = process.argv.slice(2);
const schemas = JSON.parse(readFileSync(schemasPath, 'utf8'));
const samples = JSON.parse(readFileSync(samplesPath, 'utf8'));
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
const validators = schemas.map((s) => ajv.compile(s));
let failures = 0;
const perSchema = new Array(schemas.length).fill(0);
for (const { schema, how, text } of samples) {
  perSchema[schema]++;
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    failures++;
    console.log(`FAIL schema ${schema} (${how}): not JSON: ${JSON.stringify(text)}: ${e.message}`);
    continue;
  }
  if (!validators[schema](value)) {
    failures++;
    console.log(`FAIL schema ${schema} (${how}): ${JSON.stringify(text)}: ${ajv.errorsText(validators[schema].errors)}`);
  }
}
const missing = perSchema.map((n, i) => (n ? -1 : i)).filter((i) => i >= 0);
if (missing.length) {
  failures++;
  console.log(`FAIL: no samples for schemas ${missing.join(', ')}`);
}
console.log(`${samples.length - failures}/${samples.length} samples over ${schemas.length} schemas validate`);
process.exit(failures ? 1 : 0);
