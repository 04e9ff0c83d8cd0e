import numpy as np

from embed.blocks import BLOCK, blockwise, converted


def test_converted_matches_the_whole_array_conversion_across_blocks():
    values = np.random.default_rng(0).standard_normal((3, BLOCK + 5), dtype=np.float32)
    out = converted(values, lambda v: (v * 2).astype(np.float16), np.float16)
    assert out.shape == values.shape and out.dtype == np.float16
    assert np.array_equal(out, (values * 2).astype(np.float16))


def test_blockwise_covers_every_element_once():
    hits = np.zeros(2 * BLOCK + 3, np.int64)

    def work(lo: int, hi: int) -> None:
        hits[lo:hi] += 1

    blockwise(hits.size, work)
    blockwise(0, work)
    assert (hits == 1).all()
