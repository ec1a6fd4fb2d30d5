# Everything the README's commands need is installed here, from a bare Python.
# torch is pinned through a constraints file: an unpinned request would pull the
# multi-GB CUDA wheels, while pyproject keeps a normal range for users.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# A second install without torch, as `pip install memlayout` gives it (make test-core).
CORE_VENV  := .venv-core
CORE_STAMP := $(CORE_VENV)/.installed

.PHONY: venv demo test test-core test-torch-matrix lint docs bench bench-gpu fixtures clean reliability fuzz browser nginx realworld zoo

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	echo "torch==$(TORCH_VERSION)" > $(VENV)/constraints.txt
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(VENV)/constraints.txt "torch==$(TORCH_VERSION)"
	$(PY) -m pip install -q -c $(VENV)/constraints.txt -e ".[torch,dev,bench,zoo,remote,lora,plot]"
	touch $(STAMP)

$(CORE_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install -q --upgrade pip
	$(CORE_VENV)/bin/python -m pip install -q -e ".[test-core]"
	touch $(CORE_STAMP)

# The demo checkpoint has findings, so inspect exits 1 by design; only a usage or
# load error (exit 2) fails the target.
demo: $(STAMP)
	$(VENV)/bin/memlayout inspect fixtures/demo_checkpoint.pt; status=$$?; \
	  echo "memlayout exit code: $$status (1 = findings at or above --fail-on; see README)"; \
	  test $$status -le 1

# The HTML storage map is tested in Debian's chromium, installed here where the
# machine allows it (root, apt-get); elsewhere the browser tests skip with one line.
# Playwright drives it and never downloads a browser of its own.
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium could not be installed: the browser tests will skip"

# The remote-read tests (tests/remote) run a real Debian nginx on 127.0.0.1, installed
# here as chromium is; elsewhere they skip with one line.
NGINX ?= /usr/sbin/nginx
nginx:
	@test -x $(NGINX) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq && apt-get install -y -qq nginx >/dev/null; } || \
	  echo "nginx could not be installed: the remote-read tests will skip"

test: $(STAMP) browser nginx
	$(PY) -m pytest -q -n 2

# The torch matrix: the suite's torch-dependent tests again on the newest torch a user gets from
# `pip install 'memlayout[torch]'` on Linux, a CUDA build (run here without a GPU,
# as on CI and most laptops), and on the oldest torch pyproject's range claims.
# Each torch has its own venv, .venv-torch-<version>, with the same extras as
# `make venv` but `bench` (deepspeed builds from source against the torch it finds;
# the benchmarks run on the pinned torch). `make test-torch-2.14.1` runs one.
# The oldest is the pinned torch for now, which make test already runs: 2.6.0 fails
# three activations tests (CONTRIBUTING.md, "The torch range"); `make
# test-torch-2.6.0` runs it. Times on the 2-core CI machine: CONTRIBUTING.md.
TORCH_NEWEST ?= 2.14.1
TORCH_OLDEST ?= 2.13.0
TORCH_MATRIX := $(TORCH_NEWEST) $(filter-out $(TORCH_VERSION),$(TORCH_OLDEST))

.PRECIOUS: .venv-torch-%/.installed
.venv-torch-%/.installed: pyproject.toml Makefile
	rm -rf .venv-torch-$*
	$(PYTHON) -m venv .venv-torch-$*
	echo "torch==$*" > .venv-torch-$*/constraints.txt
	.venv-torch-$*/bin/python -m pip install -q --upgrade pip
	.venv-torch-$*/bin/python -m pip install -q -c .venv-torch-$*/constraints.txt "torch==$*"
	.venv-torch-$*/bin/python -m pip install -q -c .venv-torch-$*/constraints.txt -e ".[torch,dev,zoo,remote,lora,plot]"
	touch $@

# What the matrix runs again: the tests of what torch's version changes (the predictions,
# the formats as torch writes and loads them, flatten's round trips, the rules' torch facts,
# the private APIs). The rest (the commands end to end, HTTP reading, report rendering, diff,
# packaging, the docs site, fuzzing) is memlayout's own code over those, and runs once, in
# make test: the whole suite twice took CI's 2-core machine 68 min, past its hour. The
# real gloo ranks (two spawned processes per check, 10 minutes of CPU) run once too, on
# the pinned torch: the matrix still traces the newest torch's FSDP2 and DDP ranks
# (fake, through torch's own FSDPMemTracker and DDP code), unchecked by real ranks there.
MATRIX_TESTS := tests/activations tests/load tests/flatten tests/rules tests/corpus tests/realworld \
	tests/test_private_torch_apis.py tests/test_real_models.py tests/test_cyclic_gc.py tests/test_threads.py \
	tests/test_nothing_at_import.py \
	--ignore=tests/activations/ranks/test_ddp_real.py --ignore=tests/activations/ranks/test_ranks_real.py \
	--ignore=tests/activations/plans/test_op_policies_torchtitan.py

