#!/usr/bin/env bash
# Every GPU test and the benchmarks, in one command, on a machine with an NVIDIA GPU, PyTorch and
# Python >= 3.10 but no Rust: the wheel is built elsewhere (`cargo xtask gpu-bundle` writes it to
# .dev/gpu/) and carried along with the source tree.
#
#   bash scripts/gpu_suite.sh [WHEEL_DIR] [STEP ...]
#
# WHEEL_DIR defaults to .dev/gpu. Steps, in the order given (default: tests linear trellis e2e,
# about 6 minutes on an H200):
#   tests    py/tests/test_cuda.py: every kernel against the CPU runtime (fails the suite on a failure)
#   linear   py/benches/cuda_linear.py: every route checked against the CPU runtime, then timed against
#            torch bf16 F.linear and torch's int4 kernel on 8192x8192 and 28672x8192, batches 1, 4, 16, 256
#   trellis  py/benches/cuda_trellis.py: the trellis kernels (1MAD and pair code) on 8192x8192, batches 1, 4, 16
#   e2e      py/benches/cuda_e2e.py: tokens/s of a 4-block Llama-shaped decoder, bf16 against compressed
#   gemm     py/benches/cuda_gemm.py: the affine GEMM for batches 17-64 (4096x4096, 8192x8192)
#   encode   py/benches/cuda_trellis_encode.py: the GPU trellis encoder of a 4096x4096 tensor at L = 16
#   kv       py/benches/cuda_kv.py: the compressed KV cache's decode step (2 layers)
#
# Each step's output goes to $OUT/<step>.txt (OUT defaults to .dev/gpu/out); the last lines are a
# table of steps, exit statuses and seconds. Exits 0 only when every step passed; exits 2 at once,
# saying so, where torch sees no CUDA device.
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here" || exit 1
wheels=${1:-.dev/gpu}
[ $# -gt 0 ] && shift
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests linear trellis e2e)
out=${OUT:-.dev/gpu/out}
mkdir -p "$out"
py=${PYTHON:-python3}

wheel=$(ls -t "$wheels"/hypercodec-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
    echo "gpu_suite: no hypercodec wheel in $wheels (build one with: cargo xtask gpu-bundle)" >&2
    exit 1
fi
site=$(mktemp -d /tmp/hypercodec-site.XXXXXX)
"$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || {
    echo "gpu_suite: could not install $wheel" >&2
    exit 1
}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$py" - <<'EOF' || exit 2
import sys, torch, hypercodec
if not torch.cuda.is_available():
    print("gpu_suite: torch sees no CUDA device; nothing here runs without one", file=sys.stderr)
    sys.exit(2)
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB; "
      f"torch {torch.__version__} (CUDA {torch.version.cuda}); hypercodec {hypercodec.__version__} from {hypercodec.__file__}")
EOF

declare -a names codes secs
for step in "${steps[@]}"; do
    case $step in
        tests) cmd=("$py" -m pytest -q -rs py/tests/test_cuda.py) ;;
        linear) cmd=("$py" py/benches/cuda_linear.py --quick --sizes 8192x8192,28672x8192 --batches 1,4,16,256
                     --iters 100 --out "$out/linear.md") ;;
        trellis) cmd=("$py" py/benches/cuda_trellis.py --sizes 8192x8192 --batches 1,4,16 --out "$out/trellis.md") ;;
        e2e) cmd=("$py" py/benches/cuda_e2e.py --layers 4 --iters 30 --out "$out/e2e.md") ;;
        gemm) cmd=("$py" py/benches/cuda_gemm.py --shapes 4096x4096,8192x8192 --batches 17,32,64 --out "$out/gemm.md") ;;
        encode) cmd=("$py" py/benches/cuda_trellis_encode.py --sizes 4096x4096 --configs 16:2:1024 --out "$out/encode.md") ;;
        kv) cmd=("$py" py/benches/cuda_kv.py --layers 2 --context 1024) ;;
        *) echo "gpu_suite: unknown step '$step' (tests linear trellis e2e gemm encode kv)" >&2; exit 1 ;;
    esac
    echo "== $step: ${cmd[*]}"
    t0=$(date +%s)
    "${cmd[@]}" 2>&1 | tee "$out/$step.txt"
    rc=${PIPESTATUS[0]}
    names+=("$step") codes+=("$rc") secs+=("$(($(date +%s) - t0))")
done

status=0
echo
echo "| step | exit | seconds |"
echo "|---|---:|---:|"
for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${codes[$i]} | ${secs[$i]} |"
    [ "${codes[$i]}" -ne 0 ] && status=1
done
exit $status
