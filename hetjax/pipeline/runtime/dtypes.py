"""Compute dtypes by name."""

import jax.numpy as jnp

# Compute dtypes by the names jobs and flags use.
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
