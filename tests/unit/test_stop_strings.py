from lmiserve.generation.stop_strings import StopStringMatcher


def feed_all(matcher, pieces):
    out = [matcher.feed(p) for p in pieces]
    if matcher.matched is None:
        out.append(matcher.flush())
    return out


def test_stop_is_cut_and_nothing_after_it_is_emitted():
    m = StopStringMatcher(["\nUser:"])
    out = feed_all(m, ["Hello", " there", "\n", "Us", "er:", " more"])
    assert "".join(out) == "Hello there"
    assert m.matched == "\nUser:"
    # the partial "\n", "Us" were held back, never emitted then retracted
    assert out[2] == "" and out[3] == ""


def test_held_back_prefix_is_released_when_it_cannot_match():
    m = StopStringMatcher(["END"])
    out = feed_all(m, ["the E", "N", "D", "IN"])
    assert "".join(out) == "the "
    m = StopStringMatcher(["END"])
    out = feed_all(m, ["the E", "N", "x"])
    assert out == ["the ", "", "ENx", ""]


def test_include_stop_and_earliest_match():
    m = StopStringMatcher(["b", "abc"], include_stop=True)
    assert m.feed("xxabcd") == "xxabc"  # "abc" starts first
    m = StopStringMatcher(["world", "lo"])
    assert m.feed("hello world") == "hel"


def test_flush_releases_pending_text_at_the_end():
    m = StopStringMatcher(["STOP"])
    assert m.feed("abc ST") == "abc "
    assert m.flush() == "ST"


def test_no_stops_passes_through():
    m = StopStringMatcher([])
    assert m.feed("abc") == "abc" and m.flush() == ""
