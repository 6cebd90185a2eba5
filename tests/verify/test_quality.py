"""The quality pair's comparison, on literal streams shaped as vLLM's completions answer them."""

from __future__ import annotations

from qpnserve.verify.quality import compare, parse_stream


def _answer(tokens: list[int], tops: list[dict[str, float]]) -> dict:
    return {
        "choices": [
            {
                "text": "",
                "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "top_logprobs": tops},
            }
        ]
    }


def test_identical_streams_are_counted() -> None:
    a = parse_stream(_answer([5, 6, 7], [{"token_id:5": -0.1}] * 3))
    pair = compare([a, a], [a, a])
    assert pair.identical == 2 and pair.divergences == [] and pair.with_logprobs


def test_divergence_names_the_first_index_and_both_top2() -> None:
    tops = [
        {"token_id:5": -0.1, "token_id:9": -3.0},
        {"token_id:6": -0.69314, "token_id:8": -0.69315, "token_id:1": -5.0},  # a near tie
        {"token_id:7": -0.2},
    ]
    off = parse_stream(_answer([5, 6, 7], tops))
    on_tops = [tops[0], {"token_id:8": -0.69313, "token_id:6": -0.69316}, {"token_id:2": -0.3}]
    on = parse_stream(_answer([5, 8, 2], on_tops))
    pair = compare([off], [on])
    assert pair.identical == 0
    (d,) = pair.divergences
    assert d.prompt == 0 and d.index == 1
    assert d.route_off_top2 == [("token_id:6", -0.69314), ("token_id:8", -0.69315)]
    assert d.route_on_top2 == [("token_id:8", -0.69313), ("token_id:6", -0.69316)]
    assert "first differs at token 1" in pair.line()


def test_a_server_without_logprobs_is_compared_as_text_and_says_so() -> None:
    a = parse_stream({"choices": [{"text": " t0 t1", "logprobs": None}]})
    b = parse_stream({"choices": [{"text": " t0 t2", "logprobs": None}]})
    pair = compare([a, a], [a, b])
    assert pair.identical == 1 and not pair.with_logprobs
    assert pair.divergences[0].index == 0 and pair.divergences[0].route_on_top2 is None
    assert "compared as text" in pair.line()
