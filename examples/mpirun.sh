#!/bin/bash
# Open MPI MPMD: one app context per island of cluster_nvidia_amd.yaml, on the
# hosts the file names (hetjax builds the mpirun line):
#
#     examples/mpirun.sh
#
# which runs, for two islands of one process each,
#
#     mpirun --tag-output -np 1 --host gpu-nv-001:1 -x PATH -x ... python -m hetjax.job.worker runs/x/job.json \
#                       : -np 1 --host gpu-amd-001:1 -x PATH -x ... python -m hetjax.job.worker runs/x/job.json
#
# HETJAX_MPIRUN_ARGS adds options to mpirun (e.g. "--oversubscribe" or
# "--mca btl_tcp_if_include ib0"); as root hetjax adds --allow-run-as-root.
# The run folder must be on a file system every host sees.
set -euo pipefail
hetjax train llama3-8b --islands examples/cluster_nvidia_amd.yaml --launcher mpirun \
  --dtype bfloat16 --seq-len 4096 --batch 32 --microbatches 32 --steps 1000 --out runs/mpirun
