"""Runtime capture: the range helper (NVTX + record_function + range log) and the profiler / nsys bracket."""
