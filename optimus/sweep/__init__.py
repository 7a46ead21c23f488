"""Sweeps: every model x configuration, each run isolated, one row per run.

    optimus sweep 'sample:*' 'hf:*' --configs configs.json --out sweeps/today --workers 2

- :mod:`~optimus_lens.sweep.configs`: the configurations (named pipeline settings) and the
  model specs of a sweep;
- :mod:`~optimus_lens.sweep.task`: one run (a model under a config) done in this process
  into one plain-data row, and the row's fields;
- :mod:`~optimus_lens.sweep.isolate`: a run in a process of its own, with memory and time
  limits, so one bad model never takes the sweep down;
- :mod:`~optimus_lens.sweep.executors`: the runs spread over local worker slots or Ray tasks;
- :mod:`~optimus_lens.sweep.results`: the sweep directory's ``results.jsonl`` and
  ``configs.json``;
- :mod:`~optimus_lens.sweep.driver`: :func:`~optimus_lens.sweep.driver.sweep`, the whole
  sweep, resumable.

The sweep directory's ``summary.html`` is drawn by :mod:`optimus_lens.viz.sweep_summary`
(``optimus sweep`` writes it after every row).
"""
