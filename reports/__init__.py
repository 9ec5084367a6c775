"""The report: stored results (suite JSON, asv results) -> reports/out/ (index.html and CSVs).

Modules: inputs (reading and merging results), runner (child processes of `attnspec run`),
writer (atomic folder swap), build (the whole report), tables/plots/page (pandas,
matplotlib and HTML; imported only when a report is built), asv_results (asv's format).
Importing this package loads neither pandas nor matplotlib.
"""
