"""vlrl.report: self-contained HTML reports of training runs (``write_report``) and the pieces the
pytest-html extras reuse (figures, rollout strips). matplotlib is imported only when a figure is drawn."""
