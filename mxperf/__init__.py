"""mxperf: does MXFP8 pay off for your RL run, where does the time go, is your sampler on the learner's grid?

The importable packages follow the data flow: ``tracing`` (raw trace -> event tables -> metrics),
``perfmodel`` (cost-model fits, breakeven), ``dashboards`` (Streamlit), and ``pipeline`` (the RL loop that
produces runs). This package only holds the version and the ``mxperf`` command line.
"""

__version__ = "0.1.0"
