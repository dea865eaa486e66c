"""The thread governor (backends/threads.py): its decisions on scripted timings, and on the real backend
that changing the thread count mid-generation changes nothing in the output."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_greedy_identical
from speculative import SpeculativeGenerator
from speculative.backends.base import ForwardRequest
from speculative.backends.threads import ProcStatIdle, ThreadGovernor
from speculative.drafters import NgramDrafter
from speculative.drafters.base import NoDrafter


class Machine:
    """Scripted forward times: ``speed[t]`` seconds per forward at t threads; ``share[t]`` the share of
    the CPU time that t threads get (1.0 on an idle machine, about 0.5 with another process on every
    core); ``idle`` the idle CPUs that /proc/stat would show (None: it cannot be read)."""

    now = None  # the machine that the governors below run on

    def __init__(self, speed: dict[int, float], share: dict[int, float], idle: float | None):
        self.speed, self.share, self.idle = speed, share, idle

    def run(self, gov: ThreadGovernor, forwards: int, n_tokens=(1, 5)) -> list[int]:
        Machine.now = self
        used = []
        for i in range(forwards):
            n = n_tokens[i % len(n_tokens)]
            t = gov.threads_for(n)
            wall = self.speed[t] * (1 + 0.1 * (n > 1))
            gov.observe(t, n, wall, wall * t * self.share[t])
            used.append(t)
        return used


def governor(max_threads: int = 2) -> ThreadGovernor:
    return ThreadGovernor(max_threads, idle_cores=lambda: Machine.now.idle)


IDLE = Machine(speed={1: 0.070, 2: 0.040}, share={1: 1.0, 2: 0.97}, idle=1.0)
# the measured shape: 2 threads 2.6x slower than 1 while another process keeps both cores busy
BUSY = Machine(speed={1: 0.080, 2: 0.210}, share={1: 0.95, 2: 0.45}, idle=0.0)
# the same, with 2 threads getting more than one core's worth: not starved, so a trial decides
CROWDED = Machine(speed=BUSY.speed, share={1: 0.95, 2: 0.65}, idle=0.0)


@pytest.mark.quick
def test_an_idle_machine_never_tries_fewer_threads():
    gov = governor()
    assert set(IDLE.run(gov, 2000)) == {2}
    assert gov.trials == 0 and gov.switches == 0


@pytest.mark.quick
def test_a_busy_machine_moves_to_one_thread_then_back_when_the_load_ends():
    gov = governor()
    used = BUSY.run(gov, 40)
    assert gov.current == 1 and gov.switches == 1 and used[-1] == 1
    assert used.index(1) <= 16  # found within a few forwards
    # still busy, no spare core: 2 threads are not tried again
    used = BUSY.run(gov, 3000)
    assert gov.current == 1 and gov.switches == 1 and used.count(2) == 0
    # the other process ends: a spare core shows, the trial of 2 threads wins
    IDLE.run(gov, 30)
    assert gov.current == 2 and gov.switches == 2


@pytest.mark.quick
def test_a_starved_count_drops_at_once_and_a_wrong_drop_is_not_repeated():
    gov = governor()
    assert BUSY.run(gov, 3, n_tokens=(300, 1, 1)) == [2, 2, 1]  # two starved forwards: one thread fewer
    assert gov.switches == 1 and gov.trials == 0
    # starved, yet 2 threads are the faster count (and a core shows idle): the trial of 2 wins, and
    # from then on only trials move the count
    odd = Machine(speed={1: 0.200, 2: 0.080}, share={1: 1.0, 2: 0.5}, idle=1.0)
    odd.run(gov, 400)
    assert gov.current == 2 and gov.switches == 2 and gov.trials >= 2


@pytest.mark.quick
def test_a_crowded_machine_tries_fewer_threads_before_switching():
    gov = governor()
    used = CROWDED.run(gov, 40)
    assert gov.current == 1 and gov.switches == 1 and gov.trials == 1 and 6 <= used.index(1) <= 16


@pytest.mark.quick
def test_without_proc_stat_trials_back_off():
    gov = governor()
    blind = Machine(BUSY.speed, BUSY.share, idle=None)
    blind.run(gov, 40)
    assert gov.current == 1
    used = blind.run(gov, 3000)
    # one trial per MAX_WAIT forwards at most, once backed off
    assert gov.current == 1 and 0 < used.count(2) <= 0.035 * len(used)


@pytest.mark.quick
def test_busy_but_fewer_threads_no_faster_keeps_the_count():
    gov = governor()
    mild = Machine(speed={1: 0.075, 2: 0.070}, share={1: 1.0, 2: 0.6}, idle=0.0)
    mild.run(gov, 600)
    assert gov.current == 2 and gov.switches == 0 and 1 <= gov.trials <= 8


@pytest.mark.quick
def test_which_forwards_run_a_trial():
    gov = governor()
    used = CROWDED.run(gov, 200, n_tokens=(300,))
    assert set(used) == {2} and gov.trials == 0  # prefill sizes are never compared
    # once a trial of fewer threads is due, every forward runs with it (only timed sizes are scored)
    CROWDED.run(gov, 6, n_tokens=(1,))  # 3 to time the size, then 4 ratios and FIRST_WAIT forwards
    assert gov.threads_for(300) == 1 and gov.threads_for(7) == 1 and gov.threads_for(1) == 1
    # a trial of more threads runs only forwards of a size that the current count has timed
    BUSY.run(gov, 30, n_tokens=(1,))
    assert gov.current == 1
    IDLE.run(gov, 4, n_tokens=(1,))
    assert gov.threads_for(300) == 1 and gov.threads_for(7) == 1 and gov.threads_for(1) == 2


@pytest.mark.quick
def test_a_trial_whose_sizes_never_come_ends():
    """A trial of fewer threads runs every forward; if none of them is of a size the current count has
    timed (prefill, or other draft lengths), it is dropped after GIVE_UP forwards, not kept forever."""
    gov = governor()
    CROWDED.run(gov, 6, n_tokens=(1,))
    assert gov.threads_for(7) == 1  # the trial of 1 thread runs
    used = IDLE.run(gov, 1000, n_tokens=(7,)) + IDLE.run(gov, 1000, n_tokens=(300,))
    assert gov.current == 2 and gov.threads_for(7) == 2 and gov.threads_for(300) == 2
    assert used.count(1) <= ThreadGovernor.GIVE_UP + 1


@pytest.mark.quick
def test_more_threads_than_one_core_and_bad_arguments():
    gov = governor(4)
    busy4 = Machine(speed={4: 0.2, 3: 0.08, 2: 0.09, 1: 0.15}, share={4: 0.4, 3: 0.95, 2: 0.98, 1: 1.0}, idle=0.1)
    busy4.run(gov, 400)
    assert gov.current == 3  # one step at a time; at 3 the process gets its CPU time, so 2 is not tried
    with pytest.raises(ValueError, match="max_threads"):
        ThreadGovernor(0)


@pytest.mark.quick
def test_proc_stat_idle_cores(tmp_path):
    stat = tmp_path / "stat"
    idle = ProcStatIdle(min_interval_s=0.2, path=str(stat))
    idle.cpus = 2
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    assert idle() == 0.0  # the first reading
    stat.write_text("cpu  110 0 110 810 0 0 0 0 0 0\n")
    assert idle() == 0.0  # 30 jiffies: too short to tell
    stat.write_text("cpu  200 0 150 850 0 0 0 0 0 0\n")  # since the first: 50 idle jiffies of 200
    assert idle() == pytest.approx(2 * 50 / 200)
    stat.write_text("garbage")
    assert idle() is None
    assert ProcStatIdle(path=str(tmp_path / "absent"))() is None


# ---- the real backend ----------------------------------------------------------------------


class Alternating:
    """Stands in for the governor: 1 and 2 threads on alternate forwards (the most switching there is)."""

    def __init__(self):
        self.calls = 0

    def threads_for(self, n):
        self.calls += 1
        return 1 + self.calls % 2

    def observe(self, *a):
        pass


def _logits_at(backend):
    rng = np.random.default_rng(3)
    ctx, blk = rng.integers(100, 30000, size=200).tolist(), rng.integers(100, 30000, size=64).tolist()
    backend.truncate(0, 0)
    rows = [backend.forward([ForwardRequest(0, ctx, logits="last")])[0].logits.copy()]
    for n in (1, 2, 5, 8, 16, 64):
        rows.append(backend.forward([ForwardRequest(0, blk[:n], logits="all")])[0].logits.copy())
        backend.truncate(0, len(ctx))
    backend.truncate(0, 0)
    return rows


def test_exact_logits_do_not_depend_on_the_thread_count(smol):
    """The governor's premise: with exact numerics each output is computed by one thread in one order."""
    L, ctx = smol._L, smol._ctx
    try:
        L.llama_set_n_threads(ctx, 2, 2)
        two = _logits_at(smol)
        L.llama_set_n_threads(ctx, 1, 1)
        one = _logits_at(smol)
    finally:
        L.llama_set_n_threads(ctx, smol._threads_now, smol._threads_now)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))


