#!/usr/bin/env bash
# The relaunch our users do by hand today, written down as faithfully as we can, for the benchmark
# (tests/bench/relaunch_vs_manual.py) to time against playbooks/relaunch.yml:
#   kill -9 the server, sleep, check GPU memory (an NVML query through nvidia-ml-py stands in for
#   nvidia-smi), sleep again while it is not clean, start the new server in the background, and
#   poll /health every few seconds until it answers.
# Usage: manual_relaunch.sh PYTHON PORT GPU MODEL DRAFT_MODEL STEPS TOPK DRAFT_TOKENS LOG PIDFILE
set -uo pipefail
python=$1 port=$2 gpu=$3 model=$4 draft=$5 steps=$6 topk=$7 draft_tokens=$8 log=$9 pidfile=${10}
fixed_sleep=${MANUAL_FIXED_SLEEP:-5}
health_poll=${MANUAL_HEALTH_POLL:-5}

# Any SGLang command line on this port (`python -m sglang.launch_server ...` or `sglang serve ...`).
pkill -9 -f -- "sglang.* --port $port( |$)"
sleep "$fixed_sleep"
until "$python" -c "
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex($gpu)
raise SystemExit(0 if n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used < 64 << 20 else 1)
"; do
  sleep "$fixed_sleep"
done
CUDA_VISIBLE_DEVICES=$gpu setsid nohup "$python" -m sglang.launch_server --model-path "$model" --port "$port" \
  --speculative-algorithm EAGLE --speculative-draft-model-path "$draft" --speculative-num-steps "$steps" \
  --speculative-eagle-topk "$topk" --speculative-num-draft-tokens "$draft_tokens" >"$log" 2>&1 &
echo $! >"$pidfile"
until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
  sleep "$health_poll"
done
