"""Weight sync learner -> sampler: the fail-stop driver, the seven invariants and the fault injector."""
