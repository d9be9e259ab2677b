"""The planner's figures are remembered within one search only
(hetjax/pipeline/plan/search_memo.py)."""

from hetjax.pipeline.plan import search_memo


def test_a_remembered_function_computes_each_argument_once_per_search():
    calls = []
    rate = {"gbps": 10.0}

    @search_memo.remembered
    def seconds(nbytes, *, scale=1.0):
        calls.append((nbytes, scale))
        return nbytes / rate["gbps"] * scale

    with search_memo.search():
        assert seconds(20.0) == seconds(20.0) == 2.0
        assert seconds(20.0, scale=2.0) == 4.0
        with search_memo.search():  # a nested search shares the outer one's figures
            assert seconds(20.0) == 2.0
        assert seconds(20.0) == 2.0
    assert calls == [(20.0, 1.0), (20.0, 2.0)]
    # A figure changed between searches is never served stale.
    rate["gbps"] = 5.0
    assert seconds(20.0) == 4.0
    with search_memo.search():
        assert seconds(20.0) == 4.0
    assert len(calls) == 4
