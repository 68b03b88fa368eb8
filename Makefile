# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_HOME := $(CURDIR)/.pactl
PACTL := PACTL_HOME=$(DEMO_HOME) $(BIN)/pactl

.PHONY: install test test-all lint format demo readme-picture bench bench-real mutate clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev,serve]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

test-all: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check pactl tests bench tools
	$(BIN)/ruff format --check pactl tests bench tools
	$(BIN)/mypy pactl
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest -q -p no:cacheprovider tests/test_layout.py  # room sizes, the client, one declaration per setting

format: $(STAMP)
	$(BIN)/ruff check --fix pactl tests bench tools
	$(BIN)/ruff format pactl tests bench tools

# download digits -> train -> index -> query, on the CPU: 19 to 24 s on 2 cores with .venv installed.
demo: $(STAMP)
	$(PACTL) download digits
	$(PACTL) train digits --name demo --overwrite
	$(PACTL) index
	$(PACTL) query $(DEMO_HOME)/datasets/digits/7/0007.png --k 4 --exclude-self --format table

# The README's picture (docs/img/demo-query.png): the demo's run answering one query of each
# unseen digit, redrawn from scratch in a temporary folder (about a minute on 2 CPU cores).
readme-picture: $(STAMP)
	$(BIN)/python -m tools.readme_picture --out docs/img/demo-query.png

# The main benchmarks, each through `python -m bench NAME` (`python -m bench` lists them all);
# each records bench/results/NAME.json (docs/benchmarks.md).
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	for name in help loss train_step eval index ondisk embed query_load; do \
		$(BIN)/python -m bench $$name || exit 1; done

# Learning on real images, offline: builds the glyph and Fashion-MNIST sets (apt-get, as root)
# and ImageNet weights for EfficientNet-Lite0 under $(REAL), then trains each way (about an hour
# on 2 CPU cores). See docs/benchmarks.md.
REAL ?= /tmp/pactl-real
bench-real: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	test -f $(REAL)/fonts/manifest.csv || $(BIN)/python -m tools.real_sets fonts $(REAL)/fonts
	test -f $(REAL)/fashion/manifest.csv || $(BIN)/python -m tools.real_sets fashion $(REAL)/fashion
	test -f $(REAL)/lite0.pth || $(BIN)/python -m tools.lite0_weights $(REAL)/lite0.pth
	$(BIN)/python -m bench real --root $(REAL)

# Mutation testing (docs/mutation.md): mutmut mutates the modules pyproject.toml's [tool.mutmut]
# names and runs each mutant against the fast tests listed there that call the mutated function,
# one BLAS/OpenMP thread per worker (a forked worker of a multi-threaded OpenMP hangs); then each
# module's score. The whole run: 12 min 24 s on 2 shared cores (docs/mutation.md);
# `$(BIN)/mutmut show NAME` shows one mutant.
MUTANT_SCORES = {m = $$1; sub(/^ +/, "", m); sub(/\.x(_|\xc7\x81).*/, "", m); n[m]++; \
	k[m] += ($$2 == "killed" || $$2 == "timeout"); s[m] += ($$2 == "survived")} \
	END {for (m in n) printf "%-30s %5d mutants %5d killed %4d survived %4d other %6.1f%%\n", \
	m, n[m], k[m], s[m], n[m] - k[m] - s[m], 100 * k[m] / n[m]}
mutate: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[mutate]'
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results --all true | awk -F': ' '$(MUTANT_SCORES)' | sort

clean:
	rm -rf runs .pactl .pytest_cache .mypy_cache .ruff_cache mutants