def test_the_governor_is_on_only_where_the_count_is_free_and_harmless(smol):
    from speculative.backends import load_backend
    from speculative.backends.llama_cpp import default_threads

    assert (smol.thread_governor is not None) == (default_threads() > 1)  # exact, count left to the backend

    fixed = load_backend("smollm2-135m-instruct", n_ctx=512, n_threads=2)
    fast = load_backend("smollm2-135m-instruct", n_ctx=512, numerics="fast")
    try:
        assert fixed.thread_governor is None  # the caller chose the count
        assert fast.thread_governor is None  # fast kernels' logits depend on the count
    finally:
        fixed.close()
        fast.close()


def test_switching_threads_every_forward_changes_no_token(smol, prompts10):
    """Greedy and sampled generation with the count switched on every forward equal the same runs at a
    fixed count, token for token; n-gram drafts are verified (some accepted, some rejected)."""
    gov = smol.thread_governor
    plain_gen, ngram = SpeculativeGenerator(smol, NoDrafter()), SpeculativeGenerator(smol, NgramDrafter(1, 4))
    drafted = accepted = 0
    try:
        for row in prompts10[:4]:
            ids = plain_gen.encode_prompt(row["turns"][0])
            smol.thread_governor = None
            plain = plain_gen.generate(ids, max_new_tokens=40).token_ids
            sampled = ngram.generate(ids, max_new_tokens=40, num_speculative_tokens=4, draft_policy="fixed",
                                     temperature=0.8, seed=7).token_ids
            smol.thread_governor = alt = Alternating()
            r = ngram.generate(ids, max_new_tokens=40, num_speculative_tokens=4, draft_policy="fixed")
            assert_greedy_identical(smol, ids, plain, r.token_ids, exact=True, label=f"q{row['question_id']}")
            again = ngram.generate(ids, max_new_tokens=40, num_speculative_tokens=4, draft_policy="fixed",
                                   temperature=0.8, seed=7).token_ids
            assert again == sampled
            assert alt.calls > 10
            drafted += r.stats.draft_tokens
            accepted += r.stats.accepted_tokens
    finally:
        smol.thread_governor = gov
    assert 0 < accepted < drafted
