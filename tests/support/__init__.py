"""What the tests run on instead of training: a stand-in for `run_trial` (`fakes`), an example study
(`example_study`), a headless browser (`browser`). Subprocesses and Ray workers import it too (conftest puts
tests/ on PYTHONPATH)."""
