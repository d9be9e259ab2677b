"""Stands in for IPython in the processes a test session starts, as if it
were not installed (tests/conftest.py puts this folder first on their
PYTHONPATH). flax.nnx imports IPython when it is imported, only to ask
whether it runs in a notebook, which costs every process half a second of
CPU when IPython is installed; no process of the suite runs in one."""

raise ImportError("IPython is left out of the processes of the test suite (tests/without_ipython)")
