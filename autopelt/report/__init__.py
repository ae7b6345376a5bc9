"""`autopelt report`: a study as one self-contained HTML file. Its numbers (`data`, `contents`, `importance`),
its figures (`plots`), its page (`page` and the template beside it)."""
