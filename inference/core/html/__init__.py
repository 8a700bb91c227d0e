"""Self-contained HTML pages: one file holding its CSS, script, data and plots inline, that
opens from disk and makes no network request (`page.write_page`), with inline SVG charts
(`svg`). The run report (`inference/eval/html_report.py`) and `eval-filter`'s page
(`training/evaluation/filter_eval_html.py`) are built on it."""
