"""The tests `make test` leaves to `make test-slow`: each costs tens of seconds of CPU on 2 cores, and
what it checks end to end has a faster check in `make test` beside it. CI (`.ci/run`) runs both tiers.

An entry is a test file, a test in it (every parametrisation), or one parametrisation (`name[id]`);
tests/conftest.py marks what it names `slow`, and tests/test_lint.py checks that every entry names a test
that exists.
"""

from __future__ import annotations

SLOW = {
    # Installs: a wheel built, installed into fresh virtual environments, run from empty folders.
    "test_package.py": "builds the wheel and installs it into throwaway environments",
    # Whole pytest sessions of the plugin in subprocesses, each importing torch
    # (make test keeps the plugin's rerun by node id, its usage error and test_messages.py's session)
    **{
        f"test_pytest_cases.py::{name}": "a pytest session of the plugin in a subprocess"
        for name in (
            "test_the_plugin_times_out_a_hang_deselects_with_k_and_writes_the_reports",
            "test_a_stopped_run_exits_non_zero_and_every_report_says_stopped",
            "test_a_run_that_judges_nothing_fails_the_session_with_the_clis_message",
            "test_a_conftest_override_without_the_option_fails_the_session_and_with_it_is_judged",
            "test_the_plugin_imports_nothing_heavy_unasked_and_local_xdist_workers_share_the_controllers_children",
            "test_workers_elsewhere_get_the_options_whatever_paths_exist_here",
        )
    },
    "test_cuda_fork.py::test_the_plugins_children_use_cuda_after_a_conftest_initialised_the_driver": (
        "a pytest session per worker count; the CLI's children are checked in make test"
    ),
    # Sweeps of a correct form over every golden (make test runs each on fresh cases: test_fuzz.py's smoke).
    "test_gpu_arithmetic.py::test_a_gpu_gate_passes_every_case_its_models_reach": (
        "every GPU gate over every case its models reach"
    ),
    "test_gpu_arithmetic.py::test_an_fp32_accumulator_is_judged_as_one": "linear.fp8 and attention, all cases",
    "test_fuzz.py::test_correct_implementations_that_round_differently_pass_fresh_cases": (
        "the upstream and float64 gates on fresh cases of every space"
    ),
    "test_spaces.py::test_draws_build_and_the_reference_passes_them[attention]": "attention draws built and run",
    "test_goldens.py::test_goldens_do_not_depend_on_the_cpu_instruction_set": (
        "regenerates the goldens under another ATen CPU capability"
    ),
    "test_fp8.py::test_attention_with_fp8_weights_fails_where_act_quant_is_skipped": "every fp8 attention case",
    # A second instance of a check make test keeps one of (the other parametrisation, the other bug).
    "test_fp8.py::test_classic_fp8_gemm_bugs_fail_on_the_output_they_break[PerRowScales-broken0]": (
        "a second fp8 GEMM bug over the production linear.fp8 cases (make test keeps Unquantised)"
    ),
    "test_fp8.py::test_classic_fp8_gemm_bugs_fail_on_the_output_they_break[Block128-broken1]": (
        "a third fp8 GEMM bug over the production linear.fp8 cases"
    ),
    "test_fp8.py::test_a_fused_wo_b_with_a_wrong_quantisation_still_fails_at_out[FusedZTowardZero]": (
        "a second fused wo_b bug over the fp8 attention cases (make test keeps FusedZFloatScales)"
    ),
    **{
        f"test_components_attention.py::{name}[attention/a-fp8-p21-d1x11-fixed]": (
            "the fp8 checkpoint's instance (make test keeps the bf16 one)"
        )
        for name in (
            "test_compressed_ids_offset_by_the_chunk_length_fail_at_the_ids_from_the_first_decode_step",
            "test_reindex_layer_reading_its_own_empty_keys_fails_its_scores_at_prefill",
            "test_skipped_inverse_rope_fails_every_layer_at_o",
        )
    },
    **{
        f"test_chain.py::test_correct_implementations_pass_every_attention_case_they_run[{core}]": (
            "an attention core over every attention case (make test keeps PlainSoftmax; test_fuzz.py's smoke "
            "runs every core on a fresh case)"
        )
        for core in ("TiledFp32P", "OnePassBf16P", "Tiles128", "Fp8K128", "BlasBf16")
    },
    "test_chain.py::test_a_core_without_its_intermediates_fails_fp8_out_and_names_z[TiledFp32P]": (
        "the second core (make test keeps PlainSoftmax)"
    ),
    **{
        f"test_chain.py::test_no_bug_is_absorbed_without_its_intermediates[{mutant}]": (
            "a bug judged without intermediates (make test keeps three; test_each_bug_fails_at_the_stage_that_holds_"
            "it runs every one)"
        )
        for mutant in ("RopeOnFirstDims", "Bf16KvScale", "OutputScaled", "WoBRowScales", "WindowNewestFirst")
    },
    **{
        f"test_gates.py::test_gate_passes_every_case_it_supports[{gate}]": (
            "a gate over every case (make test keeps upstream; test_fuzz.py's smoke runs each on fresh cases)"
        )
        for gate in ("float64", "plain-softmax")
    },
    "test_fuzz.py::test_a_shape_bug_is_found_shrunk_promoted_and_then_fails_run[WindowPositions16Bit]": (
        "a second shape bug found, shrunk and promoted (make test keeps DropsLanesPastFourTiles)"
    ),
    "test_cuda_fork.py::test_cli_children_use_cuda_after_the_runs_own_process_initialised_the_driver[2]": (
        "two isolation children (make test keeps the run without)"
    ),
    "test_fuzz.py::test_a_shape_bug_is_found_shrunk_promoted_and_then_fails_run[CompressorBatchOf3]": (
        "a third shape bug found, shrunk and promoted"
    ),
    "test_diagnosis_trust.py::test_two_bugs_in_two_stages_are_both_named_with_what_each_explains": (
        "an attention diagnosis of two bugs"
    ),
    # Diagnoses of whole attention cases: every variant re-runs the whole reference.
    "test_diagnosis.py::test_independently_written_wrong_kernels_get_their_diagnosis": (
        "attention diagnoses of independently written kernels"
    ),
    "test_diagnosis.py::test_a_port_with_the_bug_gets_that_diagnosis[stale-index-keys-other-policy]": (
        "an attention diagnosis"
    ),
    "test_diagnosis.py::test_the_first_divergent_stage_is_screened_first_and_the_names_stay": (
        "an attention diagnosis with every variant re-run whole"
    ),
    "test_diagnosis_confirm.py::test_a_confirmation_judges_what_the_variant_changes_as_a_re_run_does": (
        "a confirmation beside a whole re-run of an attention case; make test confirms the norm bug's names"
    ),
    "test_diagnosis_confirm.py::test_a_norm_bug_is_named_by_a_confirmation_as_by_a_re_run"
    "[attention/a-fp8-p21-d1x11-upstream]": (
        "two diagnoses of an fp8 attention case, confirmed and re-run; the bf16 case runs in make test"
    ),
    "test_diagnosis.py::test_an_fp8_norm_bug_at_the_latent_is_named_for_three_re_runs": (
        "an attention diagnosis (make test keeps its stage screen)"
    ),
    "test_diagnosis_trust.py::test_two_bugs_in_two_stages_of_attention": "attention diagnoses of two bugs",
    "test_diagnosis_trust.py::test_the_diagnoses_are_the_same_under_load": "diagnoses repeated beside busy loops",
    "test_diagnosis_trust.py::test_a_policy_at_one_step_and_a_tie_at_another": "an attention diagnosis",
}


def slow_reason(nodeid: str) -> str | None:
    """Why the test `nodeid` (tests/FILE::NAME[ID]) is in `make test-slow`, or None: it runs in `make test`."""
    path, _, name = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    for entry in (file, f"{file}::{name}", f"{file}::{name.split('[', 1)[0]}"):
        if entry in SLOW:
            return SLOW[entry]
    return None
