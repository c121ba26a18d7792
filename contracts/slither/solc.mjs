// A `solc` for Slither (crytic-compile) answered by the pinned solcjs in contracts/node_modules: no
// native solc binary can be downloaded here. crytic-compile makes two kinds of call, and only these
// are answered (anything else exits 2 with a message):
//
//   solc --version
//   solc [remaps...] <file.sol> --combined-json <fields> [--allow-paths <a,b>] [other solc flags]
//
// The second compiles <file.sol> and its imports through solcjs' standard-JSON interface with the
// settings of contracts/build.mjs (same evmVersion and optimizer), then writes what native solc
// writes for --combined-json (solc >= 0.8.10 layout: abi/devdoc/userdoc as JSON, not strings).
// Imports resolve relative to the importing file and must stay inside the allowed paths.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, isAbsolute, join, normalize, resolve, sep } from "node:path";

const require = createRequire(import.meta.url);
// Loaded only once the call is understood (loading solcjs takes seconds).
let solcjs;
const solc = () => (solcjs ??= require("solc"));

// Kept equal to contracts/build.mjs SETTINGS (what is analysed is what is deployed).
const SETTINGS = { evmVersion: "prague", optimizer: { enabled: true, runs: 200 }, viaIR: false };

function fail(message) {
  process.stderr.write(`contracts/slither/solc: ${message}\n`);
  process.exit(2);
}

const args = process.argv.slice(2);
if (args.includes("--version")) {
  process.stdout.write(`solc, the solidity compiler commandline interface\nVersion: ${solc().version()}\n`);
  process.exit(0);
}

const cj = args.indexOf("--combined-json");
if (cj < 0 || cj + 1 >= args.length) fail(`unsupported call: solc ${args.join(" ")}`);
const fields = new Set(args[cj + 1].split(","));
const known = new Set(["abi", "ast", "bin", "bin-runtime", "srcmap", "srcmap-runtime", "userdoc", "devdoc", "hashes", "compact-format"]);
for (const f of fields) if (!known.has(f)) fail(`unsupported --combined-json field: ${f}`);

const allowed = [process.cwd()];
const files = [];
const remappings = [];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (i === cj || i === cj + 1) continue;
  if (a === "--allow-paths") {
    for (const p of (args[++i] ?? "").split(",")) if (p) allowed.push(resolve(p));
  } else if (a.endsWith(".sol") && !a.startsWith("-")) {
    files.push(a);
  } else if (!a.startsWith("-") && a.includes("=")) {
    remappings.push(a);
  } else {
    fail(`unsupported argument: ${a}`);
  }
}
if (files.length !== 1) fail(`expected one .sol file, got ${files.length}`);

function isAllowed(path) {
  const p = resolve(path);
  return allowed.some((dir) => p === dir || p.startsWith(dir.endsWith(sep) ? dir : dir + sep));
}

function findImport(path) {
  // Source unit names of imports are resolved by solc against the importing unit's name, so a
  // relative import of "./MerkleProof.sol" from "contracts/VerificationGame.sol" arrives here as
  // "contracts/MerkleProof.sol": read it relative to the working directory.
  const p = isAbsolute(path) ? path : join(process.cwd(), path);
  if (!isAllowed(p)) return { error: `${path} is outside the allowed paths` };
  if (!existsSync(p)) return { error: `${path} not found` };
  return { contents: readFileSync(p, "utf8") };
}

const file = normalize(files[0]);
if (!existsSync(file)) fail(`${file} not found`);
const outputs = [];
if (fields.has("abi")) outputs.push("abi");
if (fields.has("bin")) outputs.push("evm.bytecode.object");
if (fields.has("bin-runtime")) outputs.push("evm.deployedBytecode.object");
if (fields.has("srcmap")) outputs.push("evm.bytecode.sourceMap");
if (fields.has("srcmap-runtime")) outputs.push("evm.deployedBytecode.sourceMap");
if (fields.has("userdoc")) outputs.push("userdoc");
if (fields.has("devdoc")) outputs.push("devdoc");
if (fields.has("hashes")) outputs.push("evm.methodIdentifiers");
const input = {
  language: "Solidity",
  sources: { [file]: { content: readFileSync(file, "utf8") } },
  settings: { ...SETTINGS, remappings, outputSelection: { "*": { "": ["ast"], "*": outputs } } },
};
const output = JSON.parse(solc().compile(JSON.stringify(input), { import: findImport }));

let failed = false;
for (const diag of output.errors ?? []) {
  process.stderr.write((diag.formattedMessage ?? diag.message) + "\n");
  if (diag.severity === "error") failed = true;
}
if (failed) process.exit(1);

const contracts = {};
for (const [src, byName] of Object.entries(output.contracts ?? {})) {
  for (const [name, c] of Object.entries(byName)) {
    const entry = {};
    if (fields.has("abi")) entry.abi = c.abi;
    if (fields.has("bin")) entry.bin = c.evm.bytecode.object;
    if (fields.has("bin-runtime")) entry["bin-runtime"] = c.evm.deployedBytecode.object;
    if (fields.has("srcmap")) entry.srcmap = c.evm.bytecode.sourceMap;
    if (fields.has("srcmap-runtime")) entry["srcmap-runtime"] = c.evm.deployedBytecode.sourceMap;
    if (fields.has("userdoc")) entry.userdoc = c.userdoc;
    if (fields.has("devdoc")) entry.devdoc = c.devdoc;
    if (fields.has("hashes")) entry.hashes = c.evm.methodIdentifiers;
    contracts[`${src}:${name}`] = entry;
  }
}
const sources = {};
const sourceList = Object.entries(output.sources)
  .sort((a, b) => a[1].id - b[1].id)
  .map(([src]) => src);
for (const src of sourceList) {
  sources[src] = { id: output.sources[src].id };
  if (fields.has("ast")) sources[src].AST = output.sources[src].ast;
}
process.stdout.write(JSON.stringify({ contracts, sourceList, sources, version: solc().version() }) + "\n");
