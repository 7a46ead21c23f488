#!/usr/bin/env bash
# GPU check of Optimus Lens: the CUDA tests, then `optimus bench` on recsys_towers32 and on
# industrial-scale towers (optimus_lens.sample_models.perf:industrial_towers), inference and training, eager
# and compiled (Inductor), against upstream's pre-grad passes and the hand-fused reference.
#
#   scripts/gpu_check.sh OUT_DIR
#
# Writes into OUT_DIR: env.json (GPU, torch, CUDA), tests.txt (pytest output), one
# bench_<model>_<mode>.json and .txt per run, and summary.txt (the ratios the issue's
# targets are stated in). Exit status: 0 all ran; 1 a test or a bench failed (the others
# still run); 2 bad usage or no CUDA.
#
# Environment (for a CPU dry run of the plumbing, or a shorter run):
#   PYTHON             interpreter with torch and this package's dependencies (default: python3)
#   GPU_CHECK_DEVICE   cuda (default) or cpu
#   GPU_CHECK_MODELS   space-separated model specs (default: the two above)
#   GPU_CHECK_MODES    default: "inference training"
#   GPU_CHECK_REPEATS  timed rounds per bench (default: 50)
#   GPU_CHECK_COMPILE  1 (default) to time under torch.compile too, 0 not
#   GPU_CHECK_TESTS    1 (default) to run the CUDA tests, 0 not
#   GPU_CHECK_TIMEOUT  seconds allowed to the tests and to each bench (default: 900); one that
#                      runs over is stopped, counted as failed, and the others still run
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
OUT=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
MODELS=${GPU_CHECK_MODELS:-"sample:recsys_towers32 optimus_lens.sample_models.perf:industrial_towers"}
MODES=${GPU_CHECK_MODES:-"inference training"}
REPEATS=${GPU_CHECK_REPEATS:-50}
COMPILE=${GPU_CHECK_COMPILE:-1}
TESTS=${GPU_CHECK_TESTS:-1}
LIMIT=${GPU_CHECK_TIMEOUT:-900}

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" - "$DEVICE" > "$OUT/env.json" <<'PYEOF'
import json, platform, sys
import torch
device = sys.argv[1]
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device: run this on a GPU machine (or set GPU_CHECK_DEVICE=cpu for a dry run)")
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                  "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                  "gpus": torch.cuda.device_count()}, indent=1))
PYEOF
then
    exit 2
fi
echo "environment: $(tr -d '\n' < "$OUT/env.json")"

status=0
if [ "$TESTS" = 1 ]; then
    echo "== CUDA tests"
    if ! timeout "$LIMIT" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_compile.py tests/test_prepack.py \
            > "$OUT/tests.txt" 2>&1; then
        status=1
    fi
    tail -n 3 "$OUT/tests.txt"
fi

extra=(--against-upstream --final-only --repeats "$REPEATS" --device "$DEVICE")
[ "$COMPILE" = 1 ] && extra+=(--compile)
for model in $MODELS; do
    name=${model##*:}
    for mode in $MODES; do
        echo "== bench $model $mode"
        if timeout "$LIMIT" "$PY" -m optimus_lens bench "$model" --mode "$mode" "${extra[@]}" \
                --json "$OUT/bench_${name}_${mode}.json" > "$OUT/bench_${name}_${mode}.txt" 2>&1; then
            cat "$OUT/bench_${name}_${mode}.txt"
        else
            status=1
            tail -n 20 "$OUT/bench_${name}_${mode}.txt"
        fi
    done
done

"$PY" - "$OUT" > "$OUT/summary.txt" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("bench_*.json")):
    d = json.loads(f.read_text())
    st = {s["name"]: s for s in d["stages"]}
    base = st["baseline"]
    ours = [s for s in d["stages"] if s["kind"] in ("baseline", "pass", "prepack")][-1]
    line = [f"{f.stem}: {d['device']} {d['mode']}", f"ours {ours['speedup_vs_baseline']:.2f}x eager"]
    if "compiled_latency_ms_median" in ours:
        line.append(f"ours+Inductor vs Inductor {ours['compiled_speedup_vs_baseline']:.2f}x")
        if ours.get("compiled_peak_bytes") and base.get("compiled_peak_bytes"):
            line.append(f"compiled peak {ours['compiled_peak_bytes'] / base['compiled_peak_bytes']:.2f}x")
    line.append(f"peak {ours['peak_bytes'] / base['peak_bytes']:.2f}x")
    line += [f"{k} {v:.2f}x" for k, v in d["ratios"].items()]
    print("; ".join(line))
PYEOF
cat "$OUT/summary.txt"
exit $status
