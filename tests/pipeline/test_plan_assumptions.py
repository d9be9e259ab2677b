"""`hetjax plan` says what its prediction assumes, in the flags' words, so
that a step time for llama3-8b at its defaults reads as what it is."""

from hetjax import cli


def test_plan_prints_its_assumptions(capsys):
    # --remat none: the layout as asked, not the planner's own microbatches.
    flags = ["llama3-8b", "--islands", "cuda:0,cuda:1", "--tflops", "600,450", "--remat", "none"]
    assert cli.main(["plan", *flags]) == 0
    out = capsys.readouterr().out
    assert (
        "assuming --seq-len 64, --batch 8 in 4 microbatches, --dtype float32; per device (--tflops, --memory-gb): "
        in out
    )
    assert "island0 600 TFLOP/s" in out and "island1 450 TFLOP/s" in out
