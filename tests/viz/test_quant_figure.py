"""Notebook 08's memory-vs-error figure: one point per storage type at the report's bytes and error."""

import pandas as pd
import pytest

from rectoolkit.viz import memory_error_figure


def test_each_storage_type_is_a_point_at_its_bytes_and_error():
    # a hand-made report for 1000 rows of dim 64: 256 / 128 / 80 bytes per row (fp32 / fp16 / int8)
    report = pd.DataFrame({"data_type": ["FP32", "FP16", "INT8"], "bytes": [256_000, 128_000, 80_000],
                           "relative_error": [0.0, 2e-4, 4e-3]})
    fig = memory_error_figure(report)
    (points,) = fig.data
    assert list(points.x) == [256_000, 128_000, 80_000]
    assert list(points.text) == ["FP32 (exact)", "FP16", "INT8"]
    # the exact type cannot sit on a log axis at 0: it is drawn a decade under the smallest error, and marked
    assert list(points.y) == pytest.approx([2e-5, 2e-4, 4e-3])
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.xaxis.range[0] == 0 and fig.layout.xaxis.range[1] >= 256_000


def test_a_frame_without_the_report_columns_is_refused_by_name():
    with pytest.raises(KeyError, match=r"no column\(s\) \['relative_error'\]"):
        memory_error_figure(pd.DataFrame({"data_type": ["INT8"], "bytes": [80]}))
