// Compile contracts/*.sol with the pinned solcjs and write game/chain/artifacts/<Name>.json.
//
//   node contracts/build.mjs           write the artifacts
//   node contracts/build.mjs --check   compile in memory; exit 1 when a committed artifact differs or is missing
//
// The output is byte-reproducible: sources are read in sorted order under their bare file names (no
// machine paths reach the metadata), object keys are sorted, 2-space indent, trailing newline.
// Compiler warnings are printed; compiler errors exit 1.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const solc = require("solc");

const CONTRACTS_DIR = dirname(fileURLToPath(import.meta.url));
const ARTIFACTS_DIR = join(CONTRACTS_DIR, "..", "game", "chain", "artifacts");

// Optimizer runs: 200 keeps deployment and per-move gas balanced; the game is deployed once per
// chain and each bisection move is cheap either way (measured in docs/contract.md "Gas").
const SETTINGS = {
  evmVersion: "prague",
  optimizer: { enabled: true, runs: 200 },
  viaIR: false,
  outputSelection: {
    "*": {
      "": ["ast"],
      "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object", "evm.deployedBytecode.immutableReferences"],
    },
  },
};

function immutableRanges(references) {
  const ranges = Object.values(references || {}).flat().map((r) => [r.start, r.length]);
  return ranges.sort((a, b) => a[0] - b[0]);
}

function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(
      Object.keys(value)
        .sort()
        .map((k) => [k, sortKeys(value[k])]),
    );
  }
  return value;
}

function stableJson(value) {
  return JSON.stringify(sortKeys(value), null, 2) + "\n";
}

function readSources() {
  const names = readdirSync(CONTRACTS_DIR)
    .filter((f) => f.endsWith(".sol"))
    .sort();
  const sources = {};
  for (const name of names) sources[name] = { content: readFileSync(join(CONTRACTS_DIR, name), "utf8") };
  return sources;
}

function sourceHash(sources) {
  const h = createHash("sha256");
  for (const name of Object.keys(sources).sort()) {
    h.update(name + "\0" + sources[name].content + "\0");
  }
  return "0x" + h.digest("hex");
}

/** Names of the concrete contracts (not libraries, interfaces or abstract contracts) of one source. */
function concreteContracts(ast) {
  return ast.nodes
    .filter((n) => n.nodeType === "ContractDefinition" && n.contractKind === "contract" && !n.abstract)
    .map((n) => n.name);
}

function compile() {
  const sources = readSources();
  const input = { language: "Solidity", sources, settings: SETTINGS };
  const output = JSON.parse(solc.compile(JSON.stringify(input)));
  let failed = false;
  for (const diag of output.errors ?? []) {
    const text = diag.formattedMessage ?? diag.message;
    if (diag.severity === "error") {
      failed = true;
      console.error(text);
    } else {
      console.warn(text);
    }
  }
  if (failed) {
    console.error("build.mjs: compilation failed");
    process.exit(1);
  }
  const settings = { evmVersion: SETTINGS.evmVersion, optimizer: SETTINGS.optimizer, viaIR: SETTINGS.viaIR };
  const hash = sourceHash(sources);
  const artifacts = {};
  for (const file of Object.keys(sources)) {
    for (const name of concreteContracts(output.sources[file].ast)) {
      const c = output.contracts[file][name];
      artifacts[`${name}.json`] = stableJson({
        contractName: name,
        sourceName: file,
        abi: c.abi,
        bytecode: "0x" + c.evm.bytecode.object,
        deployedBytecode: "0x" + c.evm.deployedBytecode.object,
        // Where the constructor writes each immutable into the runtime code (zeros in
        // deployedBytecode): the deployed code differs from it there, and only there.
        immutableRanges: immutableRanges(c.evm.deployedBytecode.immutableReferences),
        compiler: { version: solc.version(), settings },
        sourceHash: hash,
      });
    }
  }
  return artifacts;
}

function check(artifacts) {
  const problems = [];
  for (const [file, text] of Object.entries(artifacts)) {
    const path = join(ARTIFACTS_DIR, file);
    if (!existsSync(path)) {
      problems.push(`missing: ${file}`);
      continue;
    }
    const committed = readFileSync(path, "utf8");
    if (committed !== text) {
      const a = JSON.parse(committed);
      const b = JSON.parse(text);
      const fields = Object.keys(b).filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k]));
      problems.push(`differs: ${file} (${fields.length ? fields.join(", ") : "formatting"})`);
    }
  }
  if (existsSync(ARTIFACTS_DIR)) {
    for (const file of readdirSync(ARTIFACTS_DIR).filter((f) => f.endsWith(".json")).sort()) {
      if (!(file in artifacts)) console.warn(`build.mjs: warning: ${file} is not produced by any contract`);
    }
  }
  if (problems.length) {
    console.error("build.mjs --check: committed artifacts are stale; run `make contracts`:");
    for (const p of problems) console.error("  " + p);
    process.exit(1);
  }
  console.log(`build.mjs --check: ${Object.keys(artifacts).length} artifacts match (solc ${solc.version()})`);
}

function write(artifacts) {
  mkdirSync(ARTIFACTS_DIR, { recursive: true });
  for (const [file, text] of Object.entries(artifacts)) writeFileSync(join(ARTIFACTS_DIR, file), text);
  console.log(`build.mjs: wrote ${Object.keys(artifacts).length} artifacts (solc ${solc.version()})`);
}

const artifacts = compile();
if (process.argv.includes("--check")) check(artifacts);
else write(artifacts);
