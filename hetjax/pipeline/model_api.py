"""Where the models package is found: ``hetjax.models`` in a wheel, the
top-level ``models`` folder in a source checkout."""

try:
    import hetjax.models as models  # noqa: F401
except ImportError:
    import models  # noqa: F401

# Where a stage keeps the embedding matrix; with tied embeddings the head
# stage holds a copy under the same name (models/stage.py).
EMBEDDING_PATH = models.EMBEDDING_PATH
