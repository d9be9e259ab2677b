"""Compute dtypes by name."""

import jax.numpy as jnp

# Compute dtypes by the names jobs and flags use.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def wire_dtype(name: str):
    """The dtype gradients cross the bridge in (a job's grad_wire), None for their own (float32)."""
    return None if name == "float32" else DTYPES[name]
