# The two commands of the README: `make demo` (main job) and `make test` (the whole check CI runs).
# Both start from nothing: scripts/bootstrap.sh creates .venv and installs pinned packages.
SHELL := /bin/bash
VENV := .venv/bin
DEMO_ARGS ?=

.PHONY: setup demo test lint format typecheck imports contracts contracts-check slither pytest clean

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(VENV)/vgame demo $(DEMO_ARGS)

test: setup contracts-check slither lint typecheck imports pytest

lint: setup
	$(VENV)/ruff check game trainer_node auditor_node tests scripts
	$(VENV)/ruff format --check game trainer_node auditor_node tests scripts

# What `lint` checks, fixed in place (import order, formatting); run it before a commit.
format: setup
	$(VENV)/ruff check --fix game trainer_node auditor_node tests scripts
	$(VENV)/ruff format game trainer_node auditor_node tests scripts

# The package (pyproject's [tool.mypy]), then the measurement scripts, which import each other
# (cuda_on_cpu.py) as top-level modules.
typecheck: setup
	$(VENV)/mypy
	MYPYPATH=scripts $(VENV)/mypy scripts

# The layers of docs/architecture.md ("Layers"): the import-linter contracts in pyproject.toml.
imports: setup
	$(VENV)/lint-imports

# Rebuild the committed ABI/bytecode from contracts/*.sol with the pinned solc.
contracts: setup
	node contracts/build.mjs

# Fail if a fresh compile differs from the committed build output, byte for byte.
contracts-check: setup
	node contracts/build.mjs --check

# Static analysis of the game contract (and the MerkleProof library it imports) with Slither, from
# its own venv (.venv-slither, requirements-slither.lock). Slither compiles through contracts/slither/solc,
# the pinned solcjs behind native solc's command line. Any finding fails, unless the source justifies it
# with `// slither-disable-next-line <detector> (reason)` (docs/contract.md "Static analysis").
slither: setup
	.venv-slither/bin/slither contracts/VerificationGame.sol --solc contracts/slither/solc \
		--compile-force-framework solc --fail-pedantic

pytest: setup
	$(VENV)/python -m pytest -n 2 --timeout=900 $(PYTEST_ARGS)

clean:
	rm -rf .venv .venv-slither contracts/node_modules .pytest_cache .mypy_cache .ruff_cache
