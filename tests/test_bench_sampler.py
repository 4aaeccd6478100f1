"""bench.sampler's table: generated per trained and time per trained rollout, from run summaries."""

from bench.sampler import table


def test_table_ratios_are_computed_from_the_summaries():
    rows = [{"sampler": "none", "steps": 10, "generated": 1280, "trained": 1280, "train_seconds": 12.8},
            {"sampler": "dynamic", "steps": 10, "generated": 2560, "trained": 1280, "train_seconds": 25.6}]
    text = table(rows).splitlines()
    assert text[2] == "| none | 10 | 1280 | 1280 | 1.00 | 0.0100 | 0.0100 | 1.00 |"
    assert text[3] == "| dynamic | 10 | 2560 | 1280 | 2.00 | 0.0200 | 0.0100 | 2.00 |"
