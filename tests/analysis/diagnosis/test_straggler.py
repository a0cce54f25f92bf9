"""Who holds a CPU (gloo) job back and why, on summaries shaped like stepscope's real 2-rank
captures (tests/analysis/test_analyze_real_capture.py runs the real thing): two steps, each with
its time inside collectives, Python stacks with their time per step."""
from __future__ import annotations

from stepscope.analysis.diagnosis.diagnose import diagnose
from stepscope.analysis.model import SUMMARY_VERSION, CollectiveStat, FunctionStat, RankSummary, StepRow

ROOT = "workload.py(224): <module> > workload.py(203): train"
BACKWARD = f"{ROOT} > _tensor.py(566): backward > graph.py(966): _engine_run_backward > <built-in method run_backward of torch._C._EngineBase object at 0x7f1b>"
WAIT = f"{ROOT} > workload.py(151): average_loss_across_ranks > distributed_c10d.py(3155): all_reduce > <built-in method wait of pybind11_builtins.x object at 0x7f1a>"
SHARD = f"{ROOT} > workload.py(101): read_shard > <built-in function sleep>"
AGENT = ("threading.py(1002): _bootstrap > threading.py(1045): _bootstrap_inner > threading.py(982): run > stepscope_agent.py(611): _watch"
         " > stepscope_agent.py(576): _heartbeat > stepscope_agent.py(85): _atomic_write > <built-in function replace>")
STEP_HOOK = f"{ROOT} > optimizer.py(538): wrapper > stepscope_agent.py(300): _on_step > profiler.py(932): __exit__"


def _fn(stack: str, per_step: list[float], count: int = 2) -> FunctionStat:
    return FunctionStat(name=stack.rsplit(" > ", 1)[-1], stack=stack, count=count, exclusiveUs=sum(per_step), notOverlappedUs=sum(per_step),
                        stepsUs=per_step)


def _rank(rank: int, waits: list[float], functions: list[FunctionStat], step_us: float = 90_000.0) -> RankSummary:
    steps = [StepRow(step=20 + i, startUs=i * step_us, durationUs=step_us, collectiveUs=w) for i, w in enumerate(waits)]
    return RankSummary(version=SUMMARY_VERSION, rank=rank, worldSize=2, backend="gloo", capturedUs=step_us * len(waits), steps=steps,
                       collectives=[CollectiveStat(kind="AllReduce", count=4, sumUs=sum(waits), medianUs=waits[0] / 2)],
                       functions=functions)


def _base(backward: list[float]) -> list[FunctionStat]:
    return [_fn(SHARD, [30_000, 30_000]), _fn(BACKWARD, backward), _fn(WAIT, [500, 500]), _fn(AGENT, [8_000, 8_000], 60),
            _fn(STEP_HOOK, [9_000, 9_000])]


def test_the_rank_waited_for_is_named_with_its_function_never_the_waiting_one():
    # Rank 0 waits ~48 ms a step inside backward (DDP's gradient all-reduce); rank 1 computes 40 ms
    # in augment_batch_slowly. The old diagnosis blamed rank 0's run_backward.
    slow = _fn(f"{ROOT} > workload.py(61): augment_batch_slowly", [40_000, 41_000])
    diagnosis, full = diagnose([_rank(0, [50_000, 49_000], _base([48_000, 47_000])), _rank(1, [2_000, 1_500], [*_base([6_000, 6_000]), slow])])
    assert [w.rank for w in diagnosis.slowWorkers] == [1]
    assert diagnosis.summary.startswith("rank 1 holds the job back (confidence ") and "augment_batch_slowly (workload.py:61)" in diagnosis.summary
    # two steps weigh 3/4 of four: a busy machine can slow a rank for a step or two
    assert diagnosis.confidence is not None and diagnosis.confidence >= 0.7
    # Figures agree with the step: the peers' wait is below the 90 ms step, the slowdown follows from it.
    worker = diagnosis.slowWorkers[0]
    assert 1.5 < worker.slowdown < 2.5 and worker.slowdown == round(90.0 / (90.0 - 47.75), 3)
    assert not [f for f in full if f.severity != "info" and f.ranks == [0]]
    # stepscope's own agent and profiler are never a finding.
    assert not [f for f in full if "stepscope_agent" in f.message or "_heartbeat" in f.message or "replace (built-in)" in f.message]


