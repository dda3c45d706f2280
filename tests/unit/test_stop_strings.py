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


def test_same_answers_as_a_plain_search_on_random_text():
    import random

    rng = random.Random(5)
    for _ in range(300):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        m = StopStringMatcher(stops)
        out = "".join(m.feed(ch) for ch in text)
        if m.matched is None:
            out += m.flush()
        # fed one character at a time, the first stop string to be completed ends the text
        ends = [(text.find(s) + len(s), i) for i, s in enumerate(stops) if s in text]
        if ends:
            end, _ = min(ends)
            longest = max(len(s) for s in stops if text[:end].endswith(s))
            assert out == text[: end - longest], (stops, text)
        else:
            assert out == text


def test_a_thousand_stop_strings_share_one_automaton():
    from lmiserve.generation.stop_strings import StopAutomaton

    stops = [f"<stop{i:04d}>" for i in range(1024)]
    automaton = StopAutomaton(stops)
    assert len(automaton.children) <= sum(len(s) for s in stops) + 1
    matchers = [StopStringMatcher(automaton) for _ in range(128)]
    assert all(m.automaton is automaton for m in matchers)
    m = matchers[0]
    assert m.feed("text <stop07") == "text "
    assert m.feed("77> more") == "" and m.matched == "<stop0777>"
