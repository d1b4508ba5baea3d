"""Stage 4: the RL step per precision -- generate + logprob + update + sync (+ other) from the fits and the phase
sources, at the user's settings, with intervals, validation against measured steps and what-ifs."""