def test_blocking_in_a_user_function_is_a_cause_not_waiting():
    blocked = _fn(f"{ROOT} > workload.py(90): fetch_remote_features > <built-in function sleep>", [40_000, 40_000])
    diagnosis, _ = diagnose([_rank(0, [45_000, 44_000], _base([40_000, 40_000])), _rank(1, [1_000, 1_000], [*_base([5_000, 5_000]), blocked])])
    assert diagnosis.summary.startswith("rank 1 holds the job back")
    assert "fetch_remote_features (workload.py:90), in sleep (built-in)" in diagnosis.summary


def test_a_hiccup_in_one_step_is_no_cause_and_no_slow_worker():
    # A descheduled process: one call took 24 ms in one step of two. Not a cause; the diagnosis
    # names no one (at most it says it cannot tell).
    hiccup = _fn(f"{ROOT} > <built-in function next> > dataloader.py(720): __next__ > workload.py(117): __getitem__ > <built-in method randint of type object at 0x7f>",
                 [24_000, 300], count=64)
    diagnosis, _ = diagnose([_rank(0, [20_000, 12_000], [*_base([6_000, 6_000]), _fn(hiccup.stack, [300, 300], 64)]),
                             _rank(1, [10_000, 11_000], [*_base([6_000, 6_000]), hiccup])])
    assert diagnosis.slowWorkers == []
    assert not diagnosis.summary.startswith("rank ")


def test_a_modest_steady_cause_needs_the_default_eight_steps():
    # 5 ms a step (7 %) in a function only rank 1 runs; its peer waits about that much longer.
    # Two or four steps cannot tell it from a busy machine slowing one rank for a while (a healthy
    # rank's data loader held the job back 12 % in all 4 steps of a capture): it says so and asks
    # for more; eight steps that all show it name it.
    def run(steps: int) -> tuple:
        modest = _fn(f"{ROOT} > workload.py(61): augment_batch_slowly", ([5_000, 5_200, 5_100, 4_900] * 2)[:steps])
        base = [_fn(f.stack, (f.stepsUs * 4)[:steps], f.count) for f in _base([6_000, 6_000])]
        return diagnose([_rank(0, ([31_000, 30_000, 30_500, 31_200] * 2)[:steps], base, 75_000.0),
                         _rank(1, ([25_000, 24_500, 25_300, 24_800] * 2)[:steps], [*base, modest], 75_000.0)])

    for steps in (2, 4):
        few, _ = run(steps)
        assert few.slowWorkers == [] and few.summary.startswith(f"cannot tell which rank holds the job back from {steps} step(s)")
        assert "capture more steps" in few.summary and "Rank 1 is the likeliest" in few.summary
    eight, _ = run(8)
    assert [w.rank for w in eight.slowWorkers] == [1] and eight.confidence >= 0.65
    assert "augment_batch_slowly" in eight.summary and "its peers wait 5.8 ms of each 75.0 ms step" in eight.summary


def test_a_rank_nobody_waits_for_is_not_named_for_its_function():
    # The same function, but the collectives show no one waiting for rank 1 (a healthy job's
    # data loader a little slower on one rank of a busy machine): it holds no one back.
    modest = _fn(f"{ROOT} > workload.py(61): augment_batch_slowly", [5_000, 5_200])
    diagnosis, _ = diagnose([_rank(0, [31_000, 30_000], _base([6_000, 6_000]), 75_000.0),
                             _rank(1, [30_500, 30_200], [*_base([6_000, 6_000]), modest], 75_000.0)])
    assert diagnosis.slowWorkers == [] and not diagnosis.summary.startswith("rank ")


def test_a_gap_without_any_steady_cause_says_it_cannot_tell_and_what_to_capture():
    diagnosis, full = diagnose([_rank(0, [40_000, 39_000], _base([6_000, 6_000])), _rank(1, [8_000, 8_500], _base([6_000, 6_000]))])
    assert diagnosis.slowWorkers == []
    assert diagnosis.summary.startswith("cannot tell which rank holds the job back") and "capture more steps (steps: 16)" in diagnosis.summary
    assert diagnosis.confidence < 0.65


def test_other_threads_are_kept_apart_from_the_training_thread():
    from stepscope.analysis.diagnosis.rank_tables import MAIN_THREAD, build_tables

    tables = build_tables([_rank(0, [1_000, 1_000], [*_base([6_000, 6_000]),
                                                      _fn("threading.py(1002): _bootstrap > threading.py(982): run > loader.py(12): prefetch > threading.py(331): wait", [80_000, 80_000])])])
    threads = dict(zip(tables.functions["stack"], tables.functions["thread"]))
    assert threads[SHARD] == MAIN_THREAD
    assert [t for s, t in threads.items() if "prefetch" in s] == ["loader.py(12): prefetch"]
    # the agent's frames (its thread and its step hook) are left out, their time kept apart
    assert not tables.functions["stack"].str.contains("stepscope_agent").any()
    assert tables.ownUs[0] == 18_000


