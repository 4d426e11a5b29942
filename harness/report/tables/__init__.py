"""The report's tables beside the verdict, one module per family: memory and max streams, soak, speculation (break-even,
explanation, roofline, K sweep), losslessness, prompts.

Each function takes run data (and the verdict table where it needs it) and returns one data frame with unit-carrying
column names; ``harness/report/build.py`` writes each as CSV and Parquet and shows it. Every column is defined in
docs/metrics.md.
"""
