#!/usr/bin/env bash
# Collect the meta-dataset (design v2, 21 tasks) on a lent GPU machine, within one call of the device tool.
# Carried (ignored) inputs: .gpu/model (all-MiniLM-L6-v2 as fp16 safetensors + tokenizer) and .gpu/pool.tgz
# (`python -m metalearning pool --data-root ../shared/data --out pool/`, tarred). Uses the machine's own python3 and
# packages (torch, transformers); the repository is on PYTHONPATH. Writes to $OUT: trials.jsonl, the predictions as
# preds.tgz.NN chunks (each under the device tool's 16 MiB a file), hardware.json, smi.csv (utilisation), log.
# Usage: bash metalearning/gpu_collect.sh MINUTES WORKERS [SEEDS] [FIRST_CONFIGS]
set -uo pipefail
minutes=${1:-7}; workers=${2:-15}; seeds=${3:-0,1}; first_configs=${4:-28}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
started=$(date +%s)
mkdir -p /tmp/ml && tar xzf .gpu/pool.tgz -C /tmp/ml
python3 - <<'PY'
import json, os, torch, transformers
from transformers import AutoModel, AutoTokenizer
source = os.environ.get("ML_MODEL", ".gpu/model")
model = AutoModel.from_pretrained(source, dtype=torch.float32)  # fp16 on the wire, fp32 as on the CPU
model.float().save_pretrained("/tmp/ml/all-MiniLM-L6-v2")
AutoTokenizer.from_pretrained(source).save_pretrained("/tmp/ml/all-MiniLM-L6-v2")
cuda = torch.cuda.is_available()
hw = {"device": "cuda" if cuda else "cpu", "name": torch.cuda.get_device_name(0) if cuda else "cpu",
      "torch": torch.__version__,
      "transformers": transformers.__version__, "cpus": os.cpu_count()}
json.dump(hw, open(os.environ["OUT"] + "/hardware.json", "w"))
print(hw)
PY
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/smi.csv" 2>/dev/null &
smi=$!
new=trec_fine,sst5,clinc150,hwu64,snips,bbc_news,go_emotions,paws,emobank_valence
timeout $(python3 -c "print(int($minutes * 60 + 75))") python3 -m metalearning collect --pool /tmp/ml/pool \
    --results "$OUT/trials.jsonl" --model /tmp/ml/all-MiniLM-L6-v2 --seeds "$seeds" --first-configs "$first_configs" \
    --first-tasks "$new" --workers "$workers" --threads 1 --predictions /tmp/ml/preds --cache-dir /tmp/ml/cache \
    --minutes "$minutes" ${ML_TASKS:+--tasks $ML_TASKS} > "$OUT/log" 2>&1
echo "collect exit $? after $(( $(date +%s) - started ))s"
kill $smi 2>/dev/null
tail -3 "$OUT/log"; wc -l "$OUT/trials.jsonl"
tar czf /tmp/ml/preds.tgz -C /tmp/ml preds && split -b 15m -d /tmp/ml/preds.tgz "$OUT/preds.tgz."
ls -la "$OUT"; echo "done after $(( $(date +%s) - started ))s"