def test_report_shows_python_time_by_thread_and_which_rank_is_slow(tmp_path):
    from stepscope.analysis.model import encode
    from stepscope.analysis.pipeline import analyze_uri

    slow = _fn(f"{ROOT} > workload.py(61): augment_batch_slowly", [40_000, 41_000])
    loader = _fn("threading.py(1002): _bootstrap > threading.py(982): run > loader.py(12): prefetch > threading.py(331): wait", [95_000, 95_000])
    ranks = tmp_path / "session" / "ranks"
    ranks.mkdir(parents=True)
    for s in (_rank(0, [50_000, 49_000], [*_base([48_000, 47_000]), loader]), _rank(1, [2_000, 1_500], [*_base([6_000, 6_000]), slow, loader])):
        (ranks / f"rank-{s.rank}.summary.json").write_bytes(encode(s))
    analyze_uri(str(tmp_path / "session"), progress=False)
    html = (tmp_path / "session" / "report" / "index.html").read_text()
    assert '<div class="k">slow workers</div><div class="v">rank 1</div>' in html
    assert '<div class="k">confidence</div>' in html
    functions = html[html.index("<h2>Python functions</h2>"):]
    # The training thread's rows come first; the loader thread's wait (longer than the step) is
    # its own thread's and marked as waiting, not work in the step.
    assert functions.index("training thread") < functions.index("thread prefetch (loader.py:12)")
    assert "wait (threading.py:331) <span class=\"note\">(waiting)</span>" in functions
    assert "agent and the profiler: 9.00 ms/step per rank on the training thread, left out" in functions


def test_a_slow_rank_whose_stacks_the_capture_budget_dropped_is_not_given_a_made_up_cause():
    """Many tiny Python calls on rank 1 made its agent drop the stacks (capture.limits.maxStackEvents):
    with no samples of its stack either (maxStackEvents 0), nothing but who waits for whom points at it,
    which 4 steps cannot tell from a descheduled rank: the headline says so, names it the likeliest,
    and says plainly that its function cannot be told and what to capture instead (it read "no
    Python function of it runs longer")."""
    dropped = ("Python stacks dropped: 512,000 Python calls per step x 4 steps = 2,048,000 exceeds capture.limits.maxStackEvents=100,000; "
               "set capture.withStack=false or raise capture.limits.maxStackEvents")
    slow = _rank(1, [1_000] * 4, [])
    slow.warnings = [dropped]
    diagnosis, full = diagnose([_rank(0, [41_000, 40_000, 40_500, 40_000], [_fn(SHARD, [30_000] * 4), _fn(WAIT, [40_000] * 4)]), slow])
    assert [w.rank for w in diagnosis.slowWorkers] == []
    assert diagnosis.summary.startswith("cannot tell which rank holds the job back") and "Rank 1 is the likeliest" in diagnosis.summary
    message = next(f.message for f in full if f.category == "slow-worker")  # the summary is cut at MAX_MESSAGE
    assert "cannot tell what it does in that time, as the capture budget (capture.limits.maxStackEvents" in message
    assert "capture steps: 1 with that limit raised to name the function" in message


def test_a_slow_rank_whose_stacks_were_dropped_is_named_by_its_sampled_stack():
    """Where the budget dropped rank 1's stacks, its agent sampled the training thread's stack
    instead: the sampled function is the cause, and the headline says its figures are sampled
    (and states no profiler cost for calls the tracer did not record)."""
    dropped = ("Python stacks dropped: 512,000 Python calls per step x 4 steps = 2,048,000 exceeds capture.limits.maxStackEvents=100,000, "
               "the training thread's stack is sampled every 2 ms instead; set capture.withStack=false or raise capture.limits.maxStackEvents")
    # As many calls as the tracer would have recorded: no profiler cost is stated for sampled rows.
    sampled = _fn(f"{ROOT} > workload.py(90): augment_with_helpers", [36_000] * 4, count=400_000)
    slow = _rank(1, [1_000] * 4, [_fn(SHARD, [30_000] * 4), sampled])
    slow.warnings = [dropped]
    diagnosis, _ = diagnose([_rank(0, [41_000, 40_000, 40_500, 40_000], [_fn(SHARD, [30_000] * 4), _fn(WAIT, [40_000] * 4)]), slow])
    assert [w.rank for w in diagnosis.slowWorkers] == [1]
    assert diagnosis.summary.startswith("rank 1 holds the job back (confidence ")
    assert "in augment_with_helpers (workload.py:90)" in diagnosis.summary
    assert "from samples of its stack every 2 ms, as the capture budget (capture.limits.maxStackEvents) dropped its Python stacks" in diagnosis.summary
    assert "cannot tell" not in diagnosis.summary and "profiler's own cost" not in diagnosis.summary


