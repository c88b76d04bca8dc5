"""Workers sharing one study: trials are claimed one at a time, each running trial beats, and a
trial whose worker went silent is failed and its parameters queued again.

Optuna keeps a heartbeat only for RDB storages and only inside ``study.optimize``; the sweep asks
for its trials itself (so that it can claim them under a lock and never overshoot the study's
total), so the heartbeat lives here, the same for every storage: a counter in the running
trial's system attributes, bumped every ``interval`` seconds. A trial is stale once this worker
has seen its counter unchanged for ``grace`` seconds of its own clock, so machines need not
agree on the time.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
import time
from collections.abc import Iterator

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from project.extras.sweep.study import database_errors, storage_file

BEAT = "project:heartbeat"
# Optuna 4.9 renamed the callback that re-queues a dead worker's trial
_Retry = (getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
          or optuna.storages.RetryFailedTrialCallback)


class Heartbeat:
    """While a trial runs, bump its counter every ``interval`` seconds from a thread."""

    def __init__(self, storage: BaseStorage, trial_id: int, interval: float) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="sweep-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _beat(self) -> None:
        count = 0
        while True:
            count += 1
            try:
                self.storage.set_trial_system_attr(self.trial_id, BEAT, count)
            except UpdateFinishedTrialError:
                return  # failed by another worker that stopped hearing it; tell() says so
            except (OSError, SQLAlchemyError) as err:  # a database or file hiccup: beat again
                print(f"warning: heartbeat of the running trial not recorded ({err})", flush=True)
            if self.stop.wait(self.interval):
                return


class StaleWatch:
    """Which running trials have not beaten for ``grace`` seconds, as this worker saw them."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.seen: dict[int, tuple[object, float]] = {}  # trial number -> (counter, seen since)

    def stale(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        now, seen, out = time.monotonic(), {}, []
        for t in trials:
            if t.state != TrialState.RUNNING:
                continue
            beat = t.system_attrs.get(BEAT)
            before = self.seen.get(t.number)
            seen[t.number] = before if before is not None and before[0] == beat else (beat, now)
            if now - seen[t.number][1] > self.grace:
                out.append(t)
        self.seen = seen
        return out


def fail_stale(study: optuna.Study, storage: BaseStorage, watch: StaleWatch) -> list[int]:
    """Mark the stale trials FAIL and queue each one's parameters once more (Optuna's retry
    callback: the new trial records ``failed_trial`` in its system attributes); their numbers."""
    study_id = storage.get_study_id_from_name(study.study_name)
    failed = []
    for t in watch.stale(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        try:
            storage.set_trial_user_attr(trial_id, "error", f"its worker ({t.user_attrs.get('worker')}) "
                                        f"stopped beating for {watch.grace:g} s: killed or cut off")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue  # it finished (or another worker failed it) meanwhile
        _Retry(max_retry=1)(study, storage.get_trial(trial_id))
        failed.append(t.number)
    return failed


@contextlib.contextmanager
def claim_lock(url: str, study: str) -> Iterator[None]:
    """Serialise claiming a trial across workers: counting the trials under way and asking for
    a new one must be one step, or two workers both take the last slot. A file lock for a
    journal or SQLite file (one machine), an advisory lock for PostgreSQL; other databases go
    without (a worker may then start one trial beyond ``--n_trials``)."""
    if url.startswith("postgresql"):  # the lock is the connection's: released if the worker dies
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        key = {"key": f"project-sweep:{study}"}
        with database_errors(url):
            engine = create_engine(url, poolclass=NullPool)
            con = engine.connect()
            con.execute(text("SELECT pg_advisory_lock(hashtext(:key))"), key)
        try:
            yield
        finally:
            con.execute(text("SELECT pg_advisory_unlock(hashtext(:key))"), key)
            con.close()
            engine.dispose()
        return
    path = storage_file(url)
    if path is None:
        yield
        return
    with open(f"{path}.claim", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel if this process dies
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

