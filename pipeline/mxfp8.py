"""Public quantization API of mxperf (see SPEC "Quantization API"); the code lives in :mod:`pipeline.quant`."""

from pipeline.quant import *  # noqa: F403
from pipeline.quant import __all__  # noqa: F401