def test_the_waiting_alone_names_a_rank_only_over_more_steps_and_with_no_negligible_cause():
    """Its peers wait 39 ms a step for rank 1, and no frame of it explains that. Over 4 steps that
    is what a loaded machine does to a healthy rank (a healthy capture read "rank 0 holds the job
    back (confidence 0.66): it spends 0.03 ms/step more than its peers in __exit__
    (profiler.py:932)"): the diagnosis cannot tell, and asks for more steps; over 8 (the default)
    it names the rank, without giving a frame that explains next to nothing of the gap as its reason."""
    tiny = f"{ROOT} > optimizer.py(538): wrapper > profiler.py(932): __exit__"
    for steps, named in ((4, False), (8, True)):
        diagnosis, _ = diagnose([_rank(0, [40_000] * steps, [_fn(SHARD, [30_000] * steps), _fn(WAIT, [40_000] * steps)]),
                                 _rank(1, [1_000] * steps, [_fn(SHARD, [30_000] * steps), _fn(tiny, [30] * steps)])])
        assert [w.rank for w in diagnosis.slowWorkers] == ([1] if named else []), diagnosis.summary
        assert "__exit__" not in diagnosis.summary
        assert "no Python function of it runs longer than on its peers" in diagnosis.summary
        assert diagnosis.summary.startswith("rank 1 holds the job back" if named else "cannot tell which rank holds the job back")
        assert named or "capture more steps (steps: 16)" in diagnosis.summary


def test_one_descheduled_step_does_not_hide_a_modest_cause_that_holds_in_every_step():
    """Rank 1 spends 5-7 ms a step more in augment_batch_slowly, 31 ms in one step where a loaded
    machine descheduled it: the cause holds in all 4 steps (measured against its median excess,
    not the mean that the one step inflates). A capture of the `modest` scenario at 4 ranks read
    "no problem found ... [confidence 0.92]"."""
    slow = _fn(f"{ROOT} > workload.py(62): augment_batch_slowly", [30_900, 5_100, 5_400, 6_700])
    diagnosis, _ = diagnose([_rank(0, [40_000] * 4, [_fn(SHARD, [30_000] * 4), _fn(WAIT, [40_000] * 4)], step_us=89_000),
                             _rank(1, [28_000] * 4, [_fn(SHARD, [30_000] * 4), slow], step_us=89_000)])
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    assert diagnosis.summary.startswith("rank 1 holds the job back") and "augment_batch_slowly" in diagnosis.summary


def test_a_modest_cause_that_only_the_slow_rank_runs_holds_below_the_floor_for_shared_frames():
    """Rank 1 spends 5-7 ms a step in augment_batch_slowly, which no peer runs, in a 105 ms step
    on a loaded machine (8 steps, the default): under 5 % of the step in most steps, the floor that keeps the noise of
    frames every rank runs out, but with no peer time there is no such noise. A capture of the
    `modest` scenario at 8 ranks read "no problem found ... [confidence 0.91]"."""
    slow = _fn(f"{ROOT} > workload.py(62): augment_batch_slowly", [13_500, 5_100, 5_150, 7_000] * 2)
    diagnosis, _ = diagnose([_rank(0, [52_000] * 8, [_fn(SHARD, [30_000] * 8), _fn(WAIT, [52_000] * 8)], step_us=105_000),
                             _rank(1, [36_500] * 8, [_fn(SHARD, [30_000] * 8), slow], step_us=105_000)])
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    assert diagnosis.summary.startswith("rank 1 holds the job back") and "augment_batch_slowly" in diagnosis.summary


