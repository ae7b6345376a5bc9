"""Search for the best delta of a task: YAML spaces, an Optuna study as the record, trials on Ray Tune.

Nothing heavy is imported here. The parts:

- `run.run_search(SearchOptions(...))`: the whole search (what `autopelt search` runs).
- `plan`: options -> a checked SearchPlan (no writes); `study`: create or resume the study;
  `controller`: the only writer of the study (claims, parameter budget, baselines, records);
  `ray_backend`: the only module that imports Ray; `view`: live lines and the summary;
  `claims` / `recovery`: exact budgets across processes, interrupted trials; `fakes`: stand-ins for tests.
- `space.load_space(name)`: the YAML search spaces.
"""
