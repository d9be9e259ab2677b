"""HETJAX_TEST_GPU_MEMBER_RANK=r: rank r stands in for a GPU island's process.

Sets what hetjax/bridge/runtime.py sets beside a GPU island
(_native.set_channel_members), so every group has a GPU member and the CPU
handlers run the channel collectives on the host device
(cc/ffi/collectives/channel_choice.h). Workers print the paths their ops
took (print_paths); tests read them back (printed_paths).
"""

import json
import os
import re


def maybe_stand_in(info) -> None:
    import hetjax._native as native

    if os.environ.get("HETJAX_TEST_GPU_MEMBER_RANK"):
        gpu = int(os.environ["HETJAX_TEST_GPU_MEMBER_RANK"])
        native.set_channel_members([gpu], [r for r in range(info.world_size) if r != gpu])


def print_paths(info) -> None:
    import hetjax._native as native

    print(f"paths on rank {info.rank}: {json.dumps(native.collective_paths())}", flush=True)


def printed_paths(text: str) -> list[dict]:
    """Every rank's print_paths line in a job's output, as dicts."""
    return [json.loads(m) for m in re.findall(r"paths on rank \d+: (\{.*\})", text)]
