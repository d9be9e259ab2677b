# Sourced by the GPU bench scripts: moves to the repository root, makes $out,
# records the GPUs, builds and installs the CUDA flavour (no download) and
# keeps NVLink multicast off.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpus.txt"
HETJAX_GPU=cuda python -m pip install --no-build-isolation --no-deps -e . > "$out/pip.log" 2>&1 \
  || { tail -40 "$out/pip.log"; exit 1; }
