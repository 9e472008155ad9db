"""The sweep: an Optuna study driven by ask/tell, one child process per trial.

Optuna owns the search state (its tables, ``sweeper.store.optuna``); each trial's typed
measurement and projected cost go into our tables in the same database. The objective is
$/run (minimize), never it/s. One noun per module:

    run.py        run_sweep: one worker's share of a sweep, start to end (SweepReport)
    prepare.py    the workload's data and tokenizer, the fork server, preflight
    queue.py      what runs first: known configs, interrupted and lost ones once more
    worker.py     this process as a worker of its study: membership, heartbeat, reaper
    fleet.py      N worker processes of one study on one machine (``launch --workers``)
    clock.py      the machine time a sweep uses, charged to its study
    loop.py       ask → rule out → claim → execute → tell (SearchLoop)
    rules.py      skip rules: outside the space, failed preflight, measured, OOM-dominated
    remeasure.py  measuring again: shared machine, drift, the best configs' noise
    stopping.py   the time budget, patience and planned runs
    executor.py   running one config: the TrialExecutor interface and the child executor
    outcome.py    what one config gave, as the loop keeps it
    observer.py   what the CLI (or a test) hears while a sweep runs
"""
