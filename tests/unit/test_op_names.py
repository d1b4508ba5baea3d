"""An emit_nvtx range name's op name: everything before the first of emit_nvtx's suffixes, whichever comes first."""

from __future__ import annotations

import pytest

from tracing.analysis.shapes import base_op_name


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("aten::mm, seq = 3, op_id = 9", "aten::mm"),
        ("aten::empty_strided, op_id = 990349", "aten::empty_strided"),
        ("aten::addmm, sizes = [[4], [4, 8], [8, 4]], input_op_ids = [1, 2]", "aten::addmm"),
        ("aten::mm, input_op_ids = [7], seq = 3", "aten::mm"),  # the earliest suffix, not the first listed
        ("aten::cat, dim = 0, seq = 5", "aten::cat, dim = 0"),  # a ", " that starts no suffix stays
        ("Optimizer.step#AdamW.step", "Optimizer.step#AdamW.step"),  # no ", " at all
        ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
        ("aten::mm,seq = 3", "aten::mm,seq = 3"),  # not emit_nvtx's spelling
        ("", ""),
    ],
)
def test_base_op_name_cuts_at_the_earliest_emit_nvtx_suffix(name, op):
    assert base_op_name(name) == op


def test_a_name_without_suffixes_is_returned_as_is():
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)"
    assert base_op_name(name) is name  # no copy per distinct name
