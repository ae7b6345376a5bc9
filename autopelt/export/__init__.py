"""A study after its search: `autopelt export` writes a trial as files to take away, `autopelt predict` uses them."""