def test_a_function_only_one_rank_runs_once_is_a_hiccup_not_a_cause():
    """A function no peer runs that rank 1 ran in one step only (20 ms there, none in the other
    3) does not hold in every step, though its mean is 5 % of the step and the peers waited a
    little for rank 1: no slow worker (at most "cannot tell", rank 1 the likeliest)."""
    once = _fn(f"{ROOT} > workload.py(70): rotate_logs", [20_000, 0, 0, 0])
    diagnosis, _ = diagnose([_rank(0, [60_000, 45_000, 45_000, 45_000], [_fn(SHARD, [30_000] * 4), _fn(WAIT, [45_000] * 4)]),
                             _rank(1, [40_000] * 4, [_fn(SHARD, [30_000] * 4), _fn(WAIT, [40_000] * 4), once])])
    assert diagnosis.slowWorkers == [] and not diagnosis.summary.startswith("rank 1 holds the job back"), diagnosis.summary


def test_a_cause_that_holds_in_every_step_is_never_no_problem_even_when_one_noisy_step_contradicts_it():
    """The `modest` scenario at 2 ranks on a loaded machine (its figures): rank 1 spends 5 ms a step
    in augment_batch_slowly, a function rank 0 does not run, in all 4 steps; but in one step it
    waited 24 ms in the all-reduce against rank 0's 2 ms, so on average it waits more. That read
    "no problem found ... [confidence 0.93]"; the evidence is steady but contested: the diagnosis
    cannot tell, names rank 1 the likeliest and asks for more steps - never a confident "no problem"."""
    slow = _fn(f"{ROOT} > workload.py(66): augment_batch_slowly", [5_100, 5_150, 5_100, 98_400])
    base = [_fn(SHARD, [30_000] * 4), _fn(BACKWARD, [6_000] * 4)]
    diagnosis, _ = diagnose([_rank(0, [2_181, 1_860, 9_425, 14_165], base, 57_600.0),
                             _rank(1, [24_153, 3_752, 10_824, 8_697], [*base, slow], 57_600.0)])
    assert diagnosis.slowWorkers == []
    assert diagnosis.summary.startswith("cannot tell which rank holds the job back from 4 step(s)"), diagnosis.summary
    assert "Rank 1 is the likeliest" in diagnosis.summary and "augment_batch_slowly" in diagnosis.summary
    assert 0.4 <= diagnosis.confidence < 0.65


def test_a_rank_that_waits_more_is_never_the_likeliest_for_its_time_in_backward():
    """The waiting rank's extra time in backward is DDP's wait for the gradients there, in every
    step: it stays no cause even when contested evidence may otherwise make a rank the likeliest."""
    # Rank 0 waits more on average, rank 1 less in only half of the steps: the waiting names no one for sure.
    diagnosis, _ = diagnose([_rank(0, [40_000, 5_000, 40_000, 5_000], [_fn(SHARD, [30_000] * 4), _fn(BACKWARD, [36_000] * 4)]),
                             _rank(1, [5_000, 10_000, 5_000, 10_000], [_fn(SHARD, [30_000] * 4), _fn(BACKWARD, [6_000] * 4)])])
    assert "run_backward" not in diagnosis.summary and "Rank 0 is the likeliest" not in diagnosis.summary
    assert not diagnosis.summary.startswith("rank 0")


def test_a_rank_late_in_half_the_steps_with_a_frame_slower_in_most_is_cannot_tell_not_no_problem():
    """The slow-compute scenario at 8 ranks over 4 steps on a loaded machine: its peers waited for
    rank 1 clearly in 2 of 4 steps (11 % of the step on average) and its forward ran 30x longer than
    theirs in 3 of 4. Neither holds in every step, so no rank is named, but that read "no problem
    found ... [confidence 0.77]": it cannot tell, and says what to capture."""
    forward = f"{ROOT} > linear.py(130): forward"
    diagnosis, _ = diagnose([_rank(0, [30_000, 12_000, 30_000, 12_000], [_fn(SHARD, [30_000] * 4), _fn(forward, [300] * 4)]),
                             _rank(1, [10_000, 12_500, 10_000, 12_500], [_fn(SHARD, [30_000] * 4), _fn(forward, [9_000, 8_500, 300, 9_000])])])
    assert diagnosis.slowWorkers == []
    assert diagnosis.summary.startswith("cannot tell which rank holds the job back from 4 step(s)"), diagnosis.summary
    assert "Rank 1 is the likeliest" in diagnosis.summary and "forward (linear.py:130)" in diagnosis.summary


