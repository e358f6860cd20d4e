"""The attempts' chains verified by several processes, over ranges of attempt ids, with the
results merged in the order one process finds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attempts.audit_verify import chains
from attempts.audit_verify.chains import Verifier

# The worker processes' context (set in the parent before the fork, read in the children).
_WORKER: dict[str, Any] = {}


def _range_worker(task: tuple[int, int]) -> tuple:
    if "factory" not in _WORKER:
        _WORKER["factory"] = _WORKER["connect"]()
    verifier = Verifier(
        _WORKER["factory"],
        anchors=(),
        max_problems=_WORKER["max_problems"],
        max_unsealed_seconds=None,
        now=_WORKER["now"],
        since=_WORKER["since"],
        vendor=_WORKER["vendor"],
    )
    verifier.attempts_and_events(*task)
    checker = verifier.checker
    return (
        verifier.events,
        verifier.attempts,
        verifier.unsealed_attempts,
        verifier.oldest_unsealed,
        checker.problems,
        checker.truncated,
    )


def ranges(lo: int, hi: int, *, jobs: int, step: int) -> list[tuple[int, int]]:
    """The tasks that cover attempt ids (lo, hi], in order: one keyset batch of ``step`` ids
    each, which the processes take as they finish, then the last ``2 * jobs`` batches' ids in
    quarter batches, so the last process to finish waits for at most a quarter batch of
    another rather than a whole one."""
    batches = -(-(hi - lo) // step)
    edge = lo + max(0, batches - 2 * jobs) * step
    quarter = max(1, step // 4)
    return [(start, min(start + step, edge)) for start in range(lo, edge, step)] + [
        (start, min(start + quarter, hi)) for start in range(edge, hi, quarter)
    ]


def parallel(
    verifier: Verifier,
    lo: int,
    hi: int,
    *,
    jobs: int,
    connect: Callable[[], Any],
    rest: Callable[[], None],
) -> None:
    """Verify attempts (lo, hi] in ``jobs`` processes, merging their results in id order, while
    this process checks the format-1 chain and then the ``rest``. Problems are listed in the
    order one process finds them: format 1, the attempts, the rest."""
    import multiprocessing

    tasks = ranges(lo, hi, jobs=jobs, step=chains.BATCH)
    _WORKER.update(
        connect=connect,
        max_problems=verifier.checker.max_problems,
        now=verifier.now,
        since=verifier.since,
        vendor=verifier.vendor,
    )
    _WORKER.pop("factory", None)
    # fork: the workers start at once with the code loaded; each opens its own connection.
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        results = pool.imap(_range_worker, tasks)
        checker = verifier.checker
        earlier, checker.problems = checker.problems, []
        verifier.legacy()
        first, checker.problems = checker.problems, []
        rest()
        later, checker.problems = checker.problems, earlier
        for problem in first:
            checker.problem(problem)
        for events, attempts, unsealed, oldest, problems, truncated in results:
            verifier.events += events
            verifier.attempts += attempts
            verifier.unsealed_attempts += unsealed
            if oldest is not None and (
                verifier.oldest_unsealed is None or oldest < verifier.oldest_unsealed
            ):
                verifier.oldest_unsealed = oldest
            for problem in problems:
                checker.problem(problem)
            checker.truncated |= truncated
    for problem in later:
        checker.problem(problem)
