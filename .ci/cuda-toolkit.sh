#!/usr/bin/env bash
# Installs the pieces of the CUDA toolkit that `cargo build --features cuda`
# needs into DIR (default .cuda/ in the repository), from NVIDIA's wheels on
# PyPI, so that a machine without a GPU or a system toolkit (CI) compiles
# and links candle's CUDA backend. Idempotent: does nothing when DIR already
# holds this toolkit. Prints nothing on success but the install itself.
#
# Why these wheels (docs/gpus.md says more):
# - CUDA 13.0, the first CUDA 13: the `nvidia-cuda-nvcc-cu12` wheels hold
#   ptxas only, no `nvcc`; the CUDA 13 `nvidia-cuda-nvcc` wheel has nvcc,
#   and `nvidia-nvvm` (cicc) and `nvidia-cuda-crt` (its headers) complete it.
#   cudarc 0.19 supports CUDA 13.0 to 13.4.
# - nvcc + crt + nvvm: candle-kernels compiles its .cu files with nvcc;
#   runtime + cccl: the headers they include and libcudart;
#   nvrtc, curand, cublas: the libraries cudarc links (`-lnvrtc -lcurand
#   -lcublas -lcublasLt`).
# - libcuda.so is the driver's and comes with no wheel: like the toolkit's own
#   lib/stubs/libcuda.so, a link-time stub is built from cuda.h (every
#   driver API entry point, soname libcuda.so.1), so the binary links here
#   and loads the real driver on a GPU machine. It never runs.
# - The wheels hold versioned libraries only (libcublas.so.13); the linker
#   wants libcublas.so, so unversioned links are added beside them.
set -euo pipefail

DIR=${1:-$(cd "$(dirname "$0")/.." && pwd)/.cuda}
PYTHON=${PYTHON:-python3}
ROOT="$DIR/nvidia/cu13"
STAMP="$DIR/.complete-13.0"

WHEELS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
  nvidia-curand==10.4.0.35
  nvidia-cublas==13.0.2.14
)

[ -f "$STAMP" ] && exit 0

command -v "$PYTHON" >/dev/null || { echo "cuda-toolkit: $PYTHON not found: install python3 and python3-pip" >&2; exit 1; }
command -v g++ >/dev/null || { apt-get update && apt-get install -y g++; }

rm -rf "$DIR"
mkdir -p "$DIR"
echo "cuda-toolkit: installing the CUDA 13.0 toolkit wheels into $DIR (about 1.2 GB)" >&2
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$DIR" "${WHEELS[@]}"

for lib in cudart nvrtc curand cublas cublasLt; do
  versioned=$(cd "$ROOT/lib" && ls "lib$lib.so."* | grep -E "^lib$lib\.so\.[0-9]+$" | head -n1)
  [ -n "$versioned" ] || { echo "cuda-toolkit: lib$lib.so.N missing under $ROOT/lib" >&2; exit 1; }
  ln -sfn "$versioned" "$ROOT/lib/lib$lib.so"
done

# The driver stub: one empty function per `cu*` entry point cuda.h declares,
# after the preprocessor (so the versioned names, cuMemAlloc_v2, appear).
mkdir -p "$ROOT/lib/stubs"
gcc -E -P -I "$ROOT/include" -x c "$ROOT/include/cuda.h" \
  | grep -oE '\bcu[A-Za-z0-9_]+[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u \
  | awk '{ print "void " $1 "(void) {}" }' >"$ROOT/lib/stubs/libcuda-stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$ROOT/lib/stubs/libcuda.so" "$ROOT/lib/stubs/libcuda-stub.c"
rm "$ROOT/lib/stubs/libcuda-stub.c"

"$ROOT/bin/nvcc" --version >/dev/null
touch "$STAMP"
