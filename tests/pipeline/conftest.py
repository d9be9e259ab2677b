import pytest

import hetjax.launch
import hetjax.local_gpus


@pytest.fixture
def four_gpus_started(monkeypatch):
    """The worker specs `hetjax train` starts, on a faked machine of four
    NVIDIA GPUs with jax's CUDA plugin; none runs (each 'exits' 7)."""
    monkeypatch.setattr(hetjax.local_gpus, "gpu_count", lambda platform: 4 if platform == "cuda" else 0)
    monkeypatch.setattr(hetjax.local_gpus, "has_jax_plugin", lambda platform: True)
    launched = []
    monkeypatch.setattr(hetjax.launch, "run_local", lambda specs, **kw: launched.append(specs) or [7] * len(specs))
    return launched
