# Set-up and everyday commands. Each target installs what it needs into a project-local venv.
# torch and torchvision are pinned first, as a pair that lies on this machine's disk (a CUDA build that runs on
# CPU too; PyPI's torchvision does not load beside the CPU-only torch 2.13 wheel), so pip downloads neither.

VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1
EXTRAS ?= dev
JOBS   ?= auto
STAMP  := $(VENV)/.installed-$(EXTRAS)

.PHONY: setup serving demo test lint bench-ingest bench-report bench-llm bench-viewer bench-models bench-ranks clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

setup: $(STAMP)

## The serving environments (vLLM's CPU build and NVIDIA AIPerf, each in its own venv under .serving/; ~10 minutes
## the first time): `workbench serve` launches the engine and the load generator from them.
serving: .serving/.installed

.serving/.installed: scripts/serving-env
	scripts/serving-env .serving

## Capture the default experiment (tiny-gpt trained on the Python standard library, trained once and cached; eager,
## bf16, compile, int8), print its summary, write its report.
demo: setup
	$(VENV)/bin/workbench capture --threads 1 --set weights=trained --report traces/report.html

## Lint and run the whole test suite on every core (a file's tests stay on one worker, so they share their
## module's fixtures: one Jupyter server, one Ray cluster, one compiled model), then list the ten slowest tests.
## QUICK=1 leaves out the end-to-end tests marked slow (CI runs them all).
test: setup
	$(VENV)/bin/ruff check workbench tests benchmarks
	$(PY) -m pytest -n $(JOBS) --dist loadfile --durations=10 $(if $(QUICK),-m "not slow")

lint: setup
	$(VENV)/bin/ruff check workbench tests benchmarks

## Kineto ingest benchmark: workbench reader vs HolisticTraceAnalysis vs json.load on 1M events.
bench-ingest: setup
	$(PY) benchmarks/ingest.py

## Report benchmark: dashboard and HTML report for 100k, 1M and 10M-event traces (time, size, peak RSS).
bench-report: setup
	$(PY) benchmarks/report.py

## LLM performance model against measured tiny-gpt prefill and decode on this CPU (prediction error per metric).
bench-llm: setup
	$(PY) benchmarks/llm_model.py

## Timeline viewer: first view, window latency and server memory on 1M and 10M-event bundles, against the static report.
bench-viewer: setup
	$(PY) benchmarks/viewer.py

## Model sources: load time per source, then eager vs compile vs ort on each model, interleaved.
bench-models: setup
	$(PY) benchmarks/models.py

## Multi-rank ingest: process pool vs local Ray cluster vs one process; driver memory as ranks grow.
bench-ranks: setup
	$(PY) benchmarks/ranks.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-output extensions/jupyterlab-workbench/node_modules \
		extensions/jupyterlab-workbench/lib extensions/jupyterlab-workbench/labextension extensions/jupyterlab-workbench/.yarn
