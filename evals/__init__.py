"""Reproducible benchmarks: each prints a table, writes JSON and can draw a plot."""
