"""Stage 5: the fits.json document (``results.analyze``), the verdict's first lines (``headline``), report.md
and the PNGs."""
