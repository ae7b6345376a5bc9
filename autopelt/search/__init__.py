"""Search for the best delta of a task: YAML spaces, an Optuna study as the record, trials on Ray Tune.

Nothing heavy is imported here. The parts:

- `run.run_search(SearchOptions(...))`: the whole search (what `autopelt search` runs).
- `plan`: options -> a checked SearchPlan (no writes); `resume`: create or resume the study;
  `controller`: the only writer of the study (claims, parameter budget, baselines; what each trial trains is
  `draw`'s, what becomes of it `recorder`'s); `ray_backend`: the only module that imports Ray; `view`: live lines;
  `summary`: the end's; `claims` / `recovery`: exact budgets across processes, interrupted trials.
- `space.load_space(name)`: the YAML search spaces; `space_schema`: what they may name, derived from the delta
  spec.
- What a study holds, and which trial is best, is autopelt/study/'s (record, info, answers, storage).
"""
