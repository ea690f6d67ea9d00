"""tformer.nn.feedforward: a FeedForward built alone refuses a bad size, as its mirror does."""

import pytest

from tformer.nn.feedforward import FeedForward
from tformer.reference.feedforward import FeedForward as Mirror


@pytest.mark.parametrize("args, error, message", [
    ((16, -1), ValueError, r"^d_ff: expected a positive int, got -1$"),  # torch's "negative dimension"
    ((16, 0), ValueError, r"^d_ff: expected a positive int, got 0$"),  # was built, with 0-wide weights
    ((0, 16), ValueError, r"^d_model: expected a positive int, got 0$"),
    (("16", 16), TypeError, r"^d_model: expected a positive int, got '16'$"),
])
def test_a_bad_size_is_refused_naming_it(args, error, message):
    for cls in (FeedForward, Mirror):
        with pytest.raises(error, match=message):
            cls(*args)
