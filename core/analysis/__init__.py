"""Analysis: statistics (``stats``), comparisons and their verdicts (``compare``), cost (``cost``),
accelerator peaks (``peaks``), the HTML study report (``report``) and committed evidence rendered for
the docs (``evidence``)."""
