"""Model FLOPs utilisation: the model TFLOP/s a device reached over its
datasheet peak, where the job knows its devices' card.

The peaks are NVIDIA's dense tensor-core figures (no sparsity) per GPU:
bfloat16 for `--dtype bfloat16`, TF32 for float32 (XLA runs float32 dots on
TF32 tensor cores by default). The card comes from nvidia-smi, so only local
NVIDIA islands are known; a CPU island, an AMD or remote one has no peak
here, and a job with any such device reports no MFU rather than a wrong one.
"""

from __future__ import annotations

# (part of nvidia-smi's name, {compute dtype: peak TFLOP/s}); the first match wins.
PEAK_TFLOPS = (
    ("H100 PCIe", {"bfloat16": 756.0, "float32": 378.0}),
    ("H100 NVL", {"bfloat16": 835.0, "float32": 417.5}),
    ("H200 NVL", {"bfloat16": 835.0, "float32": 417.5}),
    ("H100", {"bfloat16": 989.4, "float32": 494.7}),
    ("H200", {"bfloat16": 989.4, "float32": 494.7}),
    ("A100", {"bfloat16": 312.0, "float32": 156.0}),
)


def card_peak_tflops(card_name: str, dtype: str) -> float | None:
    """The card's dense peak for the compute dtype; None for a card not in PEAK_TFLOPS."""
    return next((peaks.get(dtype) for part, peaks in PEAK_TFLOPS if part in card_name), None)


def peak_tflops_per_device(job, card_of=None) -> float | None:
    """The mean peak TFLOP/s over the devices the job trains on (those
    `tflops_per_device` is averaged over), or None where any device's peak
    is unknown. `card_of(ids)`: (name, memory) of local NVIDIA GPUs
    (hetjax.local_gpus.nvidia_card)."""
    if card_of is None:
        from hetjax.local_gpus import nvidia_card as card_of
    islands = job.island_list()
    if job.parallel == "data":
        used = range(len(islands))
    else:
        used = sorted({i for r in range(job.replicas) for i in job.stage_islands(r)})
    total, devices = 0.0, 0
    for isl in (islands[i] for i in used):
        local = all(h in ("127.0.0.1", "localhost") for h in isl.hosts)
        if isl.platform != "cuda" or not local:
            return None
        ids = isl.device_ids if isl.device_ids is not None else tuple(range(isl.total_devices))
        card = card_of(ids)
        peak = card_peak_tflops(card[0], job.dtype) if card else None
        if peak is None:
            return None
        total += peak * isl.total_devices
        devices += isl.total_devices
    return total / devices if devices else None
