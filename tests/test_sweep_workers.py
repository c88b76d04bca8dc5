"""Several sweep workers on one study, on a real PostgreSQL server and on a journal file: the
study's total is kept, no setting is trained twice, and a worker killed mid-trial has that trial
failed by its silent heartbeat and re-run by another worker."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest

from project.extras.sweep.study import load_study, open_storage, storage_url
from project.extras.sweep.workers import BEAT, StaleWatch
from tests.conftest import REPO, TRAIN_CONFIG, cli, free_port

DONE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def _postgres_bin() -> Path | None:
    if shutil.which("initdb") and shutil.which("pg_ctl"):
        return Path(shutil.which("initdb")).parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))  # Debian keeps them off PATH
    return found[-1].parent if found else None


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (initdb + pg_ctl in a temporary folder); its URL."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (make servers installs them)")
    folder = Path(tempfile.mkdtemp(prefix="project-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: the cluster belongs to 'postgres'
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to own the test cluster")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    port, data = free_port(), folder / "data"
    subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "sweep", "--auth=trust",
                    "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"),
                    "-w", "-o", f"-h 127.0.0.1 -p {port} -k {folder}", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://sweep@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _worker_args(data: Path, storage: str, n_trials: int) -> list[str]:
    """``make sweep-worker`` on tiny data: the debug preset, cut to 1 epoch of 5 batches per trial."""
    return [sys.executable, "-m", "project", "sweep", "--config", str(TRAIN_CONFIG),
            "--config", str(REPO / "configs/presets/debug.yaml"), f"--data.data_dir={data}",
            "--model.input.size=32", "--model.weights=null", "--data.batch_size=8",
            "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
            "--sweep", str(REPO / "configs/sweep.yaml"),
            "--study", "shared", "--n_trials", str(n_trials), "--storage", storage, "--heartbeat", "2"]


def _trials(storage: str) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="shared", storage=open_storage(storage_url("shared", storage)))
    return study.get_trials()


def _log(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.is_file() else ""


@pytest.mark.distributed
@pytest.mark.parametrize(("kind", "n_trials"), [("postgresql", 4), ("journal", 4)])
def test_three_workers_fill_one_study_and_a_killed_worker_s_trial_is_retried(kind, n_trials, request,
                                                                              tiny_data, tmp_path):
    """The study sizes keep the suite short: twelve trials on PostgreSQL were run by hand on the
    demo (docs/past-one-machine.md)."""
    storage = request.getfixturevalue("postgres") if kind == "postgresql" else str(tmp_path / "study.log")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = []
    for log in logs:  # started at once, the same command in three shells
        with open(log, "w") as out:
            procs.append(subprocess.Popen(_worker_args(tiny_data, storage, n_trials), cwd=tmp_path, env=env,
                                          stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    victim = procs[0]
    try:
        deadline = time.monotonic() + 600
        killed = None
        while killed is None and time.monotonic() < deadline and victim.poll() is None:
            if "runs in" in _log(logs[0]):  # its study is open: safe to read beside it
                mine = [t for t in _trials(storage) if t.state == optuna.trial.TrialState.RUNNING
                        and t.user_attrs.get("worker", "").endswith(f":{victim.pid}")]
                trial_log = Path(mine[0].user_attrs["run_dir"]) / "train.log" if mine else None
                # the trial is marked running (with its folder) a moment before its log is created
                if trial_log is not None and trial_log.exists() and trial_log.stat().st_size > 0:
                    killed = mine[0]
                    break
            time.sleep(0.5)
        assert killed is not None, _log(logs[0])
        victim.send_signal(signal.SIGKILL)  # the worker alone: its training run gets SIGTERM (pdeathsig)
        for proc, log in zip(procs[1:], logs[1:], strict=True):
            assert proc.wait(timeout=900) == 0, _log(log)
    finally:  # whatever is left of each worker's session: the worker, its training run
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    trials = _trials(storage)
    finished = [t for t in trials if t.state in DONE]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(finished) == n_trials, [(t.number, t.state.name) for t in trials]
    assert [t.number for t in failed] == [killed.number]  # the killed one, failed by its silence
    assert "stopped beating" in failed[0].user_attrs["error"]
    retry = [t for t in finished if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retry) == 1 and retry[0].params == killed.params  # its settings, re-run once
    assert retry[0].user_attrs["worker"] != killed.user_attrs["worker"]
    settings = [json.dumps(t.params, sort_keys=True) for t in finished]
    assert len(set(settings)) == n_trials  # no parameter set trained twice
    shared = tmp_path / "logs/sweeps/shared"
    for t in finished:  # every worker's runs in the one run folder, each with its result
        assert Path(t.user_attrs["run_dir"]).parent == shared.resolve()
        assert (Path(t.user_attrs["run_dir"]) / "sweep_result.json").is_file()
    workers = {t.user_attrs["worker"] for t in finished}
    assert len(workers) >= 2  # the two survivors both took trials

    report_dir = tmp_path / "reporter"  # any machine, any time: the study's own arguments
    report_dir.mkdir()
    assert cli(["sweep", "--report", "--study", "shared", "--storage", storage], report_dir) == 0
    table = (report_dir / "logs/sweeps/shared/trials.csv").read_text().splitlines()
    assert len(table) == 1 + len(trials) and "worker" in table[0]
    assert (report_dir / "logs/sweeps/shared/best.yaml").is_file()


def test_a_trial_is_stale_only_after_its_counter_stood_still_for_the_grace_period(monkeypatch):
    """Staleness by this worker's own clock: an unchanged counter, never a comparison of times."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    watch = StaleWatch(grace=6)

    def running(beat):
        return optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, system_attrs={BEAT: beat})

    trial = running(1)
    assert watch.stale([trial]) == []
    now[0] += 5
    assert watch.stale([running(2)]) == []  # it beat: the clock starts again
    now[0] += 5
    assert watch.stale([running(2)]) == []
    now[0] += 2
    assert len(watch.stale([running(2)])) == 1  # 7 s without a beat


def test_report_of_a_missing_study_names_the_storage(tmp_path):
    from project.errors import ConfigError

    with pytest.raises(ConfigError, match="no study storage at journal file"):
        load_study("nope", str(tmp_path / "missing.log"))
    with pytest.raises(ConfigError, match="cannot open the study database postgresql\\+psycopg2://u:\\*\\*\\*@127"):
        open_storage(storage_url("s", f"postgresql://u:secret@127.0.0.1:{free_port()}/db"))
