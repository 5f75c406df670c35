"""A background compile says how much CPU it has had against what one needs (issue 67, item 2): a Fit once
answered "still compiling in the background (1916 s so far) ... Press the button again in a minute" on a busy
2-core machine where the compile thread had had 16-24 s of CPU in 32 minutes."""

import threading
import time

from serve.background import Background, JobProgress, progress_note, starved, wait_for


def test_a_starved_compile_says_so_in_one_line_and_promises_no_time():
    note = progress_note(JobProgress(wall_s=1916, cpu_s=20, needed_cpu_s=180))
    assert "1916 s so far" in note and "20 s of CPU time" in note and "of the 180 s the last one here needed" in note
    assert "⚠ This machine is starving it: 1% of one core" in note and "\n" not in note
    assert "minute" not in note


def test_a_compile_given_the_cpu_it_asks_is_not_called_starved():
    progress = JobProgress(wall_s=60, cpu_s=50, needed_cpu_s=180)
    note = progress_note(progress)
    assert not starved(progress) and "⚠" not in note
    assert "about 156 s more at the share of CPU it has had" in note  # (180 - 50) / (50 / 60)


def test_what_a_compile_needs_is_said_unknown_until_one_has_finished_here():
    note = progress_note(JobProgress(wall_s=30, cpu_s=25, needed_cpu_s=None))
    assert "no earlier one has finished on this machine" in note
    assert "past that" in progress_note(JobProgress(wall_s=300, cpu_s=200, needed_cpu_s=180))
    assert "cannot be measured" in progress_note(JobProgress(wall_s=30, cpu_s=None, needed_cpu_s=None))
    assert not starved(JobProgress(wall_s=5, cpu_s=0.1, needed_cpu_s=None))  # too early to judge


def _spin(cpu_s: float, running: threading.Event | None = None, release: threading.Event | None = None) -> float:
    """Burn ``cpu_s`` seconds of this thread's CPU (then, with events, say so and wait for ``release``)."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        sum(range(1000))
    if running is not None:
        running.set()
        assert release.wait(60)
    return time.thread_time() - start


def test_a_job_reports_the_cpu_it_has_had_and_records_what_it_needed(tmp_path):
    needs = tmp_path / "needs.json"
    background = Background(needs)
    running, release = threading.Event(), threading.Event()
    job, _ = background.job(("compile", "m"), lambda: _spin(0.3, running, release))
    assert running.wait(60)
    during = background.progress(("compile", "m"))
    assert during is not None and not during.done and during.cpu_s >= 0.3 and during.needed_cpu_s is None
    release.set()
    assert wait_for(job, None) and job.result() >= 0.3
    done = background.progress(("compile", "m"))
    assert done.done and done.cpu_s >= 0.3 and done.needed_cpu_s == round(done.cpu_s, 2)  # recorded when it ended
    assert background.progress(("compile", "other")) is None


def test_a_later_job_knows_what_the_last_one_of_its_key_needed(tmp_path):
    needs = tmp_path / "needs.json"
    first = Background(needs)
    job, _ = first.job(("compile", "m"), lambda: _spin(0.2))
    assert wait_for(job, None)
    running, release = threading.Event(), threading.Event()
    second = Background(needs)
    job, _ = second.job(("compile", "m"), lambda: _spin(0.0, running, release))
    try:
        assert running.wait(60)
        progress = second.progress(("compile", "m"))
        assert progress.needed_cpu_s is not None and progress.needed_cpu_s >= 0.2
        assert f"of the {progress.needed_cpu_s:.0f} s the last one here needed" in progress_note(progress) or \
            "past that" in progress_note(progress)
    finally:
        release.set()
    assert wait_for(job, None)
