// Stripe's official Node SDK (stripe-node, pinned in package.json) as a judge of the provider's
// form fields: each call the provider makes (the JSON of `cargo run -p provider --example
// form_fields`, named by $PROVIDER_FORM_FIELDS) may send only parameters that the SDK's
// TypeScript types document for that endpoint. The endpoint's params interface is found from the
// SDK itself: the resource method's path in its JavaScript, its `params` type in its .d.ts, and
// that interface's members (a small parser: JSDoc comments dropped, braces matched, the names at
// the interface's own depth read). The Python suite (tests/stripe_sdk/test_stand_in.py) makes the
// same check with stripe-python's typed params.
//
//     PROVIDER_FORM_FIELDS=target/provider-form-fields.json node --test
//
// Without $PROVIDER_FORM_FIELDS the test is skipped. scripts/stripe-sdk.sh sets it.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));
const SDK = join(here, 'node_modules', 'stripe');

// Each call the provider makes, by the example's name: the SDK resource and method of its endpoint.
const SDK_METHODS = {
  payment_intent_create: ['PaymentIntents', 'create'],
  payment_intent_capture: ['PaymentIntents', 'capture'],
  payment_intent_cancel: ['PaymentIntents', 'cancel'],
  refund_create: ['Refunds', 'create'],
};

// Names the provider sends that the SDK does not document, each a known bug to fix in the
// provider (and then to remove here: the test fails if a name listed here is no longer sent).
// Any other undocumented name fails the test. None today: at the pinned API version
// (2026-10-28.endive) card-only is `allowed_payment_method_types`, which the provider sends.
const KNOWN_UNDOCUMENTED = {};

/** The first of `candidates` (paths inside the SDK package) that exists. */
function firstExisting(candidates) {
  const found = candidates.map((path) => join(SDK, path)).find((path) => existsSync(path));
  assert.ok(found, `none of ${candidates.join(', ')} in ${SDK}`);
  return found;
}

/** Every .d.ts file in the SDK package. */
function declarationFiles(dir = SDK) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : declarationFiles(path);
    return name.endsWith('.d.ts') ? [path] : [];
  });
}

/** The SDK's endpoint for `resource.method`: its HTTP method, its path, its params interface. */
function sdkEndpoint(resource, method) {
  const js = readFileSync(
    firstExisting([`esm/resources/${resource}.js`, `cjs/resources/${resource}.js`]),
    'utf8',
  );
  // `create(params, options) { return this._makeRequest('POST', '/v1/…', …` (this version), or
  // `create: stripeMethod({ method: 'POST', fullPath: '/v1/…' })` (older versions).
  const quotedPath = "[`']([^`']+)[`']";
  const made = String.raw`\s*\([^)]*\)\s*\{\s*return\s+this\._makeRequest\(\s*'(\w+)',\s*` + quotedPath;
  const older = String.raw`:\s*stripeMethod\(\{\s*method:\s*'(\w+)',\s*fullPath:\s*` + quotedPath;
  const request =
    new RegExp(`\\b${method}${made}`).exec(js) ?? new RegExp(`\\b${method}${older}`).exec(js);
  assert.ok(request, `no request for ${resource}.${method} in the SDK's JavaScript`);
  const endpointPath = request[2].replace(/\$\{[^}]*\}/g, '{intent}');
  const dts = readFileSync(
    firstExisting([
      `esm/resources/${resource}.d.ts`,
      `cjs/resources/${resource}.d.ts`,
      `types/${resource}Resource.d.ts`,
    ]),
    'utf8',
  );
  const signature = new RegExp(`^\\s*${method}\\(([^)]*)\\)`, 'm').exec(dts);
  assert.ok(signature, `no ${method}( in the SDK's ${resource} declarations`);
  const params = /\bparams\??:\s*([\w.]+)/.exec(signature[1]);
  assert.ok(params, `${resource}.${method} takes no params: ${signature[1]}`);
  const name = params[1].split('.').pop();
  const documented = interfaceMembers(name);
  return { method: request[1].toUpperCase(), path: endpointPath, name, documented };
}

/** The member names of the interface `name`, wherever the SDK declares it. */
function interfaceMembers(name) {
  const opening = new RegExp(`\\binterface\\s+${name}\\s*\\{`);
  for (const file of declarationFiles()) {
    // JSDoc holds prose with braces (`{CHECKOUT_SESSION_ID}`): drop comments before counting.
    const text = readFileSync(file, 'utf8')
      .replace(/\/\*[\s\S]*?\*\//g, '')
      .replace(/^\s*\/\/.*$/gm, '');
    const start = opening.exec(text);
    if (!start) continue;
    let depth = 0;
    let own = '';
    for (let i = start.index + start[0].length - 1; i < text.length; i += 1) {
      const c = text[i];
      if (c === '{') depth += 1;
      if (c === '}') depth -= 1;
      if (depth === 0) break;
      if (depth === 1 && c !== '{') own += c;
    }
    const names = [...own.matchAll(/(?:^|[;\n])\s*(?:readonly\s+)?([A-Za-z_$][\w$]*)\??\s*:/g)];
    const members = new Set(names.map((m) => m[1]));
    assert.ok(members.size > 0, `interface ${name} in ${file} has no members`);
    return members;
  }
  assert.fail(`no interface ${name} in the SDK's declarations`);
}

const fieldsFile = process.env.PROVIDER_FORM_FIELDS;

test(
  "the provider's form fields are parameters the SDK documents for each endpoint",
  { skip: fieldsFile ? false : 'PROVIDER_FORM_FIELDS is not set' },
  () => {
    const sent = JSON.parse(readFileSync(fieldsFile, 'utf8'));
    assert.deepEqual(Object.keys(sent).sort(), Object.keys(SDK_METHODS).sort());
    const problems = [];
    for (const [call, [resource, method]] of Object.entries(SDK_METHODS)) {
      const endpoint = sdkEndpoint(resource, method);
      assert.deepEqual([sent[call].method, sent[call].path], [endpoint.method, endpoint.path], call);
      assert.ok(sent[call].params.length > 0, `${call}: the example printed no parameters`);
      const undocumented = sent[call].params.filter((p) => !endpoint.documented.has(p));
      const known = KNOWN_UNDOCUMENTED[call] ?? [];
      const unknown = undocumented.filter((p) => !known.includes(p));
      const stale = known.filter((p) => !undocumented.includes(p));
      if (unknown.length) problems.push(`${call}: ${unknown.join(', ')} not in ${endpoint.name}`);
      if (stale.length) {
        const fix = 'remove it from KNOWN_UNDOCUMENTED';
        problems.push(`${call}: ${stale.join(', ')} is documented or no longer sent: ${fix}`);
      }
      for (const p of known.filter((k) => undocumented.includes(k))) {
        console.log(`KNOWN BUG: ${call} sends \`${p}\`, which ${endpoint.name} does not document`);
      }
    }
    assert.deepEqual(problems, []);
  },
);
