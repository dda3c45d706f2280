"""Bench's speculative figures: the server's ``speculative`` object read, the run's own counts
taken from two reads, and the cost model's arithmetic."""

import httpx
import pytest

from lmiserve.bench import command
from lmiserve.bench.speculation import (
    iid_tokens_per_step,
    predicted_speedup,
    run_figures,
    speculative_stats,
    table,
)


def _spec(proposed, accepted, drafts, **more):
    return {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "proposed_tokens": proposed,
        "accepted_tokens": accepted,
        "drafts": drafts,
        "mean_accepted_length": 2.0,
        "acceptance_rate": 0.5,
        **more,
    }


def test_the_speculative_object_is_found_at_the_top_or_under_the_engine():
    top = speculative_stats({"modelName": "m", "engine": {"dtype": "bf16"}, "speculative": _spec(10, 5, 3)})
    assert top["method"] == "ngram" and (top["proposed_tokens"], top["accepted_tokens"], top["drafts"]) == (10, 5, 3)
    assert "draft_cost_ratio" not in top  # left out by the server: tolerated
    assert speculative_stats({"engine": {"speculative": _spec(1, 1, 1)}})["drafts"] == 1


@pytest.mark.parametrize(
    "description",
    [
        None,
        [],
        {"modelName": "m"},  # no speculation
        {"engine": None, "speculative": None},
        {"speculative": {"method": "ngram"}},  # no counters
        {"speculative": _spec("10", 5, 3)},  # a counter that is not a number
        {"speculative": _spec(True, 5, 3)},
    ],
)
def test_a_description_without_usable_counters_has_no_stats(description):
    assert speculative_stats(description) is None


def test_odd_optional_fields_are_dropped_not_fatal():
    stats = speculative_stats({"speculative": _spec(4, 2, 1, method=7, draft_cost_ratio="x")})
    assert "method" not in stats and "draft_cost_ratio" not in stats and stats["proposed_tokens"] == 4


def test_the_closed_form_for_independent_acceptance():
    assert iid_tokens_per_step(0.0, 4) == 1.0
    assert iid_tokens_per_step(1.0, 4) == 5.0
    assert iid_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert iid_tokens_per_step(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert iid_tokens_per_step(0.5, 2.5) == pytest.approx((1 - 0.5**3.5) / 0.5)  # a mean proposal length


def test_the_predicted_speedup_charges_each_proposed_token_its_cost():
    assert predicted_speedup(3.0, 4, 0.0) == 3.0  # n-gram: proposing is free
    assert predicted_speedup(3.0, 4, 0.25) == pytest.approx(1.5)
    assert predicted_speedup(1.0, 4, 0.1) < 1.0  # nothing accepted: a loss


def test_the_runs_figures_come_from_the_difference_of_the_counters():
    before = speculative_stats({"speculative": _spec(100, 60, 30, draft_cost_ratio=0.05)})
    after = speculative_stats({"speculative": _spec(500, 360, 130, draft_cost_ratio=0.05)})
    figures = run_figures(before, after)
    assert (figures["proposed_tokens"], figures["accepted_tokens"], figures["drafts"]) == (400, 300, 100)
    assert figures["method"] == "ngram" and figures["num_speculative_tokens"] == 4
    assert figures["acceptance_rate"] == 0.75
    assert figures["mean_accepted_length"] == 4.0  # 1 + 300 / 100
    assert figures["mean_proposal_length"] == 4.0  # 400 / 100
    assert figures["draft_cost_ratio"] == 0.05
    assert figures["predicted_speedup"] == pytest.approx(4.0 / 1.2, abs=1e-4)
    assert figures["iid_tokens_per_step"] == pytest.approx((1 - 0.75**5) / 0.25, abs=1e-4)


def test_no_cost_ratio_counts_as_free_proposals_and_a_restart_counts_from_zero():
    before = speculative_stats({"speculative": _spec(900, 800, 300)})
    after = speculative_stats({"speculative": _spec(40, 20, 10)})  # the counters went back: a new engine
    figures = run_figures(before, after)
    assert figures["proposed_tokens"] == 40 and figures["draft_cost_ratio"] == 0.0
    assert figures["predicted_speedup"] == figures["mean_accepted_length"] == 3.0


def test_no_figures_without_both_reads_and_no_ratios_without_proposals():
    spec = speculative_stats({"speculative": _spec(5, 5, 5)})
    assert run_figures(None, spec) is None and run_figures(spec, None) is None
    idle = run_figures(spec, spec)
    assert idle["drafts"] == 0 and "acceptance_rate" not in idle


def test_the_table_lists_the_levels_that_have_figures():
    before = speculative_stats({"speculative": _spec(0, 0, 0, draft_cost_ratio=0.0)})
    after = speculative_stats({"speculative": _spec(400, 300, 100, draft_cost_ratio=0.0)})
    rows = [
        {"concurrency": 1, "speculative": run_figures(before, after)},
        {"concurrency": 8, "speculative": run_figures(after, after)},
        {"concurrency": 32},
    ]
    lines = table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| 1 | ngram | 100 | 0.750 | 4.00 | 4.00 | 0 | 4.00x | 3.05 |"
    assert lines[3].startswith("| 8 | ngram | 0 | - |")
    assert table([{"concurrency": 1}]) == ""


def test_bench_reads_the_counters_from_the_model_description(monkeypatch):
    answers = {}
    monkeypatch.setattr(httpx, "get", lambda url, timeout: answers[url])
    answers["http://s/models/m"] = httpx.Response(200, json=[{"modelName": "m", "speculative": _spec(3, 2, 1)}])
    assert command.speculative_now("http://s/", "m")["accepted_tokens"] == 2
    answers["http://s/models/m"] = httpx.Response(200, json=[{"modelName": "m"}])
    assert command.speculative_now("http://s", "m") is None
    answers["http://s/models/m"] = httpx.Response(404, text="not found")  # another server
    assert command.speculative_now("http://s", "m") is None
    answers["http://s/models/m"] = httpx.Response(200, text="<html>")
    assert command.speculative_now("http://s", "m") is None

    def refused(url, timeout):
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(httpx, "get", refused)
    assert command.speculative_now("http://s", "m") is None
