#!/usr/bin/env bash
# Every GPU test and the benchmarks, in one command, on a machine with an NVIDIA GPU (a CUDA 13
# driver), PyTorch and Python >= 3.10 but no Rust: the wheel is built elsewhere
# (`cargo xtask gpu-bundle` writes it to .dev/gpu/) and carried along with the source tree.
#
#   bash scripts/gpu_suite.sh [WHEEL_DIR] [STEP ...]
#
# WHEEL_DIR defaults to the checkout's .dev/gpu. Steps, in the order given (default: tests linear trellis e2e):
#   tests    py/tests/test_cuda.py: every kernel against the CPU runtime (on an H100/H200, the affine
#            tests again with HYPERCODEC_WGMMA=0: the sm_80 GEMM above 64 rows)
#   linear   py/benches/cuda_linear.py: every route checked against the CPU runtime, then timed against
#            torch bf16 F.linear and torch's int4 kernel on 8192x8192 and 28672x8192, batches 1, 4, 16, 256
#   trellis  py/benches/cuda_trellis.py: the trellis kernels (1MAD and pair code) on 8192x8192, batches 1, 4, 16
#   e2e      py/benches/cuda_e2e.py: tokens/s of a 4-block Llama-shaped decoder, bf16 against compressed
#   gemm     py/benches/cuda_gemm.py: the affine GEMM for batches 17-64 (4096x4096, 8192x8192)
#   encode   py/benches/cuda_trellis_encode.py: the GPU trellis encoder of a 4096x4096 tensor at L = 16 (1MAD and pairs)
#   kv       py/benches/cuda_kv.py: the compressed KV cache's decode step (2 layers; needs transformers)
#   acts     py/benches/cuda_w8a8.py: quantized activations (FP8 E4M3 for int4, int4-row, z1-fixed4 and e8-fixed4,
#            int8 W8A8 for int8-row) against weight-only and bf16 on 8192x8192 and 28672x8192, batches 16-1024
#   prefix   py/benches/cuda_linear.py --skip-check: the format's prefix-coded E8 (e8@4-prefix) beside the rANS layer
#            (e8@4-gpu), bf16 and torch's int4 on 4096x4096, 8192x8192 and 28672x8192, batches 1, 4, 16, 64, 256
#   e2eprefix py/benches/cuda_e2e.py --specs e8@4-prefix,e8@4-gpu,int4: tokens/s of the 4-block decoder with
#            the entropy-coded E8 layers (prefix codes, rANS) beside INT4 and bf16
#   hopper   the Hopper GEMM (kernels/gemm_sm90a.cu; H100/H200 only; on unless HYPERCODEC_WGMMA=0):
#            py/tests/test_cuda.py -k hopper against the CPU runtime, then py/benches/cuda_gemm.py timing
#            each of its shapes (unsplit and split over clusters of 2) against bf16 and decode + cuBLAS on
#            4096x4096, 8192x8192, 14336x4096 and 28672x8192, batches 128, 256, 512
#   split    the tensor-core GEMM split over clusters (H100/H200; on by default, HYPERCODEC_GEMM_SPLIT):
#            py/tests/test_cuda.py's affine tests with it off, then py/benches/cuda_gemm_rows.py on 4096-column
#            layers of 1024-14336 rows at 9, 16, 17, 32, 64 rows: the rule, off, then 1, 2, 4, 8 blocks a cluster
#            forced (at 9 and 16 rows: the GEMM with two batch tiles against the tensor-core GEMV)
#   e8prefix py/benches/cuda_e8_prefix_prototype.py: the entropy-coded E8 prototype (WHEEL_DIR/e8p.cubin, which
#            gpu-bundle builds) against bf16 and the committed rANS layer on 4096x4096 and 8192x8192, batches 1, 16, 256
#
# Each step runs under `timeout` (its own limit below, or STEP_LIMIT seconds for every step) so
# that one slow step cannot take the rest down with it, and the default steps end within 550 s,
# inside a 10-minute remote command; its output goes to $OUT/<step>.txt (OUT defaults to the checkout's .dev/gpu-out),
# and its row of the summary (step, exit status, seconds) is printed as it ends and kept in
# $OUT/summary.md. Exits 0 only when every step passed; 2 where torch sees no CUDA device or the
# kernels do not load on it (saying why); 3 where the wheel cannot be installed or imported.
set -u -o pipefail