test-torch-%: .venv-torch-%/.installed browser nginx
	.venv-torch-$*/bin/python -m pytest -q -n 2 $(MATRIX_TESTS)

test-torch-matrix: $(addprefix test-torch-,$(TORCH_MATRIX))

# The reading commands in the install without torch: every report format on a
# checkpoint of each format, and the commands that run torch refused in one line.
# The checkpoints are written by the real writers, so by the full install's torch.
CORE_FIXTURES := .test-artifacts/core-install
test-core: $(CORE_STAMP) $(STAMP)
	rm -rf $(CORE_FIXTURES)
	$(PY) fixtures/make_format_fixtures.py --all $(CORE_FIXTURES) > /dev/null
	MEMLAYOUT_CORE_FIXTURES=$(CORE_FIXTURES) $(CORE_VENV)/bin/python -m pytest -q tests/core_install

# Full-size goals that take minutes and GiBs (issue 13's GPT-2 64x512 and Llama 7B).
.PHONY: slow
slow: $(STAMP)
	MEMLAYOUT_SLOW=1 $(PY) -m pytest -q -m slow tests/activations

# lint-imports checks the layer contract in pyproject.toml ([tool.importlinter]);
# tools/import_rules.py what may be imported at the top of a module and what inside a function.
lint: $(STAMP)
	$(VENV)/bin/ruff check memlayout tests benchmarks fixtures docs tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tools/import_rules.py

# The documentation site, from docs/ and mkdocs.yml into site/. --strict turns every
# warning (a broken link, a page missing from the nav) into a failure. Rule pages,
# the command reference and the benchmark tables are rendered from the code at
# build time (docs/hooks.py); nothing is fetched from the network.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c $(VENV)/constraints.txt -e ".[docs]"
	touch $(DOCS_STAMP)

# The built site is then opened from disk in chromium: every link lands on a page,
# and no example or table is clipped at 1280 px (tests/test_docs_site.py).
docs: $(DOCS_STAMP) browser
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	MEMLAYOUT_SITE=site $(PY) -m pytest -q tests/test_docs_site.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

fixtures: $(STAMP)
	$(PY) fixtures/make_fixtures.py

clean:
	rm -rf $(VENV) $(CORE_VENV) .venv-torch-* .pytest_cache .mypy_cache .ruff_cache site

# SIGKILL at random points in 200 flattens of a 64 MiB checkpoint (a 20-kill slice
# runs in make test). Figures: docs/reliability.md.
reliability: $(STAMP)
	$(PY) -m tests.reliability.sigkill --kills 200 --mib 64

# 10,000 mutated inputs for each fuzz target (atheris, or hypothesis without it);
# a slice runs in make test. Figures: docs/reliability.md.
fuzz: $(STAMP)
	$(PY) -m tests.fuzz.run --runs 10000 --jobs 2 --json .bench-data/fuzz/summary.json

# The real-world corpus (tests/realworld): checkpoints other projects ship in pinned
# wheels, plus files transformers, DCP and torch.export write in the run. Metadata
# against torch's own loaders, the expected findings, flatten verified bitwise, every
# hint followed; then the timings against those loaders. It also runs inside make
# test, and skips with one line when the package registry is unreachable.
realworld: $(STAMP)
	$(PY) -m pytest -q -n 2 tests/realworld
	$(PY) benchmarks/speed/bench_realworld.py

# memlayout activations against the real step on every architecture in transformers'
# auto-model registries, diffusers' UNets and VAEs, and torch.nn's reference models,
# each in a process of its own (a slice runs in make test). Figures and the table:
# docs/activations-zoo.md, generated from benchmarks/results/activations_zoo.json.
# ARCH=LlamaForCausalLM runs one architecture, FAMILY=causal-lm one family, RERUN=failed
# the records not ok; ZOO_JOBS runs several at once, ZOO_TIMEOUT bounds each (seconds).
ZOO_JOBS ?= 1
ZOO_TIMEOUT ?= 300
zoo: $(STAMP)
	nice -n 10 $(PY) -m benchmarks.accuracy.zoo.run --jobs $(ZOO_JOBS) --timeout $(ZOO_TIMEOUT) \
	  $(if $(ARCH),--arch "$(ARCH)") $(if $(FAMILY),--family "$(FAMILY)") $(if $(RERUN),--rerun $(RERUN)) \
	  --command "make zoo$(if $(ARCH), ARCH=$(ARCH))$(if $(FAMILY), FAMILY=$(FAMILY))$(if $(RERUN), RERUN=$(RERUN))"
