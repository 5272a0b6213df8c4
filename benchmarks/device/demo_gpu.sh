#!/bin/bash
# The demo's training stages on a lent GPU (accelerator auto -> 1 GPU, precision null -> bf16-mixed), run there
# from the repository root with .gpu/ carried (made by benchmarks/device/prepare.sh):
#   STEP_TIMEOUT=240 bash benchmarks/device/demo_gpu.sh 2>&1 | tee $OUT/summary.log   (STEPS="stage1 vse ..." picks steps)
# The world is regenerated there (the same seed gives the same world.json as here; its sha1 is printed), runs
# log to CSV (wandb is not on that machine), and each step's log lands in $OUT/results.tgz.
set -u
T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
cp -r .gpu/shim/* /tmp/site/
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p /tmp/assets /tmp/logs .cache/composer/parses && cp .gpu/parses/* .cache/composer/parses/
python3 - <<'PY' || exit 1
import lightning
import torch
import torchvision
import transformers
from transformers import AutoModel, AutoTokenizer

AutoModel.from_pretrained(".gpu/assets/minilm16", dtype=torch.float32).save_pretrained("/tmp/assets/minilm")
AutoTokenizer.from_pretrained(".gpu/assets/minilm16").save_pretrained("/tmp/assets/minilm")
sd = torch.load(".gpu/assets/effnet16.pth", weights_only=True)
torch.save({k: v.float() if v.is_floating_point() else v for k, v in sd.items()}, "/tmp/assets/effnet.pth")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print("torch", torch.__version__, gpu, "lightning", lightning.__version__, "transformers", transformers.__version__,
      "torchvision", torchvision.__version__)
PY
python3 -m data_modules.synthetic --out data/world --images 400 --seed 0 --size 128 > /dev/null && sha1sum data/world/world.json
# make's $(PY): a venv whose python is the machine's (a wrapper, not a link: a link would lose that python's venv)
mkdir -p /tmp/v/bin && printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/v/bin/python && chmod +x /tmp/v/bin/python
touch /tmp/v/.grounding-installed
# `python -m grounding` with the CSV logger appended after the stage's configs
printf 'import runpy, sys\na = sys.argv[1:]\nif a and a[0] in ("fit", "test", "validate", "predict"):\n    a += ["--trainer.logger", "grounding.loggers.CSVLogger"]\nsys.argv = ["grounding", *a]\nrunpy.run_module("grounding", run_name="__main__", alter_sys=True)\n' > /tmp/gpu_cli.py
log "setup done"
for step in ${STEPS:-gpu-check bench-cross demo-composer stage1 vilbert stage2 stage3 baseline vse}; do
  s=$(date +%s)
  # each log line stamped with the seconds since the step began: a step cut off by STEP_TIMEOUT still shows where it was
  set -o pipefail
  case $step in  # bench-cross: COMPOSER's and ViLBERT-style's steps timed by part, with the host syncs of each
    bench-cross) cmd=(python3 benchmarks/bench_cross_encoder_train.py --steps 20 --warmup 3 --packed false);;
    # every model at the papers' shapes: steps/s, memory, syncs, GPU-hours per paper table (report in $OUT/gpu_check)
    gpu-check) cmd=(python3 benchmarks/gpu_check.py --out "$OUT/gpu_check" ${GPU_CHECK_ARGS:-});;
    *) cmd=(make --no-print-directory "$step" VENV=/tmp/v CLI="python3 /tmp/gpu_cli.py");;
  esac
  if timeout "${STEP_TIMEOUT:-600}" "${cmd[@]}" 2>&1 \
    | (SECONDS=0; while IFS= read -r l; do echo "[$SECONDS s] $l"; done) > "/tmp/logs/$step.log"
  then r=ok; else r=FAIL; tail -25 "/tmp/logs/$step.log"; fi
  set +o pipefail
  log "$step: $r in $(( $(date +%s) - s ))s"
  tar czf "$OUT/results.tgz" outputs/*/*/metrics*.json outputs/*/*/fit_record.json /tmp/logs 2>/dev/null
done
python3 - <<'PY'
import glob
import json

for f in sorted(glob.glob("outputs/**/metrics.test.json", recursive=True)):
    d = json.load(open(f))
    print(f, {k: round(v, 2) for k, v in d.items() if k.endswith(("rsum", "top1")) and isinstance(v, float)})
for f in sorted(glob.glob("outputs/**/fit_record.json", recursive=True)):
    d = json.load(open(f))
    print(f, "fit", d.get("seconds"), "s,", d.get("epochs"), "epochs,", d.get("steps"), "steps")
PY
log "all done"
