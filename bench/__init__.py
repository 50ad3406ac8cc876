"""Benchmarks of the cleanup pipeline (``pipeline.py``) and of the console (``console.py``)."""
