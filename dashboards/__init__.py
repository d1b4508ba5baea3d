"""Streamlit dashboard over finished output directories. Needs no torch."""
