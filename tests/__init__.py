"""hetjax's test suite (a regular package, so that `tests.*` imports find it before any
other distribution's top-level `tests`)."""