known="tests linear trellis e2e gemm encode kv acts prefix e2eprefix hopper split e8prefix"
is_step() { [[ " $known " == *" $1 "* ]]; }

root=$(cd "$(dirname "$0")/.." && pwd)
wheels=$root/.dev/gpu
if [ $# -gt 0 ] && ! is_step "$1"; then
    wheels=$1
    shift
fi
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests linear trellis e2e)
for step in "${steps[@]}"; do
    is_step "$step" || { echo "gpu_suite: unknown step '$step' (one of: $known)" >&2; exit 1; }
done
# Paths given relative to where the script was called from.
[ -d "$wheels" ] || { echo "gpu_suite: no folder $wheels" >&2; exit 3; }
wheels=$(cd "$wheels" && pwd)
out=${OUT:-$root/.dev/gpu-out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
cd "$root" || exit 1

wheel=$(ls -t "$wheels"/hypercodec-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
    echo "gpu_suite: no hypercodec wheel in $wheels (build one with: cargo xtask gpu-bundle)" >&2
    exit 3
fi
site=$(mktemp -d /tmp/hypercodec-site.XXXXXX)
trap 'rm -rf "$site"' EXIT
PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
    --target "$site" "$wheel" || {
    echo "gpu_suite: could not install $wheel" >&2
    exit 3
}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$py" - <<'EOF'
import sys
try:
    import torch
    import hypercodec
    import hypercodec.cuda as hcuda
except Exception as e:  # a wheel for another platform, numpy or torch missing
    print(f"gpu_suite: cannot import hypercodec with torch: {e!r}", file=sys.stderr)
    sys.exit(3)
if not torch.cuda.is_available():
    print("gpu_suite: torch sees no CUDA device; nothing here runs without one", file=sys.stderr)
    sys.exit(2)
try:
    hcuda.kernels(0)  # the PTX loads on the device (PTX ISA 9.0: a CUDA 13 driver)
except hypercodec.HypercodecError as e:
    print(f"gpu_suite: the kernels do not load on {torch.cuda.get_device_name(0)}: {e}", file=sys.stderr)
    sys.exit(2)
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB; "
      f"torch {torch.__version__} (CUDA {torch.version.cuda}); hypercodec {hypercodec.__version__} from {hypercodec.__file__}")
EOF
ready=$?
[ $ready -ne 0 ] && exit $ready

# The hopper step: two commands under one time limit (timeout runs it through bash).
hopper_step() {
    "$py" -m pytest -q -rs py/tests/test_cuda.py -k hopper &&
        "$py" py/benches/cuda_gemm.py --skip-committed --wgmma crates/kernels-cuda/ptx/gemm_sm90a.ptx \
            --shapes 4096x4096,8192x8192,14336x4096,28672x8192 --batches 128,256,512 --iters 20 --out "$out/hopper.md"
}
export -f hopper_step
# The split step: the affine tests with the split GEMM off (the tests step ran them with it on),
# then its sweep (each setting a process of its own: the kernels read HYPERCODEC_GEMM_SPLIT when they
# load). "rule" is HYPERCODEC_GEMM_SPLIT=1, "off" 0.
split_step() {
    HYPERCODEC_GEMM_SPLIT=0 "$py" -m pytest -q -rs py/tests/test_cuda.py -k "affine or tensor_core or gemm or group" || return 1
    local ks env rc=0
    for ks in rule off 1 2 4 8; do
        case $ks in rule) env=1 ;; off) env=0 ;; *) env="ks=$ks,from=9" ;; esac
        echo "## HYPERCODEC_GEMM_SPLIT=$env, 9-64 rows"
        HYPERCODEC_GEMM_SPLIT=$env "$py" py/benches/cuda_gemm_rows.py --mb 100 --rows 1024,2048,4096,14336 --cols 4096 \
            --specs int4 --batches 9,16,17,32,64 --groups "" || rc=1
    done
    return $rc
}
export -f split_step
# The tests step: every CUDA test, then (on compute capability 9.0, where the Hopper GEMM takes
# 4-bit layers above 64 rows) the affine tests again with it off, so that the sm_80 GEMM's large
# batches run too (a process of their own: the kernels are loaded once a process).
tests_step() {
    "$py" -m pytest -q -rs py/tests/test_cuda.py || return 1
    if [ "$("$py" -c 'import torch; print(torch.cuda.get_device_capability() == (9, 0))')" = True ]; then
        HYPERCODEC_WGMMA=0 "$py" -m pytest -q -rs py/tests/test_cuda.py -k "affine or tensor_core or gemm"
    fi
}
export -f tests_step
export py out

