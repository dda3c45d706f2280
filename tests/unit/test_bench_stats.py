import pytest

from lmiserve.bench.apis import APIS
from lmiserve.bench.prompts import make_prompts
from lmiserve.bench.stats import RequestRecord, level_report, percentile


def test_percentiles_interpolate():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == 4.6
    assert percentile([], 50) is None


def test_level_report_counts_tokens_over_the_measured_window():
    a = RequestRecord(start=0.0, end=2.0, first_token=0.5, token_times=[0.5, 1.0, 1.5], tokens=3)
    b = RequestRecord(start=1.0, end=4.0, first_token=1.2, token_times=[1.2, 2.2], tokens=2)
    bad = RequestRecord(start=0.0, end=0.1, error="HTTP 503")
    row = level_report(2, [a, b, bad])
    assert row["output_tokens"] == 5 and row["seconds"] == 4.0
    assert row["output_tokens_per_s"] == 1.25 and row["errors"] == 1
    assert row["error_samples"] == ["HTTP 503"]
    assert row["ttft_s"]["p50"] == pytest.approx(0.35)
    assert row["itl_s"]["p50"] == 0.5


def test_prompts_have_the_requested_length_and_are_seeded(tiny_tokenizer):
    a = make_prompts(tiny_tokenizer, 3, 40, seed=1)
    assert [len(p) for p in a] == [40, 40, 40] and len({tuple(p) for p in a}) == 3
    assert make_prompts(tiny_tokenizer, 3, 40, seed=1) == a


def test_stream_lines_are_counted_per_protocol():
    assert APIS["lmi"].tokens_in(b'{"token": {"id": 1, "text": "a", "log_prob": -1}}') == 1
    assert APIS["lmi"].tokens_in(b'data:{"token": {"id": 1}}') == 1
    assert APIS["tgi"].tokens_in(b'data:{"token": {"id": 1}, "generated_text": null}') == 1
    assert APIS["openai"].tokens_in(b'data: {"choices": [{"text": "a"}]}') == 1
    assert APIS["openai"].tokens_in(b"data: [DONE]") == 0


def test_salt_starts_every_prompt(tiny_tokenizer):
    salted = make_prompts(tiny_tokenizer, 2, 30, seed=1, salt="run 7:")
    head = tiny_tokenizer("run 7:", add_special_tokens=False)["input_ids"]
    assert all(p[: len(head)] == head and len(p) == 30 for p in salted)
    assert make_prompts(tiny_tokenizer, 2, 30, seed=1, salt="run 8:") != salted


def test_the_plot_of_a_run_whose_requests_all_failed_is_still_written(tmp_path):
    """Every request of the level failed (an engine that crashed): zero throughput and latencies,
    which a log scale cannot show; the plot is written on a linear scale instead of raising."""
    pytest.importorskip("matplotlib")
    from lmiserve.bench.report import plot

    zero = {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    row = {"concurrency": 1, "output_tokens_per_s": 0.0, "ttft_s": zero, "itl_s": zero}
    config = {"model": "m", "prompt_tokens": 190, "max_new_tokens": 128, "api": "openai"}
    plot({"server": [row], "config": config}, tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
