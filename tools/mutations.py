"""The mutations of autonorm's gate, each with the CPU tests that must catch it.

autonorm's promise is that a kernel failing the float64 check never wins. Each mutation below
plants one fault in what keeps that promise (the verifier, its tolerances and cases, the
evaluator's gate, winner selection, the store of winners, the lookup order, input validation)
as a textual patch of one file; ``tools/mutate.py`` applies each to a scratch copy of the tree
and runs its tests, which must fail.

A mutation's ``old`` text must occur exactly ``count`` times in its file: when the code it
targets changes, the mutation stops applying and the command fails until it is updated.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MUTATIONS", "Mutation"]


@dataclass(frozen=True)
class Mutation:
    """One planted fault.

    Attributes:
        name: a short unique name.
        what: the fault, in a line.
        path: the file, relative to the repository root.
        old: the text replaced.
        new: its replacement.
        tests: pytest node ids of which at least one must fail.
        count: how many times ``old`` occurs (every occurrence is replaced).
    """

    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    count: int = 1


VERIFY = "autonorm/ops/layer_norm/verify.py"
CASES = "autonorm/ops/layer_norm/cases.py"
NUMERICS = "autonorm/numerics.py"
GATE = "tests/test_verify_gate.py"
TUNER = "tests/test_tuner.py"
SESSION = "tests/test_session.py"
INPUTS = "tests/test_input_gate.py"
DISPATCH = "tests/test_dispatch.py"

MUTATIONS: tuple[Mutation, ...] = (
    # ------------------------------------------------------------------ the verifier
    Mutation(
        "verify-accepts-everything", "verify() returns ok for every kernel",
        VERIFY, "    result.ok = not result.failures", "    result.ok = True",
        (f"{GATE}::test_each_broken_merge_is_rejected_by_the_merge_cases[no-between-2-bfloat16]",
         f"{GATE}::test_the_evaluator_times_only_kernels_that_verify"),
    ),
    Mutation(
        "no-guard-row", "a write past the last row goes unseen",
        VERIFY, "        if bool((y[rows] != _POISON[dtype]).any()):", "        if False:",
        (f"{GATE}::test_unwritten_rows_and_writes_past_the_end_fail_every_case",),
    ),
    Mutation(
        "no-poison", "the output starts as zeros, not NaN: unwritten elements read as values",
        VERIFY, "y = xp.full((rows + 1, n), _POISON[dtype], dtype=bits)",
        "y = xp.zeros((rows + 1, n), dtype=bits)",
        (f"{GATE}::test_unwritten_rows_and_writes_past_the_end_fail_every_case",),
    ),
    Mutation(
        "no-unwritten-check", "NaN left in the output is judged by the tolerances only",
        VERIFY, "        if err.nonfinite:", "        if False:",
        (f"{GATE}::test_unwritten_rows_and_writes_past_the_end_fail_every_case",),
    ),
    Mutation(
        "no-exact-bias-check", "constant rows need not give the bias bit for bit",
        VERIFY, "        if case.expect_bias and problem.norm == \"layer\":", "        if False:",
        (f"{GATE}::test_constant_rows_must_give_the_bias_bit_for_bit",),
    ),
    Mutation(
        "no-one-cluster-grid", "the grid-stride case runs on the full grid",
        VERIFY, "grid = kernel.plan.cluster if case.small_grid else None", "grid = None",
        (f"{GATE}::test_a_kernel_without_the_grid_stride_loop_fails_the_one_cluster_grid",),
    ),
    # ------------------------------------------------------------------ the cases
    Mutation(
        "outlier-case-removed", "the outlier case is gone from make_cases",
        CASES, "        Case(OUTLIER_CASE, outlier_first),\n", "",
        (f"{GATE}::test_the_outlier_sits_where_the_shift_is_taken",
         f"{GATE}::test_the_uncorrected_fp32_two_pass_fails_the_outlier_case_and_only_it"),
    ),
    Mutation(
        "outlier-off-the-shift", "the outliers sit one element after where the shift is taken",
        CASES, "outlier_first[:, [0, n // 2]]", "outlier_first[:, [1, n // 2 + 1]]",
        (f"{GATE}::test_the_outlier_sits_where_the_shift_is_taken",
         f"{GATE}::test_the_uncorrected_fp32_two_pass_fails_the_outlier_case_and_only_it"),
    ),
    Mutation(
        "merge-cases-removed", "make_cases returns the row cases alone",
        CASES, "    return cases + merge_cases(n, np.random.default_rng([seed, 1]), rows)",
        "    return cases",
        (f"{GATE}::test_each_broken_merge_is_rejected_by_the_merge_cases[no-between-2-bfloat16]",
         f"{GATE}::test_the_merge_cases_catch_what_the_row_cases_missed"),
    ),
    Mutation(
        "flat-steps", "the steps between segments shrink to 2% of a spread",
        CASES, "STEP_SPREADS = 2.0", "STEP_SPREADS = 0.02",
        (f"{GATE}::test_the_segments_of_a_merge_case_differ_after_rounding",
         f"{GATE}::test_each_broken_merge_is_rejected_by_the_merge_cases"
         "[no-between-2-bfloat16]"),
    ),
    Mutation(
        "cold-hot-segment", "the hot segment has the others' spread",
        CASES, "HOT_SPREAD = 8.0", "HOT_SPREAD = 1.0",
        (f"{GATE}::test_the_segments_of_a_merge_case_differ_after_rounding",),
    ),
    Mutation(
        "halves-only", "merge cases for a cluster of two only",
        CASES, "return [c for c in CLUSTERS if c > 1 and hidden % c == 0]",
        "return [2] if hidden % 2 == 0 else []",
        (f"{GATE}::test_the_row_cases_come_first_then_a_merge_case_for_every_split",
         f"{GATE}::test_each_broken_merge_is_rejected_by_the_merge_cases[no-between-8-float16]"),
    ),
    # ------------------------------------------------------------------ the tolerances
    Mutation(
        "fp32-tolerance-450x", "the fp32 tolerance loosened 450x (rel_l2 2e-6 -> 9e-4)",
        NUMERICS, '"float32": {"rel_l2": 2e-6, "scaled_max": 1e-5}',
        '"float32": {"rel_l2": 9e-4, "scaled_max": 4.5e-3}',
        (f"{GATE}::test_each_tolerance_rejects_the_smallest_known_failure[float32]",
         f"{GATE}::test_the_uncorrected_fp32_two_pass_fails_the_outlier_case_and_only_it"),
    ),
    Mutation(
        "fp32-tolerance-past-the-h200-failure",
        "fp32 rel_l2 2.5e-6: above the uncorrected two-pass's 2.1e-6 on the H200",
        NUMERICS, '"float32": {"rel_l2": 2e-6,', '"float32": {"rel_l2": 2.5e-6,',
        (f"{GATE}::test_each_tolerance_rejects_the_smallest_known_failure[float32]",),
    ),
    Mutation(
        "fp16-tolerance-3x", "fp16 rel_l2 3e-3: the unshifted one-pass variance passes",
        NUMERICS, '"float16": {"rel_l2": 1e-3,', '"float16": {"rel_l2": 3e-3,',
        (f"{GATE}::test_each_tolerance_rejects_the_smallest_known_failure[float16]",
         f"{GATE}::test_the_unshifted_one_pass_variance_fails_the_offset_rows"),
    ),
    Mutation(
        "bf16-tolerance-2x", "bf16 rel_l2 1.6e-2: a merge fault passes random rows",
        NUMERICS, '"bfloat16": {"rel_l2": 8e-3,', '"bfloat16": {"rel_l2": 1.6e-2,',
        (f"{GATE}::test_each_tolerance_rejects_the_smallest_known_failure[bfloat16]",),
    ),
    Mutation(
        "no-scaled-max", "within() ignores the largest element's error",
        NUMERICS, '            and self.scaled_max <= tol["scaled_max"]\n', "",
        (f"{GATE}::test_the_largest_element_error_counts_where_the_l2_error_hides_it",),
    ),
    # ------------------------------------------------------------------ the evaluator's gate
    Mutation(
        "evaluator-ignores-verification", "the evaluator times a kernel that failed verification",
        "autonorm/tune/evaluator.py", "        if not result.ok:", "        if False:",
        (f"{GATE}::test_the_evaluator_times_only_kernels_that_verify",
         "tests/test_launch.py::test_the_evaluator_reaches_a_family_only_through_the_seam"),
    ),
    # ------------------------------------------------------------------ winner selection
    Mutation(
        "best-is-the-slowest", "the search's best (finals_top=0) is its slowest trial",
        "autonorm/tune/trials.py",
        "if summary.best is None or trial.value < summary.best.value:",
        "if summary.best is None or trial.value > summary.best.value:",
        (f"{TUNER}::test_without_finals_the_result_is_the_fastest_measured",),
    ),
    Mutation(
        "finals-crown-the-slowest", "the finals crown the slowest challenger",
        "autonorm/tune/finals.py", "fastest = min(challengers, key=lambda c: timed[c].median_us)",
        "fastest = max(challengers, key=lambda c: timed[c].median_us)",
        (f"{TUNER}::test_n_trials_is_honoured_and_finals_pick_the_fastest",),
    ),
    Mutation(
        "challenger-never-wins", "the incumbent stays however clearly it is beaten",
        "autonorm/tune/finals.py",
        "    if defender is None or beats(timed[fastest], timed[defender], noise):",
        "    if defender is None:",
        (f"{SESSION}::test_a_second_run_defends_the_incumbent_unless_clearly_beaten",
         f"{SESSION}::test_with_nothing_stored_the_default_defends_unless_clearly_beaten"),
    ),
    Mutation(
        "default-never-defends",
        "with nothing stored, a challenger no faster than the default wins",
        "autonorm/tune/finals.py",
        "    if defender is None and default is not None and default in ranked:",
        "    if False:",
        (f"{SESSION}::test_with_nothing_stored_the_default_defends_unless_clearly_beaten",),
    ),
    Mutation(
        "noise-ignored", "any challenger faster by a hair replaces the incumbent",
        "autonorm/tune/finals.py",
        "    margin = max(noise, 2 * incumbent.cv, 2 * challenger.cv)", "    margin = 0.0",
        (f"{SESSION}::test_a_second_run_defends_the_incumbent_unless_clearly_beaten",),
    ),
    # ------------------------------------------------------------------ the store
    Mutation(
        "winner-never-stored", "autonorm tune never stores its winner",
        "autonorm/tune/session.py",
        "    db.set_winner(key, result.best.to_dict(), metrics, kernel)\n", "",
        (f"{SESSION}::test_the_winner_is_stored_with_its_kernel_digest_and_every_trial_is_"
         "recorded",),
    ),
    Mutation(
        "incumbent-never-defended", "autonorm tune never defends the stored winner",
        "autonorm/tune/session.py", "        incumbent = incumbent_of(db, key, problem, limits)",
        "        incumbent = None",
        (f"{SESSION}::test_a_second_run_defends_the_incumbent_unless_clearly_beaten",),
    ),
    Mutation(
        "running-pick-never-defends",
        "with nothing stored, a shipped winner that dispatch runs does not defend",
        "autonorm/tune/session.py",
        "            running = None if incumbent is not None else running_pick(",
        "            running = None if True else running_pick(",
        (f"{SESSION}::test_with_nothing_stored_what_dispatch_runs_defends",),
    ),
    Mutation(
        "retired-winner-not-seeded",
        "a winner whose kernel changed is measured only if the search draws it",
        "autonorm/tune/session.py",
        "            retired = lookup.retired_configs(stores, key, problem, limits)",
        "            retired = []",
        (f"{SESSION}::test_a_winner_whose_kernel_changed_is_measured_right_after_what_runs",),
    ),
    Mutation(
        "stale-incumbent-defended", "a winner whose kernel changed is defended as the incumbent",
        "autonorm/tune/session.py", "    return config if status == lookup.USABLE else None",
        "    return config",
        (f"{SESSION}::test_a_winner_whose_kernel_changed_is_not_defended",),
    ),
    # ------------------------------------------------------------------ the lookup order
    Mutation(
        "shipped-before-user", "dispatch asks the shipped database before the user's",
        "autonorm/lookup.py", "        return choose(problem, rows, device, stores)",
        "        return choose(problem, rows, device, stores[::-1])",
        (f"{DISPATCH}::test_user_exact_beats_shipped_exact",
         f"{DISPATCH}::test_user_nearest_beats_shipped_nearest"),
    ),
    Mutation(
        "nearest-before-exact", "a nearest bucket is taken before the exact one",
        "autonorm/lookup.py", "        for nearest in (False, True):",
        "        for nearest in (True, False):",
        (f"{DISPATCH}::test_shipped_exact_beats_user_nearest",),
    ),
    Mutation(
        "stale-winner-used", "a stored winner whose kernel changed is run",
        "autonorm/lookup.py", "    same = kernel_of(config, problem, limits) == winner.kernel",
        "    same = True",
        (f"{DISPATCH}::test_a_winner_whose_kernel_changed_is_skipped",),
    ),
    # ------------------------------------------------------------------ input validation
    Mutation(
        "hidden-below-one", "validate accepts a hidden size below 1",
        "autonorm/api.py", "    if hidden < 1:", "    if False:",
        (f"{INPUTS}::test_a_hidden_size_below_one_is_refused",),
    ),
    Mutation(
        "scalar-input", "validate accepts a 0-d x",
        "autonorm/api.py", "    if len(x.shape) < 1:", "    if False:",
        (f"{INPUTS}::test_a_scalar_is_refused",),
    ),
    Mutation(
        "nan-eps", "validate accepts a NaN (or infinite) eps",
        "autonorm/api.py", "    if not (math.isfinite(value) and value > 0):",
        "    if value <= 0:",
        (f"{INPUTS}::test_eps_must_be_a_positive_number",),
    ),
    Mutation(
        "weight-of-another-dtype", "validate accepts a weight or bias of another dtype",
        "autonorm/api.py", "    if _dtype_name(t, name) != _dtype_name(x, \"x\"):", "    if False:",
        (f"{INPUTS}::test_weight_and_bias_must_have_x_dtype",),
    ),
    Mutation(
        "torch-param-unchecked", "the torch ops pass a weight that is no tensor on to the op",
        "autonorm/torch/checks.py",
        "    if value is not None and not isinstance(value, torch.Tensor):",
        "    if False:",
        ("tests/test_torch_param_types.py::test_a_parameter_that_is_no_tensor_is_named"
         "[layer_norm-weight-x-requires-grad-tuple]",),
    ),
    Mutation(
        "held-lanes-past-a-warp", "a held row's exchange by lanes takes more totals than lanes",
        "autonorm/ops/norm_backward/plan.py",
        "    if config.lanes and config.hold and config.cluster * TOTALS[problem.norm] > "
        "LANES_EXCHANGED:",
        "    if False:",
        ("tests/test_backward_family.py::"
         "test_a_held_exchange_by_lanes_gives_each_lane_one_total",),
    ),
    Mutation(
        "cluster-past-the-device", "a cluster of 16 blocks is planned for a device of 8",
        "autonorm/ops/norm_backward/plan.py",
        "    elif config.cluster > device.max_cluster_blocks:", "    elif False:",
        ("tests/test_backward_family.py::test_clusters_past_eight_blocks_are_hoppers",),
    ),
)