def test_collectives_that_wait_for_a_steady_cause_within_their_noise_agree_with_it():
    """The `modest` scenario at 2 ranks over 8 steps (its figures): rank 1 runs augment_batch_slowly
    5-8 ms in every step, rank 0 waits 1.7 ms a step more on average - less than half the cause,
    but its wait swings by 4 ms from step to step, so the collectives do not contradict the cause.
    That read "cannot tell ... (confidence 0.59)"; it names rank 1."""
    slow = _fn(f"{ROOT} > workload.py(66): augment_batch_slowly", [5_053, 5_078, 5_055, 5_073, 5_067, 5_078, 7_540, 8_385], count=8)
    base = [_fn(SHARD, [30_000] * 8)]
    diagnosis, _ = diagnose([_rank(0, [4_924, 3_982, 2_103, 1_932, 13_078, 744, 8_425, 7_046], base, 42_570.0),
                             _rank(1, [2_052, 1_926, 2_020, 2_382, 9_756, 3_841, 2_947, 3_741], [*base, slow], 42_570.0)])
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    assert diagnosis.summary.startswith("rank 1 holds the job back (confidence ") and "augment_batch_slowly" in diagnosis.summary


def test_collectives_that_show_no_wait_beyond_their_noise_still_contradict_a_cause():
    """The same cause, but rank 0 waits no longer than rank 1 in any step (within 0.3 ms): nobody
    waits for rank 1, and 8 steps of it do not make it the one the job waits for."""
    slow = _fn(f"{ROOT} > workload.py(66): augment_batch_slowly", [5_100] * 8, count=8)
    base = [_fn(SHARD, [30_000] * 8)]
    diagnosis, _ = diagnose([_rank(0, [3_000, 3_200] * 4, base, 42_570.0), _rank(1, [3_100, 3_000] * 4, [*base, slow], 42_570.0)])
    assert diagnosis.slowWorkers == [] and not diagnosis.summary.startswith("rank "), diagnosis.summary


def test_collectives_pulled_to_another_rank_by_a_few_steps_do_not_contradict_a_steady_cause():
    """The `modest` scenario at 8 ranks over 8 steps at load 11: rank 0 (a healthy rank whose data
    loader the load slowed in some steps) waited least on average, clearly so in only a few steps,
    while rank 1 ran augment_batch_slowly in all 8. That read "cannot tell ... the collectives point
    at rank 0"; collectives that point elsewhere in fewer than half of the steps do not contradict it."""
    slow = _fn(f"{ROOT} > workload.py(66): augment_batch_slowly", [6_000] * 8, count=8)
    base = [_fn(SHARD, [30_000] * 8)]
    diagnosis, _ = diagnose([_rank(0, [0, 0, 0] + [20_000] * 5, base), _rank(1, [16_000] * 8, [*base, slow]),
                             _rank(2, [20_000] * 8, base)])
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    assert diagnosis.summary.startswith("rank 1 holds the job back") and "augment_batch_slowly" in diagnosis.summary


def test_the_peers_wait_inside_backward_counts_as_waiting_for_a_steady_cause():
    """The `modest` scenario at 2 ranks over 8 steps at load 11 (its figures): rank 1 ran
    augment_batch_slowly 5 ms in every step; the collectives' time hardly differed (0.2 ms a step),
    but rank 0 spent 3.2 ms a step more in backward, DDP's wait for rank 1's gradients. That read
    "cannot tell"; backward's extra time on the peers is waiting for rank 1, and it is named."""
    slow = _fn(f"{ROOT} > workload.py(66): augment_batch_slowly", [5_093, 5_096, 5_116, 5_229, 5_123, 6_521, 5_110, 5_116], count=8)
    diagnosis, _ = diagnose([
        _rank(0, [7_959, 4_679, 2_785, 2_795, 13_183, 18_312, 4_326, 2_231],
              [_fn(SHARD, [30_000] * 8), _fn(BACKWARD, [14_226, 13_616, 2_982, 3_545, 21_317, 19_207, 7_038, 5_079])], 47_218.0),
        _rank(1, [7_174, 2_411, 3_758, 3_130, 11_476, 19_295, 4_922, 2_162],
              [_fn(SHARD, [30_000] * 8), _fn(BACKWARD, [7_503, 7_176, 4_448, 2_498, 12_147, 18_380, 5_411, 3_686]), slow], 47_218.0)])
    assert [w.rank for w in diagnosis.slowWorkers] == [1], diagnosis.summary
    assert diagnosis.summary.startswith("rank 1 holds the job back") and "augment_batch_slowly" in diagnosis.summary
