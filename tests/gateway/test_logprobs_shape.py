"""The OpenAI shapes of log-probabilities: a completion's alternatives include the token itself
(up to N + 1, as OpenAI's legacy completions and vLLM return them); chat's are the top N."""

from gateway.openai.logprobs import LogprobEntry, chat_logprobs, completion_logprobs

TOP = (("a", -0.1), ("b", -1.0))


def test_a_completion_lists_the_sampled_token_beside_the_top_n():
    outside, inside = LogprobEntry("x", -5.0, TOP), LogprobEntry("a", -0.1, TOP)
    shaped = completion_logprobs((outside, inside, LogprobEntry("p", None, None)))
    assert shaped["top_logprobs"] == [{"a": -0.1, "b": -1.0, "x": -5.0},
                                      {"a": -0.1, "b": -1.0}, None]
    assert shaped["tokens"] == ["x", "a", "p"] and shaped["text_offset"] == [0, 1, 2]


def test_chat_alternatives_are_the_top_n():
    shaped = chat_logprobs((LogprobEntry("x", -5.0, TOP),))
    (entry,) = shaped["content"]
    assert entry["logprob"] == -5.0
    assert [t["token"] for t in entry["top_logprobs"]] == ["a", "b"]