summary="$out/summary.md"
printf '| step | exit | seconds |\n|---|---:|---:|\n' > "$summary"
status=0
for step in "${steps[@]}"; do
    case $step in
        tests) limit=220 cmd=(bash -c tests_step) ;;
        linear) limit=150 cmd=("$py" py/benches/cuda_linear.py --quick --sizes 8192x8192,28672x8192
                               --batches 1,4,16,256 --iters 100 --out "$out/linear.md") ;;
        trellis) limit=90 cmd=("$py" py/benches/cuda_trellis.py --sizes 8192x8192 --batches 1,4,16
                               --out "$out/trellis.md") ;;
        e2e) limit=90 cmd=("$py" py/benches/cuda_e2e.py --layers 4 --iters 30 --out "$out/e2e.md") ;;
        gemm) limit=150 cmd=("$py" py/benches/cuda_gemm.py --shapes 4096x4096,8192x8192 --batches 17,32,64
                             --out "$out/gemm.md") ;;
        encode) limit=120 cmd=("$py" py/benches/cuda_trellis_encode.py --sizes 4096x4096 --configs 16:2:1024,16:2:1024:2,16:1:1024:2
                               --out "$out/encode.md") ;;
        kv) limit=150 cmd=("$py" py/benches/cuda_kv.py --layers 2 --context 1024) ;;
        acts) limit=260 cmd=("$py" py/benches/cuda_w8a8.py --sizes 8192x8192,28672x8192 --batches 16,64,256,1024
                             --specs int4:fp8,int4-row:fp8,z1-fixed4:fp8,e8-fixed4:fp8,int8-row:int8) ;;
        prefix) limit=240 cmd=("$py" py/benches/cuda_linear.py --skip-check --sizes 4096x4096,8192x8192,28672x8192
                               --batches 1,4,16,64,256 --specs e8@4-prefix,e8@4-gpu --iters 100 --out "$out/prefix.md") ;;
        e2eprefix) limit=200 cmd=("$py" py/benches/cuda_e2e.py --layers 4 --iters 30 --specs e8@4-prefix,e8@4-gpu,int4
                                  --out "$out/e2eprefix.md") ;;
        hopper) limit=200 cmd=(bash -c hopper_step) ;;
        split) limit=450 cmd=(bash -c split_step) ;;
        e8prefix) limit=420 cmd=("$py" py/benches/cuda_e8_prefix_prototype.py "$wheels/e8p.cubin"
                                 --shapes 4096x4096,8192x8192 --batches 1,16,256) ;;
    esac
    limit=${STEP_LIMIT:-$limit}
    echo "== $step: ${cmd[*]}"
    t0=$(date +%s)
    timeout "$limit" "${cmd[@]}" 2>&1 | tee "$out/$step.txt"
    rc=${PIPESTATUS[0]}
    row="| $step | $rc$([ "$rc" -eq 124 ] && echo " (over ${limit} s)") | $(($(date +%s) - t0)) |"
    echo "$row" >> "$summary"
    echo "gpu_suite: $row"
    [ "$rc" -ne 0 ] && status=1
done
echo
cat "$summary"
exit $status
