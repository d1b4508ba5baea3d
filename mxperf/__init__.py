"""mxperf: does MXFP8 pay off for your RL run, where does the time go, is your sampler on the learner's grid?

The importable packages follow the data flow: ``tracing`` (raw trace -> event tables -> metrics),
``perfmodel`` (cost-model fits, breakeven), ``dashboards`` (Streamlit), and ``pipeline`` (the RL loop that
produces runs). This package is the top floor: the ``mxperf`` command line (``cli``, ``commands/``).
"""

from tracing.outputs.version import __version__

__all__ = ["__version__"]
