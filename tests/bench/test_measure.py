"""The benchmark's arithmetic: percentiles, summaries over repeats, the ideal speedup."""

import pytest

from cascade.bench.measure import Trace, ideal_speedup, percentile, summarise


def test_ideal_speedup_matches_the_formula_and_its_limits():
    # (1 - a^(k+1)) / ((1 - a)(k c + 1)) with a = 0.5, k = 4, c = 1/8
    assert ideal_speedup(0.5, 4, 0.125) == pytest.approx((1 - 0.5 ** 5) / (0.5 * 1.5))
    assert ideal_speedup(1.0, 4, 0.125) == pytest.approx(5 / 1.5)  # every draft accepted
    assert ideal_speedup(0.0, 4, 0.125) == pytest.approx(1 / 1.5)  # drafting is pure cost
    assert ideal_speedup(0.8, 4, 0.0) > ideal_speedup(0.8, 2, 0.0)
    # a verification pass that costs 1.5 decoding passes (compute-bound hardware)
    assert ideal_speedup(0.5, 4, 0.125, 1.5) == pytest.approx((1 - 0.5 ** 5) / (0.5 * 2.0))


def test_percentile_interpolates():
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    assert percentile([1.0, 2.0], 0.99) == pytest.approx(1.99)
    assert percentile([7.0], 0.99) == 7.0


def _trace(domain, chunks, elapsed, rounds):
    trace = Trace(domain)
    for at, tokens in chunks:
        trace.chunk(at, tokens)
    for drafted, accepted in rounds:
        trace.round(drafted, accepted)
    trace.elapsed_s = elapsed
    return trace


def test_summary_counts_follow_the_vllm_definitions():
    # round 1: 4 drafted, 2 accepted (+1) -> 3 tokens; round 2: 4 drafted, all accepted (+1) -> 5
    fast = _trace("code", [(0.1, [1, 2, 3]), (0.3, [4, 5, 6, 7, 8])], 0.4, [(4, 2), (4, 4)])
    slow = _trace("code", [(0.2, [1, 2, 3]), (0.6, [4, 5, 6, 7, 8])], 0.8, [(4, 2), (4, 4)])
    summary = summarise([[fast], [slow], [fast]])
    assert summary.tokens_per_s == pytest.approx(8 / 0.4)  # median of the repeats
    assert summary.ttft_ms == pytest.approx(100)
    assert summary.itl_p50_ms == pytest.approx(200)
    assert summary.acceptance == pytest.approx(6 / 8)
    assert summary.alpha == pytest.approx(6 / 7)  # one rejection among 7 tested drafts
    assert summary.mean_acceptance_length == pytest.approx(1 + 6 / 2)
    assert summary.passes_per_token == pytest.approx(2 / 8)
    assert summary.tokens == 24


def test_target_only_summary_has_no_acceptance():
    trace = _trace("prose", [(0.01, [5]), (0.02, [6])], 0.02, [(0, 0), (0, 0)])
    summary = summarise([[trace]])
    assert summary.acceptance is None and summary.alpha is None
    assert summary.mean_acceptance_length == 1.0 and summary.passes_per_token == 1.0


def test_per_round_costs_leave_out_the_prefill_round():
    trace = Trace("chat")
    trace.round(4, 1, draft_s=0.050, verify_s=0.500)  # prefills both models
    trace.round(4, 4, draft_s=0.008, verify_s=0.100)
    trace.round(4, 0, draft_s=0.012, verify_s=0.120)
    trace.chunk(0.5, [1, 2])
    trace.elapsed_s = 1.0
    summary = summarise([[trace]])
    assert summary.draft_ms_per_token == pytest.approx(20 / 8)
    assert summary.verify_ms_per_pass == pytest.approx(110)


def test_a_section_is_written_into_a_new_file_and_replaced_in_an_old_one(tmp_path):
    from cascade.bench.output import write_section

    new = tmp_path / "docs" / "NEW.md"
    write_section(new, "<!-- faults -->", "table 1\n")
    assert new.read_text() == "<!-- faults -->\ntable 1\n<!-- /faults -->\n"
    new.write_text("# Reliability\n\nprose\n" + new.read_text() + "\nmore prose\n")
    write_section(new, "<!-- faults -->", "table 2\n")
    write_section(new, "<!-- chaos -->", "table 3\n")  # a second section leaves the first
    assert new.read_text() == ("# Reliability\n\nprose\n<!-- faults -->\ntable 2\n"
                               "<!-- /faults -->\nmore prose\n<!-- chaos -->\ntable 3\n"
                               "<!-- /chaos -->\n")
    old = tmp_path / "OLD.md"  # a section without its closing marker runs to the end
    old.write_text("intro\n<!-- faults -->\nold table\n")
    write_section(old, "<!-- faults -->", "new table\n")
    assert old.read_text() == "intro\n<!-- faults -->\nnew table\n<!-- /faults -->\n"
